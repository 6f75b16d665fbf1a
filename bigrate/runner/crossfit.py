"""Cross-fit jobs (``kind = "crossfit"``): every row of the chosen splits scored by a
model that never saw it, as proteomics rescoring (Percolator, mokapot) does.

The rows of ``[crossfit] splits`` (default: every split) are pooled and dealt into
``folds`` stratified folds (grouped folds where the dataset has a group column, e.g. the
spectrum of a PSM, so that the PSMs of one spectrum are scored by one model). Fold k's
model is fitted on the other folds, as one engine task, and scores fold k's rows.

Models of different folds score on different scales; ranked together (a q-value over
the whole file) their scores must first be made comparable. ``scale = "negatives"``
(default) divides each fold model's scores by the standard deviation of its scores on
the negatives (decoys) *of its own training rows*: a property of the model alone (no
label of a scored row is used) that keeps each model's threshold at 0, so the pooled
Pfa, Pnd and FDR at f >= 0 are those of the fold models' own decisions.

A finished fold is saved before the next is recorded (its model in ``models/fold-K``,
its scores in ``crossfit/fold-K.npz``, then its record in ``results/``), so a resumed
run fits only the folds that are missing. The pooled scores go to ``scores.parquet``
(the columns of `bigrate predict`, plus ``fold``), the metrics to ``metrics.json``.
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.files import atomic_write_bytes
from bigrate.metrics import best_per_group, positives_at_q, rate_metrics

#: how the folds' scores are put on one scale
SCALES = ("negatives", "none")


def pooled_rows(ds: ShardedDataset, splits) -> dict:
    """The rows of ``splits`` of ``ds`` in memory, one after the other in row-id order
    within each split: ``X`` (CSR), ``y`` (+1 / -1), ``row_id``, ``split`` (index into
    ``splits``) and ``group`` (None without a group column)."""
    import scipy.sparse as sp

    blocks = [ds.to_csr(s, with_group=ds.has_group) for s in splits]
    group = None
    if ds.has_group:
        # one group value in two splits is one group (the same spectrum): the
        # group is the value alone, not (split, value)
        group = np.concatenate([np.asarray(b.group).astype(str) for b in blocks])
    return {
        "X": sp.vstack([b.X for b in blocks], format="csr"),
        "y": np.concatenate([np.where(np.asarray(b.y) > 0, 1, -1) for b in blocks]),
        "row_id": np.concatenate([np.asarray(b.row_id) for b in blocks]),
        "split": np.concatenate(
            [np.full(len(b), i, np.int16) for i, b in enumerate(blocks)]
        ),
        "group": group,
    }


def crossfit_folds(y, groups, n_folds: int, seed: int) -> list[tuple]:
    """``n_folds`` (train, test) index pairs: stratified and shuffled by ``seed``;
    with ``groups``, every group's rows in one fold (scikit-learn's
    StratifiedGroupKFold). Each part must hold both classes."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    y = np.asarray(y)
    n_min = int(min(np.sum(y > 0), np.sum(y < 0)))
    if n_min < n_folds:
        raise ValueError(
            f"crossfit.folds: {n_folds} folds need at least {n_folds} rows of each "
            f"class; the pooled rows have {n_min} of the smaller one"
        )
    if groups is None:
        cv = StratifiedKFold(n_folds, shuffle=True, random_state=seed)
        out = list(cv.split(np.zeros(len(y)), y))
    else:
        cv = StratifiedGroupKFold(n_folds, shuffle=True, random_state=seed)
        out = list(cv.split(np.zeros(len(y)), y, groups))
    for k, (tr, te) in enumerate(out):
        for name, idx in (("training", tr), ("scored", te)):
            if len(np.unique(y[idx])) < 2:
                raise ValueError(
                    f"crossfit fold {k}: its {name} rows hold one class only; use "
                    "fewer folds"
                )
    return out


