"""Functions that engines run on workers: plain module-level functions of plain data."""

from __future__ import annotations

import time

import numpy as np

from bigrate.runner.spec import ESTIMATORS, _estimator_class


def make_estimator(name: str, params: dict):
    return _estimator_class(name)(**params)


def score(estimator_name: str, params: dict, y: np.ndarray, f: np.ndarray) -> dict:
    """The selection metrics of a fitted model's scores ``f`` on labels ``y`` (+1/-1)."""
    from bigrate.metrics import Confusion, positives_at_q

    c = Confusion.of(y, f)
    out = {"pfa": c.pfa, "pnd": c.pnd, "n_pos": c.n_pos, "n_neg": c.n_neg}
    target = ESTIMATORS[estimator_name][2]
    value = params.get(target, make_estimator(estimator_name, {}).get_params()[target])
    if target == "rho":
        out["J_val"] = c.j_val(value)
    else:
        out["accepted"] = positives_at_q(y, f, value)
    return out


def fit_fold(estimator_name: str, params: dict, data, train_idx, test_idx) -> dict:
    """Fit on rows ``train_idx`` of the in-memory (X, y), score rows ``test_idx``."""
    X, y = data
    t = time.perf_counter()
    est = make_estimator(estimator_name, params).fit(X[train_idx], y[train_idx])
    f = est.decision_function(X[test_idx])
    return {
        "metrics": score(estimator_name, params, y[test_idx], f),
        "seconds": time.perf_counter() - t,
    }


def fit_val(estimator_name: str, params: dict, dataset_path: str) -> dict:
    """Fit on the train split (streamed from the path on the worker), score the val split."""
    from bigrate.data.reader import ShardedDataset

    ds = ShardedDataset(dataset_path)
    t = time.perf_counter()
    est = make_estimator(estimator_name, params).fit(ds)
    ys, fs = [], []
    for b in ds.iter_batches("val"):
        ys.append(b.y)
        fs.append(est.decision_function(b.X))
    return {
        "metrics": score(
            estimator_name, params, np.concatenate(ys), np.concatenate(fs)
        ),
        "seconds": time.perf_counter() - t,
    }


def fit_full(estimator_name: str, params: dict, dataset_path: str):
    """Fit on the whole train split (streamed); returns the fitted estimator."""
    from bigrate.data.reader import ShardedDataset

    return make_estimator(estimator_name, params).fit(ShardedDataset(dataset_path))
