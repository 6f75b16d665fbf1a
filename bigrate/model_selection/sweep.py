"""The one sweep loop of bigrate, shared by :class:`~bigrate.NPSearchCV` and the job
runner's sweeps: every (grid point, fold) fit is an engine task, each finished task is
recorded in a results store (a :class:`~bigrate.rundir.RunDir`, so an interrupted sweep
resumes without redoing finished tasks, or a :class:`~bigrate.rundir.MemoryStore`), a
task that raises is recorded with its traceback and the sweep goes on, and the points are
summarised over folds and the best one selected.

Tasks are plain functions of plain data (the estimator's class and parameters, data by
engine handle or by dataset path), scored by the one evaluation routine
:func:`bigrate.metrics.rate_metrics`.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable, Sequence

import numpy as np

from bigrate.metrics import SELECT, evaluate_split, rate_metrics
from bigrate.progress import Progress

__all__ = [
    "SELECT",
    "SharedFolds",
    "cv_splits",
    "fit_fold",
    "fit_fold_path",
    "fit_split",
    "c_chains",
    "fit_val",
    "rank_points",
    "run_sweep",
    "select_best",
    "summarise",
    "warm_task",
    "write_summary",
]


def cv_splits(
    cv, y, random_state=0, *, fraction: bool = True, min_folds: int = 1
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs of ``cv``: an int K >= 2 gives K stratified, shuffled
    folds; a float in (0, 1) (where ``fraction``) one stratified hold-out of that share;
    anything else is taken as an iterable of (train, test) index arrays. Every train
    and test part must hold both classes; at least ``min_folds`` pairs."""
    from sklearn.model_selection import StratifiedKFold, train_test_split

    y = np.asarray(y)
    if isinstance(cv, (int, np.integer)) and not isinstance(cv, bool):
        if cv < 2:
            raise ValueError(f"cv must be >= 2 folds, got {cv}")
        out = list(
            StratifiedKFold(int(cv), shuffle=True, random_state=random_state).split(
                np.zeros(len(y)), y
            )
        )
    elif fraction and isinstance(cv, float):
        if not 0 < cv < 1:
            raise ValueError(f"cv as a validation fraction must be in (0, 1), got {cv}")
        tr, te = train_test_split(np.arange(len(y)), test_size=cv, stratify=y,
                                  random_state=random_state)  # fmt: skip
        out = [(tr, te)]
    else:
        try:
            out = [(np.asarray(a), np.asarray(b)) for a, b in cv]
        except TypeError:
            raise ValueError(
                "cv must be a fold count >= 2"
                + (", a validation fraction in (0, 1)" if fraction else "")
                + f" or an iterable of (train, test) index arrays, got {cv!r}"
            ) from None
    if len(out) < min_folds:
        raise ValueError(
            f"cv gives {len(out)} fold(s); at least {min_folds} are needed"
        )
    for k, (tr, te) in enumerate(out):
        for name, idx in (("train", tr), ("test", te)):
            if len(np.unique(y[idx])) < 2:
                raise ValueError(
                    f"cv fold {k}: its {name} rows hold only class "
                    f"{np.unique(y[idx]).tolist()}; each fold needs both classes"
                )
    return out


class SharedFolds:
    """The in-memory data of a k-fold sweep and each fold's (train, test) rows, sent to
    the engine's workers once, on first use, instead of with every task: ``folds(k)``
    is ``(data, train_rows, test_rows)`` as engine handles (``load()`` gives ``(X, y,
    splits)``; it runs once)."""

    def __init__(self, engine, load: Callable[[], tuple]):
        self.engine, self.load = engine, load
        self.handles = None

    def __call__(self, k: int) -> tuple:
        if self.handles is None:
            X, y, splits = self.load()
            put = self.engine.put
            self.handles = (put((X, y)), [(put(a), put(b)) for a, b in splits])
        data, folds = self.handles
        return (data, *folds[k])


def _record(metrics: dict, t0: float, **extra) -> dict:
    """A task's result: its metrics, seconds since ``t0``, and where it ran (the
    worker's process id and host, so that a record names the process that fitted it)."""
    return {
        "metrics": metrics,
        "seconds": time.perf_counter() - t0,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        **extra,
    }


def fit_fold(est_cls, params: dict, data, train_idx, test_idx, target: dict) -> dict:
    """One task: fit ``est_cls(**params)`` on rows ``train_idx`` of the in-memory
    ``data = (X, y)``, score rows ``test_idx`` (``target``: ``{"rho": ...}`` or
    ``{"q": ...}``, see :func:`~bigrate.metrics.rate_metrics`)."""
    X, y = data
    t = time.perf_counter()
    est = est_cls(**params).fit(X[train_idx], y[train_idx])
    yt = np.where(y[test_idx] == est.classes_[1], 1, -1)
    return _record(rate_metrics(yt, est.decision_function(X[test_idx]), **target), t)


