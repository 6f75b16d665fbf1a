"""Distributed SGD for the NP and q-value learners, on any engine (local, Dask, Ray).

The learner owns the algorithm; the engine only runs the tasks (as dask-ml's
``Incremental`` only calls ``partial_fit``). It is written against the estimator's
streaming protocol (:meth:`~bigrate.linear.sgd.NeymanPearsonSGD.start_stream`,
:func:`~bigrate.linear.sgd.steps_from`, :func:`~bigrate.linear.sgd.merge_states`,
``record_epoch``, ``finish_stream``) and the engine interface
(:mod:`bigrate.engines.base`).

The row groups of each class are dealt to the workers round-robin, once, so every worker
owns a share of both classes. Each round, every worker task starts from the global state
(w, b, lambda, t), reads only its own row groups for this round straight from the dataset
path (local or fsspec URL: data never travels through the driver), runs ``steps``
class-balanced SGD steps and returns its state and false-alarm statistics; the driver
merges the states (mean model, geometric mean of the multipliers).

Work is deterministic for a given seed and worker count: the row groups a worker reads in
round r are the next slice of a per-(epoch, worker, class) seeded permutation, and each
task is seeded by (seed, round, worker). Tasks are pure functions of their arguments, so
a task whose worker dies is simply run again elsewhere.

Memory per worker: the rows a round samples from (about ``buffer_rows`` per class; large
data gets more, smaller rounds an epoch) plus a cache of decoded row groups (``cache_mb``,
by default a quarter of the worker's memory limit).
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.linear.sampler import ShardSampler, process_cache, row_group_units
from bigrate.linear.sgd import KernelConfig, SGDState, merge_states, steps_from
from bigrate.progress import Progress

__all__ = ["fit_distributed", "round_units", "sgd_round"]


def sgd_round(
    dataset_path: str,
    units: list,
    cfg: KernelConfig,
    state: SGDState,
    steps: int,
    seed,
    buffer_rows: int,
    batch_rows: int,
    holdout,
    cache_mb: float = 0.0,
) -> dict:
    """One worker's share of a round: ``steps`` steps from ``state`` over its own
    row-group ``units``, read from ``dataset_path`` where the task runs (decoded row
    groups are kept in a per-process cache of ``cache_mb`` MiB across rounds)."""
    ds = ShardedDataset(dataset_path)
    cache = process_cache(cache_mb)
    sampler = ShardSampler(
        ds,
        cfg.mode,
        seed,
        units=units,
        buffer_rows=buffer_rows,
        batch_rows=batch_rows,
        holdout=holdout,
        cache=cache,
    )
    stats = np.zeros(6)
    new = steps_from(cfg, state, sampler, steps, stats)
    return {
        "state": new,
        "stats": stats,
        "pid": os.getpid(),
        "cache_hits": cache.hits,
        "cache_misses": cache.misses,
    }


def _deal(units: list, n: int) -> list[list]:
    return [units[k::n] for k in range(n)]


def round_units(
    own: list, epoch: int, k: int, cls: int, seed: int, round_in_epoch: int, per_round: int
) -> list:
    """The ``per_round`` units worker k reads in this round: a slice of its seeded
    per-epoch permutation (wrapping around for a class smaller than needed)."""
    if not own:
        return []
    perm = np.random.default_rng([seed, epoch, k, cls]).permutation(len(own))
    start = round_in_epoch * per_round
    return [own[perm[(start + j) % len(own)]] for j in range(per_round)]


def fit_distributed(
    estimator,
    dataset,
    engine,
    *,
    rounds_per_epoch: int = 4,
    retries: int = 3,
    progress: bool = True,
    on_round=None,
    cache_mb: float | None = None,
):
    """Fit a :class:`~bigrate.NeymanPearsonSGD` or :class:`~bigrate.QValueSGD` on the
    shards of ``dataset`` with the workers of ``engine`` (any engine of
    :func:`bigrate.engines.open_engine`). Returns the estimator.

    ``on_round(round_index, engine)`` is called after every round (for monitoring).
    ``cache_mb``: decoded row groups each worker keeps across rounds (default: 25% of
    the smallest worker memory limit, or 1 GiB where workers have none); what does not
    fit is read from storage again every epoch.

    Examples
    --------
    >>> from bigrate import NeymanPearsonSGD
    >>> from bigrate.engines import open_engine
    >>> with open_engine("dask", n_workers=2) as eng:  # doctest: +SKIP
    ...     clf = fit_distributed(NeymanPearsonSGD(rho=0.05), "data/rcv1s", eng)
    """
    t_start = time.perf_counter()
    ds = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
    est = estimator
    plan, st = est.start_stream(ds)
    cfg = plan.cfg
    n_w = engine.n_workers
    if n_w == 0:
        raise RuntimeError(f"the {engine.name} engine has no workers")
    if cache_mb is None:
        limits = [m or 0 for m in engine.worker_memory_limits()]
        cache_mb = 0.25 * min(limits) / 2**20 if limits and min(limits) > 0 else 1024.0
    units = row_group_units(ds.files(est.split))
    own_pos = _deal([u for u in units if u[0].cls == "pos"], n_w)
    own_neg = _deal([u for u in units if u[0].cls == "neg"], n_w)
    per_epoch = plan.steps_per_epoch
    # a worker-round holds the rows it samples from in memory: at most about
    # buffer_rows per class, so large data gets more (smaller) rounds an epoch
    max_steps = 2 * est.buffer_rows
    rounds_per_epoch = max(rounds_per_epoch, math.ceil(per_epoch / (n_w * max_steps)))
    steps = max(1, math.ceil(per_epoch / (n_w * rounds_per_epoch)))
    rows_per_unit = max(1, int(np.mean([u[0].rows / u[0].row_groups for u in units])))
    # rows each class needs per worker-round, then row groups to read for them
    share = 1.0 if cfg.mode == "pairs" else 0.5
    need_rows = steps + 1 if cfg.mode == "uniform" else int(steps * share) + 1
    per_round = max(1, math.ceil(need_rows / rows_per_unit))
    seed = plan.seed
    if progress:
        link = engine.dashboard_link
        print(
            f"[bigrate] {engine.name}: {n_w} workers, {rounds_per_epoch} rounds an "
            f"epoch of {per_epoch:,} steps" + (f"; dashboard {link}" if link else ""),
            file=sys.stderr,
            flush=True,
        )
    bar = Progress(
        "training rounds", total=est.epochs * rounds_per_epoch, enabled=progress
    )
    rnd = 0
    for epoch in range(est.epochs):
        te = time.perf_counter()
        stats = np.zeros(6)
        n_tasks = 0
        for r in range(rounds_per_epoch):
            args = []
            for k in range(n_w):
                mine = round_units(
                    own_pos[k], epoch, k, 0, seed, r, per_round
                ) + round_units(own_neg[k], epoch, k, 1, seed, r, per_round)
                if not any(u[0].cls == "pos" for u in mine) or not any(
                    u[0].cls == "neg" for u in mine
                ):
                    continue  # a worker with no shard of one class sits this round out
                args.append(
                    (ds.path, mine, cfg, st, steps, [seed, rnd, k], 1 << 40,
                     est.batch_rows, plan.holdout, cache_mb)
                )  # fmt: skip
            if not args:
                raise ValueError(
                    f"{ds.path}: no worker holds row groups of both classes"
                )
            results = engine.run(sgd_round, args, retries=retries)
            st = merge_states([res["state"] for res in results])
            for res in results:
                stats += res["stats"]
            n_tasks += len(results)
            rnd += 1
            bar.update(
                1,
                f"Pfa {stats[2] / max(stats[0], 1):.4f} Pnd "
                f"{stats[5] / max(stats[3], 1):.4f} lambda {st.lam:.4g}",
            )
            if on_round is not None:
                on_round(rnd, engine)
        est.record_epoch(stats, st, time.perf_counter() - te, steps * n_tasks)
    bar.close(f"lambda {st.lam:.4g}")
    est.finish_stream(plan, st, ds)
    est.fit_seconds_ = time.perf_counter() - t_start
    est.engine_ = {
        "name": engine.name,
        "workers": n_w,
        "rounds": rnd,
        "steps_per_round": steps,
    }
    return est
