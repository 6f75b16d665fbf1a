"""The Dask engine: an embedded LocalCluster on 127.0.0.1, or an existing scheduler.

Memory per worker: the rows a round samples from (about ``buffer_rows`` per class,
rounds are made smaller on large data to keep to that) plus a cache of decoded row groups
(``cache_mb``, by default a quarter of the worker's memory limit).

Distributed SGD (used by :func:`fit_dask`): the row groups of each class are dealt to the
workers round-robin, once, so every worker owns a share of both classes. Each round,
every worker task starts from the global (w, b, lambda, t), reads only its own row
groups for this round straight from the dataset path (local or fsspec URL: data never
travels through the driver), runs ``steps`` class-balanced SGD steps and returns its
model and false-alarm statistics. The driver averages the models (w, b), takes the
geometric mean of the multipliers (the one shared lambda every worker starts the next
round from) and advances the step counter by ``steps``.

Work is deterministic for a given seed and worker count: the row groups a worker reads in
round r are the next slice of a per-(epoch, worker, class) seeded permutation, and each
task is seeded by (seed, round, worker). A task whose worker dies is recomputed on
another worker by the scheduler (tasks are pure functions of their arguments, retried up
to ``retries`` times), so training completes.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.linear.sampler import row_group_units, steps_per_epoch
from bigrate.linear.sgd import local_round


class DaskEngine:
    """A Dask client on an embedded LocalCluster (default) or an existing scheduler.

    Parameters
    ----------
    address : str, optional
        ``tcp://host:8786`` of a running scheduler; None starts a LocalCluster bound to
        127.0.0.1 with ``n_workers`` single-threaded worker processes.
    n_workers : int, optional
        Embedded cluster size (default: the number of CPUs, at most 8).
    memory_limit : str or int
        Per-worker memory limit of the embedded cluster (e.g. "1GiB").
    dashboard : bool
        Serve the dashboard of the embedded cluster on 127.0.0.1 (random port).
    """

    name = "dask"

    def __init__(
        self,
        address: str | None = None,
        *,
        n_workers: int | None = None,
        memory_limit="auto",
        dashboard: bool = True,
        quiet: bool = True,
    ):
        from dask.distributed import Client, LocalCluster

        self.cluster = None
        if address:
            self.client = Client(address, timeout="20s")
        else:
            n = n_workers or min(os.cpu_count() or 1, 8)
            self.cluster = LocalCluster(
                host="127.0.0.1",
                n_workers=n,
                threads_per_worker=1,
                processes=True,
                memory_limit=memory_limit,
                dashboard_address="127.0.0.1:0" if dashboard else None,
                silence_logs=logging.ERROR if quiet else logging.WARNING,
            )
            self.client = Client(self.cluster)

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard is fine
            return None

    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info()["workers"])

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def put(self, obj):
        """Send ``obj`` to every worker once; tasks receive it by reference."""
        return self.client.scatter(obj, broadcast=True, hash=False)

    def map(self, fn, args_list, *, retries: int = 3):
        """Yield (index, result or TaskError) as tasks finish. A task whose worker dies
        is recomputed on another worker; an exception inside it is not retried."""
        from dask.distributed import as_completed

        from bigrate.engines.local import TaskError

        futures = [
            self.client.submit(fn, *args, pure=False, retries=0) for args in args_list
        ]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures):
            i = index[fut.key]
            try:
                yield i, fut.result()
            except Exception as e:  # noqa: BLE001 - recorded per task
                import traceback

                tb = "".join(traceback.format_exception(e))
                yield i, TaskError(f"{type(e).__name__}: {e}", tb)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> DaskEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _deal(units: list, n: int) -> list[list]:
    return [units[k::n] for k in range(n)]


def _round_units(
    own: list,
    epoch: int,
    k: int,
    cls: int,
    seed: int,
    round_in_epoch: int,
    per_round: int,
) -> list:
    """The ``per_round`` units worker k reads in this round: a slice of its seeded
    per-epoch permutation (wrapping around for a class smaller than needed)."""
    if not own:
        return []
    perm = np.random.default_rng([seed, epoch, k, cls]).permutation(len(own))
    start = round_in_epoch * per_round
    idx = [(start + j) % len(own) for j in range(per_round)]
    return [own[perm[i]] for i in idx]


def fit_dask(
    estimator,
    dataset,
    engine: DaskEngine,
    *,
    rounds_per_epoch: int = 4,
    retries: int = 3,
    progress: bool = True,
    on_round=None,
    cache_mb: float | None = None,
):
    """Fit a :class:`~bigrate.NeymanPearsonSGD` or :class:`~bigrate.QValueSGD` on the
    shards of ``dataset`` with the workers of ``engine``. Returns the estimator.

    ``on_round(round_index, engine)`` is called after every round (for monitoring).
    ``cache_mb``: decoded row groups each worker keeps across rounds (default: 25% of
    the smallest worker memory limit, or 1 GiB where workers have none); what does not
    fit is read from storage again every epoch.
    """
    t_start = time.perf_counter()
    ds = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
    est = estimator
    est._validate_params()
    cfg, n_pos, n_neg, holdout = est._prepare_stream(ds)
    workers = engine.workers()
    n_w = len(workers)
    if n_w == 0:
        raise RuntimeError("the Dask cluster has no workers")
    if cache_mb is None:
        info = engine.client.scheduler_info()["workers"]
        limits = [w.get("memory_limit") or 0 for w in info.values()]
        cache_mb = 0.25 * min(limits) / 2**20 if min(limits) > 0 else 1024.0
    units = row_group_units(ds.files(est.split))
    pos_units = [u for u in units if u[0].cls == "pos"]
    neg_units = [u for u in units if u[0].cls == "neg"]
    own_pos, own_neg = _deal(pos_units, n_w), _deal(neg_units, n_w)
    per_epoch = steps_per_epoch(n_pos, n_neg, cfg.mode)
    # a worker-round holds the rows it samples from in memory: at most about
    # buffer_rows per class, so large data gets more (smaller) rounds an epoch
    max_steps = 2 * est.buffer_rows
    rounds_per_epoch = max(rounds_per_epoch, math.ceil(per_epoch / (n_w * max_steps)))
    steps = max(1, math.ceil(per_epoch / (n_w * rounds_per_epoch)))
    rows_per_unit = max(1, int(np.mean([u[0].rows / u[0].row_groups for u in units])))
    # rows each class needs per worker-round, then row groups to read for them
    share = 1.0 if cfg.mode == "pairs" else 0.5
    need_rows = int(steps * share) + 1
    if cfg.mode == "uniform":
        need_rows = steps + 1
    per_round = max(1, math.ceil(need_rows / rows_per_unit))
    v, state = est._init_state(ds.n_features)
    w = v * state[0]
    b, lam, t = float(state[1]), float(state[2]), float(state[3])
    seed = est._seed_int()
    if progress:
        link = engine.dashboard_link
        print(
            f"[bigrate] dask: {n_w} workers, {rounds_per_epoch} rounds an epoch of "
            f"{per_epoch:,} steps" + (f"; dashboard {link}" if link else ""),
            file=sys.stderr,
            flush=True,
        )
    from bigrate.progress import Progress

    bar = Progress(
        "training rounds", total=est.epochs * rounds_per_epoch, enabled=progress
    )
    rnd = 0
    for epoch in range(est.epochs):
        te = time.perf_counter()
        stats = np.zeros(6)
        for r in range(rounds_per_epoch):
            futures = []
            for k in range(n_w):
                mine = _round_units(
                    own_pos[k], epoch, k, 0, seed, r, per_round
                ) + _round_units(own_neg[k], epoch, k, 1, seed, r, per_round)
                if not any(u[0].cls == "pos" for u in mine) or not any(
                    u[0].cls == "neg" for u in mine
                ):
                    continue  # a worker with no shard of one class sits this round out
                futures.append(
                    engine.client.submit(
                        local_round,
                        ds.path,
                        mine,
                        cfg,
                        w,
                        b,
                        lam,
                        t,
                        steps,
                        [seed, rnd, k],
                        1 << 40,
                        est.batch_rows,
                        holdout,
                        cache_mb,
                        pure=False,
                        retries=retries,
                        key=f"bigrate-sgd-{id(est)}-{rnd}-{k}",
                    )
                )
            if not futures:
                raise ValueError(
                    f"{ds.path}: no worker holds row groups of both classes"
                )
            results = engine.client.gather(futures)
            w = np.mean([res["w"] for res in results], axis=0)
            b = float(np.mean([res["b"] for res in results]))
            lam = float(np.exp(np.mean([np.log(res["lam"]) for res in results])))
            t = t + steps
            for res in results:
                stats += res["stats"]
            rnd += 1
            bar.update(
                1,
                f"Pfa {stats[2] / max(stats[0], 1):.4f} Pnd "
                f"{stats[5] / max(stats[3], 1):.4f} lambda {lam:.4g}",
            )
            if on_round is not None:
                on_round(rnd, engine)
        est._record(
            epoch,
            stats,
            np.array([1.0, b, lam, t]),
            time.perf_counter() - te,
            steps * len(futures) * rounds_per_epoch,
        )
    bar.close(f"lambda {lam:.4g}")
    est._set_fitted(w, np.array([1.0, b, lam, t]), cfg)
    est._finish_stream(ds, holdout)
    est.fit_seconds_ = time.perf_counter() - t_start
    est.engine_ = {
        "name": "dask",
        "workers": n_w,
        "rounds": rnd,
        "steps_per_round": steps,
    }
    return est