def fit_fold_path(
    est_cls, params_list: Sequence[dict], data, train_idx, test_idx, target: dict
) -> list:
    """One task for a chain of grid points on one fold (points that differ in one
    parameter, in its increasing order): one estimator with ``warm_start=True``, refitted
    for each point, so that each fit starts from the previous one's solution and kernel
    cache. Returns, per point, :func:`fit_fold`'s record (plus ``warm_started``) or the
    exception it raised; after a failure the chain goes on from a cold start."""
    from bigrate.engines.base import TaskError

    X, y = data
    Xtr, ytr, Xte = X[train_idx], y[train_idx], X[test_idx]
    est = None
    out = []
    for params in params_list:
        t = time.perf_counter()
        try:
            params = {**params, "warm_start": True}
            if est is None:
                est = est_cls(**params)
            else:
                est.set_params(**params)
            est.fit(Xtr, ytr)
            yt = np.where(y[test_idx] == est.classes_[1], 1, -1)
            metrics = rate_metrics(yt, est.decision_function(Xte), **target)
            warm = bool(getattr(est, "warm_started_", False))
            out.append(_record(metrics, t, warm_started=warm))
        except Exception as e:  # recorded as that point's failure
            out.append(TaskError(f"{type(e).__name__}: {e}", traceback.format_exc()))
            est = None
    return out


def c_chains(points: Sequence[dict], default_c=None) -> list[list[int]]:
    """The indices of ``points`` grouped by every parameter but ``C``, each group in
    increasing C (a missing or non-numeric C, e.g. "auto", first): the chains that
    :func:`fit_fold_path` warm-starts along."""
    groups: dict = {}
    for i, p in enumerate(points):
        key = tuple(sorted((k, repr(v)) for k, v in p.items() if k != "C"))
        groups.setdefault(key, []).append(i)

    def c_of(i):
        c = points[i].get("C", default_c)
        return (0, 0.0) if c is None or isinstance(c, str) else (1, float(c))

    return [sorted(g, key=c_of) for g in groups.values()]


def fit_split(est, dataset_path: str, data: str = "shards", split: str = "train",
              rounds: dict | None = None):  # fmt: skip
    """Fit ``est`` on the rows of ``split`` of the dataset at ``dataset_path``, given as
    the estimator takes them (``data``): "shards", the ShardedDataset itself (the
    estimator streams it, or reads its group column); "sparse", the split as CSR;
    "dense", as an array. ``rounds`` (a learner fitted by distributed rounds: its
    ``workers`` shares and ``rounds_per_epoch``): the rounds run here, on the local
    engine, which gives the same bits as the same rounds on any cluster. Returns the
    fitted estimator."""
    from bigrate.data.reader import ShardedDataset

    ds = ShardedDataset(dataset_path)
    if data == "shards" and split != "train" and "split" in est.get_params():
        est.set_params(split=split)
    if rounds is not None and getattr(est, "_job_fit", None) == "rounds":
        from bigrate.engines.local import LocalEngine
        from bigrate.linear.distributed import fit_distributed

        return fit_distributed(est, ds, LocalEngine(), progress=False, **rounds)
    if data == "shards":
        return est.fit(ds)
    whole = ds.to_csr(split)
    return est.fit(whole.X.toarray() if data == "dense" else whole.X, whole.y)


def fit_val(est_cls, params: dict, dataset_path: str, target: dict,
            data: str = "shards", rounds: dict | None = None) -> dict:  # fmt: skip
    """One task: fit on the train split of the dataset at ``dataset_path`` (read where
    the task runs, as ``data`` and ``rounds`` say: see :func:`fit_split`), score its
    val split."""
    from bigrate.data.reader import ShardedDataset

    t = time.perf_counter()
    est = fit_split(est_cls(**params), dataset_path, data, rounds=rounds)
    ds = ShardedDataset(dataset_path)
    return _record(evaluate_split(est.decision_function, ds, "val", **target), t)


#: parameters that keep the warm-up's fit short and within what validation accepts
#: of a small synthetic problem (no calibration hold-out to refuse as too small)
WARM_OVERRIDES = {"calibrate": None, "epochs": 1, "mm_iterations": 1, "max_iter": 5}