def fit_fold_scores(est, data, train_idx, test_idx, scale: str) -> dict:
    """One task: a clone of ``est`` fitted on rows ``train_idx`` of ``data = (X, y)``,
    then its scores of rows ``test_idx``, divided by the fold's scale (see the module
    docstring). Returns the fitted model, the scaled scores and the record."""
    from sklearn.base import clone

    X, y = data
    t = time.perf_counter()
    model = clone(est).fit(X[train_idx], y[train_idx])
    fit_s = time.perf_counter() - t
    factor = 1.0
    if scale == "negatives":
        neg = train_idx[y[train_idx] < 0]
        sd = float(np.std(np.asarray(model.decision_function(X[neg])).ravel()))
        factor = sd if np.isfinite(sd) and sd > 0 else 1.0
    f = np.asarray(model.decision_function(X[test_idx]), np.float64).ravel() / factor
    return {
        "model": model,
        "scores": f,
        "scale": factor,
        "fit_seconds": fit_s,
        "seconds": time.perf_counter() - t,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }


def accepted_competed(y, f, groups, q: float) -> dict:
    """Targets accepted at ``q`` as mokapot and Percolator count them: with groups
    (spectra), the best-scoring row of each group only (target-decoy competition);
    q-values by (decoys + 1) / targets."""
    y, f = np.asarray(y), np.asarray(f)
    if groups is not None:
        codes = np.unique(np.asarray(groups), return_inverse=True)[1]
        keep = best_per_group(f, codes)
        y, f = y[keep], f[keep]
    return {
        "q": q,
        "accepted": positives_at_q(y, f, q, plus_one=True),
        "rows": int(len(y)),
        "competed": groups is not None,
    }


def fold_file(run_path, k: int):
    return run_path / "crossfit" / f"fold-{k}.npz"


def save_fold(run_path, k: int, test_idx, scores) -> None:
    """Fold k's scored rows and scores (atomically: temp file, then rename)."""
    import io

    buf = io.BytesIO()
    fold_file(run_path, k).parent.mkdir(parents=True, exist_ok=True)
    np.savez(buf, test_idx=np.asarray(test_idx, np.int64), scores=scores)
    atomic_write_bytes(fold_file(run_path, k), buf.getvalue())


def load_fold(run_path, k: int, n_rows: int):
    """Fold k's (test rows, scores), checked against the pooled rows' count; None if
    it is missing or does not fit (then the fold is fitted again)."""
    p = fold_file(run_path, k)
    if not p.exists():
        return None
    try:
        with np.load(p, allow_pickle=False) as z:
            te, f = z["test_idx"], z["scores"]
    except (OSError, ValueError, KeyError):
        return None
    if te.ndim != 1 or te.shape != f.shape or (len(te) and not (
        0 <= te.min() and te.max() < n_rows
    )):  # fmt: skip
        return None
    return te, f


def write_scores(path, rows: dict, splits, f, fold) -> None:
    """``scores.parquet``: row_id, split, label, score, prediction (f >= 0), fold and
    the group where the dataset has one (temp file, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {
        "row_id": pa.array(rows["row_id"], pa.int64()),
        "split": pa.array(np.asarray(splits, dtype=object)[rows["split"]], pa.string()),
        "label": pa.array(rows["y"], pa.int8()),
        "score": pa.array(f, pa.float64()),
        "prediction": pa.array(np.where(f >= 0, 1, -1), pa.int8()),
        "fold": pa.array(fold, pa.int16()),
    }
    if rows["group"] is not None:
        cols["group"] = pa.array(rows["group"], pa.string())
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        pq.write_table(pa.table(cols), tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def pooled_metrics(rows: dict, splits, f, fold, target: dict, n_folds: int) -> dict:
    """The evaluation of the pooled scores: each split's rows and all of them
    (``"all"``), each fold's scored rows, and for a q-value target the accepted count
    after target-decoy competition."""
    y = rows["y"]
    ev = {
        s: rate_metrics(y[rows["split"] == i], f[rows["split"] == i], **target)
        for i, s in enumerate(splits)
    }
    ev["all"] = rate_metrics(y, f, **target)
    per_fold = [
        rate_metrics(y[fold == k], f[fold == k], **target) for k in range(n_folds)
    ]
    out = {"evaluation": ev, "per_fold": per_fold}
    if "q" in target:
        out["accepted_competed"] = accepted_competed(y, f, rows["group"], target["q"])
    return out
