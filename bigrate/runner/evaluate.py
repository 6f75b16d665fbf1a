"""A model's rate metrics on the splits of a shard dataset: on the job's engine, a few
tasks per worker, each scoring a share of the shard files (each worker reads its files
where it runs; only labels and scores come back), or in this process. Both give the same numbers: the scores are gathered in
the order :meth:`~bigrate.data.reader.ShardedDataset.iter_batches` reads the files."""

from __future__ import annotations

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.metrics import evaluate_split, rate_metrics

#: rows a scoring task reads at a time
BATCH_ROWS = 65_536


#: scoring tasks a worker gets (files dealt round-robin): more than one evens out
#: files of unequal size, and a task lost with its worker costs less to run again
TASKS_PER_WORKER = 4


def score_file(score, dataset, split: str, j: int) -> tuple:
    """``(labels, scores)`` of the ``j``-th file of ``split`` (``dataset``: a
    ShardedDataset, or what opens one)."""
    ds = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
    ys, fs = [], []
    for b in ds.iter_file(ds.files(split)[j], BATCH_ROWS):
        ys.append(np.asarray(b.y))
        fs.append(np.asarray(score(b.X), dtype=np.float64).ravel())
    y = np.concatenate(ys) if ys else np.empty(0, np.int8)
    return y, (np.concatenate(fs) if fs else np.empty(0))


def score_files(score, dataset_path, items) -> list[tuple]:
    """A task: :func:`score_file` of every ``(split, j)`` of ``items``, the dataset
    opened and the model received once for them all (one task a file sent the model
    with each: 372 tasks of 380 KB for an RCV1-shaped job's 124 files a split)."""
    ds = ShardedDataset(dataset_path)
    return [score_file(score, ds, split, j) for split, j in items]


def evaluate(score, ds: ShardedDataset, splits, target: dict, engine=None) -> dict:
    """:func:`bigrate.metrics.rate_metrics` of ``score`` (a block of rows -> scores) on
    each split of ``ds`` that exists, against ``target`` (``{"rho": ...}`` or
    ``{"q": ...}``). With a cluster engine the files are scored by its workers, through
    its pinned pool: a worker lost meanwhile has its files scored again elsewhere."""
    splits = [s for s in splits if s in ds.splits]
    if engine is None or engine.name == "local":
        return {s: evaluate_split(score, ds, s, **target) for s in splits}
    tasks = [(s, j) for s in splits for j in range(len(ds.files(s)))]
    n = max(1, min(len(tasks), TASKS_PER_WORKER * engine.wait_for_workers(1)))
    with engine.pinned() as pool:
        parts = pool.run(
            score_files,
            [(score, ds.ref, tasks[k::n]) for k in range(n)],
            what="the final evaluation",
        )
    got: list = [None] * len(tasks)
    for k, part in enumerate(parts):
        got[k::n] = part
    out = {}
    for s in splits:
        parts = [r for (split, _), r in zip(tasks, got, strict=True) if split == s]
        y = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int8)
        f = np.concatenate([p[1] for p in parts]) if parts else np.empty(0)
        out[s] = rate_metrics(y, f, **target)
    return out


def constraint_table(est, ds: ShardedDataset, splits, texts) -> list[dict]:
    """Each constraint of a job (as written) on each split of ``ds`` that exists: its
    two sides' values (the rates the model's signs give on the split's rows; a
    ready-made constraint such as ``demographic_parity``: its ``expr`` against 0) and
    whether it holds: ``[{"constraint", "op", split: {"value", "target", "met"}}]``."""
    from bigrate.constrained.parse import parse_constraint
    from bigrate.runner.spec import load_baseline

    splits = [s for s in splits if s in ds.splits]

    def side(x, split) -> float:
        if isinstance(x, (int, float)):
            return float(x)
        return float(est.evaluate(x, ds, split=split))

    out = []
    for text in texts:
        p = parse_constraint(text, load_baseline)
        row = {"constraint": text, "op": p.op or "<="}
        for s in splits:
            value, target = side(p.lhs, s), side(p.rhs, s)
            ok = (
                value <= target + 1e-12
                if row["op"] == "<="
                else value >= target - 1e-12
            )
            row[s] = {"value": value, "target": target, "met": bool(ok)}
        out.append(row)
    return out