def warm_task(est_cls, params: dict, n_features: int, rows: int = 400,
              dense: bool = False) -> dict:  # fmt: skip
    """Load the imports and compiled kernels a sweep's fits need, where it runs: fit
    ``est_cls`` with ``params`` (made short by :data:`WARM_OVERRIDES`) on ``rows``
    random sparse rows (CSR float32, as read from shards; ``dense``: as an array) of
    ``n_features`` features, the classes balanced. It never raises (a warm-up that fails costs nothing but the
    first fits' speed): returns its ``seconds``, the ``error`` if any, and ``pid``."""
    import scipy.sparse as sp

    t = time.perf_counter()
    try:
        import warnings

        d = max(1, min(int(n_features), 50))
        X = sp.random(rows, d, density=0.3, format="csr", dtype=np.float32,
                      random_state=0)  # fmt: skip
        X.resize(rows, int(n_features))
        y = np.where(np.arange(rows) % 2 == 0, 1, -1)
        if dense:
            X = X.toarray()
        valid = est_cls().get_params()
        p = {**params, **{k: v for k, v in WARM_OVERRIDES.items() if k in valid}}
        with warnings.catch_warnings():  # a short fit on random rows may not converge
            warnings.simplefilter("ignore")
            est_cls(**p).fit(X, y)
        error = None
    except Exception as e:  # noqa: BLE001 - recorded in the engine_warm event
        error = f"{type(e).__name__}: {e}"[:500]
    return {"seconds": time.perf_counter() - t, "error": error, "pid": os.getpid()}


def run_sweep(
    engine,
    store,
    points: Sequence[dict],
    n_folds: int,
    task: Callable,
    task_args: Callable[[int, int], tuple],
    *,
    select: str = "J_val",
    progress: bool = True,
    after_task: Callable[[], None] | None = None,
    batch_seconds: float = 0.0,
    chains: Sequence[Sequence[int]] | None = None,
    chain_task: Callable | None = None,
    chain_args: Callable[[list[int], int], tuple] | None = None,
) -> list[dict]:
    """Run every (point, fold) task not yet in ``store`` on ``engine`` and return the
    per-point summary (:func:`summarise`).

    ``task(*task_args(point, fold))`` returns ``{"metrics": {...}, "seconds": s}``;
    ``after_task`` is called after each recorded task (e.g. to honour Ctrl-C).

    With ``batch_seconds`` > 0, on an engine with several workers, short tasks are
    batched (:meth:`~bigrate.engines.base.Engine.map_guided`): the first two tasks
    of each worker go alone, later batches hold about ``batch_seconds`` of work by the
    median task time so far, shrinking towards the end so that the workers finish
    together, and two batches per worker stay submitted, so no worker waits for this
    process while it records results; an engine's cost per task (scheduling,
    transfer) is paid per batch. The batch sizes are logged (``sweep_batches``).

    With ``chains`` (lists of point indices, together covering every point), the
    unfinished points of one chain on one fold run as one engine task,
    ``chain_task(*chain_args(points, fold))``, in the chain's order; it returns one
    result (or exception) per point, recorded as if each had been its own task (a
    resumed sweep runs only the unfinished rest of a chain)."""
    done = store.results()
    todo = [
        (p, k) for p in range(len(points)) for k in range(n_folds) if (p, k) not in done
    ]
    # a task's record is saved before its event: one stopped between the two has its
    # event written now, so that every finished task has exactly one
    logged = {
        (e.get("point"), e.get("fold"))
        for e in store.events()
        if e.get("event") in ("task_done", "task_failed")
    }
    for (p, k), rec in sorted(done.items()):
        if (p, k) not in logged:
            ok = rec.get("status") == "ok"
            store.event("task_done" if ok else "task_failed", point=p, fold=k,
                        recovered=True, **({"seconds": rec.get("seconds")} if ok
                                           else {"error": rec.get("error", "")[:500]}))  # fmt: skip
    store.event(
        "sweep_started",
        points=len(points),
        folds=n_folds,
        todo=len(todo),
        done=len(done),
    )
    bar = Progress(
        "sweep", total=len(points) * n_folds, done=len(done), enabled=progress
    )
    state = {"best": None, "table_at": time.monotonic()}

    def record(p, k, res):
        best = state["best"]
        rec = {"point": p, "fold": k, "params": points[p]}
        if isinstance(res, Exception):
            rec.update(
                status="failed",
                error=str(res)[:2000],
                traceback=getattr(res, "tb", ""),
            )
        else:
            rec.update(status="ok", **res)
            value = res["metrics"].get(select)
            if value is not None and (
                best is None
                or (value < best if SELECT[select] == "min" else value > best)
            ):
                state["best"] = best = value
        store.save_result(p, k, rec)  # the durable record of the task, then its event
        if isinstance(res, Exception):
            store.event("task_failed", point=p, fold=k, error=str(res)[:500])
        else:
            store.event("task_done", point=p, fold=k, seconds=res.get("seconds"))
        if (
            time.monotonic() - state["table_at"] >= 2.0
        ):  # the derived table, now and then
            store.write_results_table()
            state["table_at"] = time.monotonic()
        bar.update(1, f"best fold {select} {best:.4g}" if best is not None else "")
        if after_task is not None:
            after_task()

    if chains is not None:
        units = []
        for k in range(n_folds):
            for chain in chains:
                left = [p for p in chain if (p, k) not in done]
                if left:
                    units.append((left, k))
        store.event("sweep_wave", tasks=len(todo), chains=len(units))
        args = [chain_args(left, k) for left, k in units]
        for i, out in engine.map(chain_task, args):
            left, k = units[i]
            for j, p in enumerate(left):
                record(p, k, out if isinstance(out, Exception) else out[j])
    elif todo:
        args = [task_args(p, k) for p, k in todo]
        workers = engine.n_workers
        if batch_seconds > 0 and workers > 1 and len(todo) > 2 * workers:
            store.event("sweep_wave", tasks=len(todo), batch="guided")
            sizes: list = []
            for i, res in engine.map_guided(task, args, batch_seconds, sizes=sizes):
                record(*todo[i], res)
            store.event("sweep_batches", sizes=sizes)
        else:
            store.event("sweep_wave", tasks=len(todo), batch=1)
            for i, res in engine.map(task, args):
                record(*todo[i], res)
    if todo:
        store.write_results_table()
    bar.close()
    return summarise(store.results(), points, n_folds)


def summarise(results: dict, points: Sequence[dict], n_folds: int) -> list[dict]:
    """One row per point: ``point``, ``params``, ``complete`` (every fold ok),
    ``n_ok``, and ``mean_<metric>`` / ``std_<metric>`` over its finished folds."""
    table = []
    for p, params in enumerate(points):
        recs = [results.get((p, k)) for k in range(n_folds)]
        good = [r for r in recs if r is not None and r["status"] == "ok"]
        row = {
            "point": p,
            "params": params,
            "complete": len(good) == n_folds,
            "n_ok": len(good),
        }
        if good:
            for key in good[0]["metrics"]:
                vals = [float(r["metrics"][key]) for r in good]
                row[f"mean_{key}"] = float(np.mean(vals))
                row[f"std_{key}"] = float(np.std(vals))
        table.append(row)
    return table


def rank_points(table: list[dict], select: str) -> list[dict]:
    """Set ``rank`` (1 = best mean ``select``; points with a failed fold get none)."""
    sign = 1.0 if SELECT[select] == "min" else -1.0
    ok = [r for r in table if r["complete"] and f"mean_{select}" in r]
    for k, r in enumerate(sorted(ok, key=lambda r: (sign * r[f"mean_{select}"],
                                                    r["point"])), 1):  # fmt: skip
        r["rank"] = k
    return table


def write_summary(table: list[dict], path) -> None:
    """The per-point summary as Parquet (one row a point: rank, each parameter as a
    column, n_ok, complete, mean_* and std_* of every metric), written atomically."""
    import json
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = sorted({k for r in table for k in r["params"]})
    cols: dict = {"point": [r["point"] for r in table],
                  "rank": [r.get("rank") for r in table]}  # fmt: skip
    for k in keys:
        vals = [r["params"].get(k) for r in table]
        cols[f"param_{k}"] = (
            vals if len({type(v) for v in vals}) == 1 else [json.dumps(v) for v in vals]
        )
    cols["params"] = [json.dumps(r["params"], sort_keys=True) for r in table]
    cols["n_ok"] = [r["n_ok"] for r in table]
    cols["complete"] = [r["complete"] for r in table]
    stats = sorted({k for r in table for k in r if k.startswith(("mean_", "std_"))})
    for k in stats:
        cols[k] = [float(r[k]) if k in r else None for r in table]
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(pa.table(cols), tmp)
    os.replace(tmp, path)


def select_best(table: list[dict], select: str) -> dict:
    """The complete point with the best mean ``select`` (ties: the first point)."""
    if select not in SELECT:
        raise ValueError(f"select must be one of {sorted(SELECT)}; got {select!r}")
    ok = [r for r in table if r["complete"] and f"mean_{select}" in r]
    if not ok:
        raise RuntimeError(
            "every sweep point failed (or none has the metric "
            f"{select!r}); see the results for the errors"
        )
    sign = 1.0 if SELECT[select] == "min" else -1.0
    return min(ok, key=lambda r: (sign * r[f"mean_{select}"], r["point"]))
