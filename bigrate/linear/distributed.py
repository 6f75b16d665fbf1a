"""Distributed SGD for the NP and q-value learners, on any engine (local, Dask, Ray).

The learner owns the algorithm; the engine only runs the tasks (as dask-ml's
``Incremental`` only calls ``partial_fit``). It is written against the estimator's
streaming protocol (:meth:`~bigrate.linear.sgd.NeymanPearsonSGD.start_stream`,
:func:`~bigrate.linear.steps.steps_from`, :func:`~bigrate.linear.steps.merge_states`,
``record_epoch``, ``finish_stream``) and the engine interface
(:mod:`bigrate.engines.base`).

The row groups of each class are dealt to the workers round-robin, once, so every worker
owns a share of both classes. Each round, every worker task starts from the global state
(w, b, lambda, t), reads only its own row groups for this round straight from the dataset
path (local or fsspec URL: data never travels through the driver), runs ``steps``
class-balanced SGD steps and gives its state and false-alarm statistics to the
engine's reduction tree: the workers sum them pairwise along a fixed binary tree (each
state crosses the network once), the driver receives the root's sum alone (mean model,
geometric mean of the multipliers: :class:`RoundSum`), and the next round's start goes
from the root's worker down the same tree. Worker k's task runs
in the same worker process every round (the engine's pinned pool: an actor on Dask and
Ray), so the row groups it decoded in earlier rounds are still in that process's cache.

Work is deterministic for a given seed and worker count: the row groups a worker reads in
round r are the next slice of a per-(epoch, worker, class) seeded permutation, and each
task is seeded by (seed, round, worker). Tasks are pure functions of their arguments, so
a task whose worker dies is simply run again elsewhere.

Memory per worker: the rows a round samples from (about ``buffer_rows`` per class; large
data gets more, smaller rounds an epoch) plus a cache of decoded row groups (``cache_mb``,
by default a quarter of the worker's memory limit).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bigrate.data.format import RowBlock, RowSequence
from bigrate.data.reader import ShardedDataset
from bigrate.engines.base import ClusterLost, Reduced
from bigrate.files import atomic_write_text, current_umask, jsonable, replace_dir
from bigrate.linear.sampler import (
    ShardSampler,
    cached_classes,
    process_cache,
    row_group_units,
)
from bigrate.linear.steps import (
    KernelConfig,
    SGDState,
    StateSum,
    add_state_sums,
    run_steps,
    steps_from,
)
from bigrate.progress import Progress

__all__ = [
    "RoundSum",
    "RoundTask",
    "Snapshot",
    "combine_rounds",
    "auto_rounds_per_epoch",
    "fit_distributed",
    "load_snapshot",
    "round_units",
    "save_snapshot",
    "sgd_round",
    "sgd_task",
]


@dataclass
class Snapshot:
    """Everything a distributed fit needs to continue after round ``round``: the merged
    state, the epoch's statistics so far, the history, and the schedule it was made
    with (a fit resumes only on the same schedule: the same seed, worker count and
    rounds, so that its final model equals an uninterrupted fit's)."""

    state: SGDState
    round: int
    epoch_stats: np.ndarray
    epoch_tasks: int
    epoch_seconds: float
    history: list
    schedule: dict


def save_snapshot(snap: Snapshot, path) -> None:
    """Write ``snap`` as plain data (``state.npz`` + ``snapshot.json``) into the
    directory ``path``, atomically (the previous snapshot stays until the new one is
    complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())
        with open(tmp / "state.npz", "wb") as f:
            np.savez(f, w=snap.state.w, epoch_stats=snap.epoch_stats)
            f.flush()
            os.fsync(f.fileno())
        meta = {
            "format": "bigrate-sgd-snapshot",
            "round": snap.round,
            "b": snap.state.b,
            "lam": snap.state.lam,
            "t": snap.state.t,
            "epoch_tasks": snap.epoch_tasks,
            "epoch_seconds": snap.epoch_seconds,
            "history": snap.history,
            "schedule": snap.schedule,
        }
        atomic_write_text(tmp / "snapshot.json", json.dumps(jsonable(meta)) + "\n")
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_snapshot(path) -> Snapshot:
    """Read a snapshot written by :func:`save_snapshot`; a damaged one is a ValueError
    naming the file."""
    path = Path(path)
    try:
        meta = json.loads((path / "snapshot.json").read_text())
        with np.load(path / "state.npz", allow_pickle=False) as z:
            w, stats = z["w"], z["epoch_stats"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a readable training snapshot ({e})") from None
    if meta.get("format") != "bigrate-sgd-snapshot" or stats.shape != (6,):
        raise ValueError(f"{path}: not a training snapshot of this version")
    return Snapshot(
        SGDState(w, float(meta["b"]), float(meta["lam"]), float(meta["t"])),
        int(meta["round"]),
        stats,
        int(meta["epoch_tasks"]),
        float(meta["epoch_seconds"]),
        list(meta["history"]),
        dict(meta["schedule"]),
    )


@dataclass(frozen=True)
class RoundTask:
    """One worker's share of one round, as the driver sends it: where the dataset is
    (``dataset``: a path, URL or :class:`~bigrate.data.reader.DatasetRef`, and
    ``manifest_sha256``, the manifest the fit was planned on), the row-group
    ``units`` it reads, the kernel configuration, how many ``steps`` it runs with
    which ``seed``, the plan's reading settings, the decoded row groups a worker keeps
    across rounds (``cache_mb``, of the classes ``cached``) and the calibration
    ``holdout`` the sampler leaves out. The state it starts from comes apart (the
    previous round's result, on the worker that holds it)."""

    dataset: object
    manifest_sha256: str
    units: tuple
    cfg: KernelConfig
    steps: int
    seed: tuple
    batch_rows: int
    holdout: tuple | None
    cache_mb: float
    shuffle_block: int
    cached: tuple = ("pos", "neg")


#: datasets opened by this process's round tasks, kept between rounds (the manifest
#: is read once a fit, not once a round): (repr(ref), manifest sha256) -> dataset
_DATASETS: dict = {}
_DATASETS_KEPT = 4


def open_round_dataset(ref, manifest_sha256: str) -> ShardedDataset:
    """The dataset a round task reads, opened once per process and fit: a dataset
    whose manifest is no longer the one the fit was planned on (rewritten meanwhile)
    is refused, naming it."""
    key = (repr(ref), manifest_sha256)  # a ref's storage options may hold dicts
    ds = _DATASETS.get(key)
    if ds is None:
        ds = ShardedDataset(ref)
        if ds.manifest_sha256 != manifest_sha256:
            raise ValueError(
                f"{ds.path}: the dataset was rewritten while the fit ran (its manifest "
                "is not the one the fit was planned on); start the fit again"
            )
        while len(_DATASETS) >= _DATASETS_KEPT:
            _DATASETS.pop(next(iter(_DATASETS)))
        _DATASETS[key] = ds
    return ds


def sgd_round(task: RoundTask, state: SGDState) -> dict:
    """One worker's share of a round: ``task.steps`` steps from ``state`` over its own
    row groups, read where the task runs (decoded row groups of the classes
    ``task.cached`` are kept in a per-process cache of ``task.cache_mb`` MiB across
    rounds)."""
    t0 = time.perf_counter()
    ds = open_round_dataset(task.dataset, task.manifest_sha256)
    cache = process_cache(task.cache_mb)
    sampler = ShardSampler(
        ds,
        task.cfg.mode,
        list(task.seed),
        units=list(task.units),
        buffer_rows=1 << 40,  # a round holds all the rows of its row groups
        batch_rows=task.batch_rows,
        holdout=task.holdout,
        cache=cache,
        shuffle_block=task.shuffle_block,
        cached=task.cached,
    )
    stats = np.zeros(6)
    t1 = time.perf_counter()
    new = steps_from(task.cfg, state, sampler, task.steps, stats)
    t2 = time.perf_counter()
    read = sampler.read_s
    return {
        "state": new,
        "stats": stats,
        "pid": os.getpid(),
        "cache_hits": cache.hits,
        "cache_misses": cache.misses,
        "seconds": time.perf_counter() - t0,  # reading, decoding and steps
        # where the task's time went: reading + decoding + checking the row groups
        # (cache misses), assembling chunks (joining the buffers they draw from: no row
        # is copied), the SGD steps, the rest
        # (opening the dataset, the sampler, the state)
        "read_s": read,
        "gather_s": sampler.gather_s,
        "steps_s": (t2 - t1) - read - sampler.gather_s,
        "setup_s": (t1 - t0) + (time.perf_counter() - t2),
    }


_TASK_PARTS = ("read_s", "gather_s", "steps_s", "setup_s")


@dataclass
class RoundSum:
    """Workers' round results summed along the engine's reduction tree: their states
    (:class:`~bigrate.linear.steps.StateSum`), false-alarm statistics, how many tasks,
    the slowest task's and the tasks' total seconds and parts (``_TASK_PARTS``), and
    the seconds the combinations themselves took."""

    state: StateSum
    stats: np.ndarray
    tasks: int
    seconds_max: float
    seconds_sum: float
    parts_sum: np.ndarray
    combine_s: float = 0.0

    def start(self) -> SGDState:
        """The state the next round starts from (the merge of the workers' states)."""
        return self.state.mean()


def combine_rounds(a: RoundSum, b: RoundSum) -> RoundSum:
    """``a`` and ``b`` combined (``a``'s sums first): a node of the reduction tree."""
    t = time.perf_counter()
    state = add_state_sums(a.state, b.state)
    return RoundSum(state, a.stats + b.stats, a.tasks + b.tasks,
                    max(a.seconds_max, b.seconds_max), a.seconds_sum + b.seconds_sum,
                    a.parts_sum + b.parts_sum,
                    a.combine_s + b.combine_s + time.perf_counter() - t)  # fmt: skip


def sgd_task(start, task: RoundTask) -> RoundSum:
    """A worker's share of a round as a leaf of the reduction tree: :func:`sgd_round`
    of ``task`` from ``start`` (an :class:`SGDState`, or the previous round's
    :class:`RoundSum`, whose merge every worker computes alike: the same bits as the
    driver's)."""
    state = start.start() if isinstance(start, RoundSum) else start
    res = sgd_round(task, state)
    return RoundSum(StateSum.of(res["state"]), res["stats"], 1, res["seconds"],
                    res["seconds"], np.array([res[k] for k in _TASK_PARTS]))  # fmt: skip


def warm_steps(cfg: KernelConfig) -> dict:
    """A task run once on every worker slot before the first round: the step kernels
    the rounds use (those that read rows where they lie in the decoded row groups)
    loaded where it runs (from numba's cache, or compiled) by a few steps on a tiny
    problem, so that the first round pays no more than the others; returns its seconds
    and process id."""
    t = time.perf_counter()
    rows = RowSequence([_tiny_block()])
    y = rows.y
    order = np.arange(len(y), dtype=np.int64)
    if cfg.mode == "pairs":
        order = (order[y > 0], order[y < 0])
    v, state = SGDState(np.zeros(rows.width), 0.0, 1.0, 0.0).kernel_state()
    run_steps(cfg, v, state, rows, y, order, np.zeros(6))
    return {"seconds": time.perf_counter() - t, "pid": os.getpid()}


def _tiny_block() -> RowBlock:
    """64 random sparse rows of 8 features, the classes alternating (a warm-up's)."""
    import scipy.sparse as sp

    X = sp.random(64, 8, density=0.5, format="csr", dtype=np.float32, random_state=0)
    y = np.where(np.arange(64) % 2 == 0, 1, -1).astype(np.int8)
    return RowBlock(X.tocsr(), y, np.arange(64, dtype=np.int64))


def _round_costs(timing: list, st: SGDState) -> dict:
    """Where a round's time goes, medians over this fit's rounds: the tasks' wall
    time seen by the driver, the slowest and the mean task (measured inside the task),
    the mean task's parts (reading + decoding + checking row groups, assembling the
    chunks, the SGD steps, the rest: the median mean task split in the shares the parts
    took over all rounds, so they add up to it), what the driver waits beyond the
    slowest task (the state and the task sent, scheduling, the results returned:
    communication and scheduling), the merge, and the bytes of the state sent to each
    worker and back."""
    if not timing:
        return {}
    t = np.array(timing, dtype=float)
    # the median task split in the shares its parts took over all rounds: medians of
    # the parts taken one by one need not add up to the median task (a round whose
    # row groups were read and one that found them cached are both typical)
    mean_task = float(np.median(t[:, 3]))
    part_sums = t[:, 4 : 4 + len(_TASK_PARTS)].sum(axis=0)
    shares = part_sums / part_sums.sum() if part_sums.sum() > 0 else part_sums
    return {
        "round_tasks_wall_s": float(np.median(t[:, 0])),
        "round_slowest_task_s": float(np.median(t[:, 2])),
        "round_mean_task_s": mean_task,
        "round_comm_sched_s": float(np.median(t[:, 0] - t[:, 2])),
        "round_merge_s": float(np.median(t[:, 1])),
        **{
            f"round_task_{k}": float(mean_task * shares[j])
            for j, k in enumerate(_TASK_PARTS)
        },
        "state_bytes": int(st.w.nbytes + 3 * 8),
    }


def _deal(units: list, n: int) -> list[list]:
    return [units[k::n] for k in range(n)]


def round_units(
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
    return [own[perm[(start + j) % len(own)]] for j in range(per_round)]


#: the round's fixed cost model behind ``rounds_per_epoch="auto"``: seconds a round
#: spends beyond its tasks on W workers, ``ROUND_FIXED_S[0] + ROUND_FIXED_S[1] *
#: log2(W) + ROUND_FIXED_S[2] * W`` (the direct allreduce of a 378 KB state on real
#: worker processes, ``benchmarks/bench_sgd.py scale``: the 1-worker round, two hops a
#: level of the tree, the root's slot sending each other slot its part), and seconds
#: an SGD step takes (the 1- and 2-worker fits there, RCV1-shaped rows)
ROUND_FIXED_S = (0.003, 0.0017, 0.00012)
STEP_S = 0.7e-6
#: the share of a round its fixed cost may take before rounds get longer
COMM_SHARE = 0.1


def auto_rounds_per_epoch(per_epoch: int, workers: int, most: int = 4) -> int:
    """Rounds an epoch for ``workers`` shares of ``per_epoch`` steps: ``most`` (the
    workers average their models that often an epoch) unless the tasks would then be
    so short that the round's fixed cost (:data:`ROUND_FIXED_S`, growing with log2 W
    on the tree and W at the root's slot) takes more than :data:`COMM_SHARE` of a round;
    then fewer, longer rounds (local SGD with a longer period), at least one an
    epoch. A function of the sizes only, so a fit is the same bits in every run."""
    a, b, c = ROUND_FIXED_S
    fixed = a + b * math.log2(max(workers, 1)) + c * workers
    min_steps = fixed * (1 - COMM_SHARE) / COMM_SHARE / STEP_S
    fit = int(per_epoch // (max(workers, 1) * min_steps))
    return max(1, min(most, fit))


def fit_distributed(
    estimator,
    dataset,
    engine,
    *,
    workers: int | None = None,
    rounds_per_epoch: int | str = "auto",
    merge: str = "auto",
    retries: int = 3,
    progress: bool = True,
    on_round=None,
    cache_mb: float | None = None,
    checkpoint=None,
    checkpoint_rounds: int = 20,
    checkpoint_seconds: float = 300.0,
    resume: Snapshot | None = None,
):
    """Fit a :class:`~bigrate.NeymanPearsonSGD` or :class:`~bigrate.QValueSGD` on the
    shards of ``dataset`` with the workers of ``engine`` (any engine of
    :func:`bigrate.engines.open_engine`). Returns the estimator.

    ``workers``: the number of shares the data is dealt into, one worker task each a
    round (default: the checkpoint's when resuming, else the engine's workers now). The
    model depends on it, not on the workers that run the tasks: task k of a round goes
    to worker slot k modulo the slots there are (the engine's pinned pool), so a worker
    lost, or a resume on another cluster, gives the same model.

    ``rounds_per_epoch``: how often an epoch the workers average their models (at
    least; large data gets more rounds, so a worker-round holds about ``buffer_rows``
    rows a class): "auto" is 4, or fewer when the tasks would be so short that the
    round's fixed cost dominates (:func:`auto_rounds_per_epoch`: many workers on
    small data). The workers' states are combined on the workers along the engine's
    reduction tree (:meth:`~bigrate.engines.base.Pinned.allreduce`): the driver
    receives one merged state a round, in an order fixed by the task indices, so the
    model is the same bits on every engine. ``merge``: where and how the tree is
    combined, "direct" (the default, also "auto": over TCP connections between the
    workers' slots, no scheduler in any hop; the driver makes one call a round, to
    the root's slot, which sends the other slots their parts, passes the round's
    start down the tree and returns the merged state), "workers" (the same tree as the engine's
    own tasks: each hop passes the scheduler, ~7 ms on Dask here), or "driver" (the
    workers' states come to the driver, which combines them in the same order). All
    three give the same bits.

    ``on_round(round_index, engine)`` is called after every round (for monitoring).
    ``cache_mb``: decoded row groups each worker keeps across rounds (default: 25% of
    the smallest worker memory limit, or 1 GiB where workers have none); what does not
    fit is read from storage again every epoch.

    Checkpoints: ``checkpoint(snapshot)`` is called after every ``checkpoint_rounds``
    rounds or ``checkpoint_seconds`` seconds, whichever comes first, and once more with
    the last finished round when the fit is interrupted (KeyboardInterrupt) or a round
    fails; :func:`save_snapshot` writes one. ``resume=`` a :class:`Snapshot` continues
    after its round: the final model is the one an uninterrupted fit with the same seed
    and ``workers`` gives. A lost cluster (:class:`~bigrate.engines.base.ClusterLost`)
    is raised with ``at`` naming the round it was lost at.

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
    plan, st = est.start_stream(ds, history=resume.history if resume else None)
    history = list(est.history_)  # the epochs recorded (the snapshots carry them)
    cfg = plan.cfg
    if workers is None and resume is not None:
        workers = int(resume.schedule["workers"])
    n_w = int(workers) if workers else engine.wait_for_workers(1)
    if cache_mb is None:
        limits = [m or 0 for m in engine.worker_memory_limits()]
        cache_mb = 0.25 * min(limits) / 2**20 if limits and min(limits) > 0 else 1024.0
    units = row_group_units(ds.files(plan.split))
    own_pos = _deal([u for u in units if u[0].cls == "pos"], n_w)
    own_neg = _deal([u for u in units if u[0].cls == "neg"], n_w)
    per_epoch = plan.steps_per_epoch
    # a worker-round holds the rows it samples from in memory: at most about
    # buffer_rows per class, so large data gets more (smaller) rounds an epoch
    max_steps = 2 * plan.buffer_rows
    if rounds_per_epoch == "auto" and resume is not None:
        rounds_per_epoch = int(resume.schedule["rounds_per_epoch"])
    elif rounds_per_epoch == "auto":
        rounds_per_epoch = auto_rounds_per_epoch(per_epoch, n_w)
    elif not isinstance(rounds_per_epoch, int) or rounds_per_epoch < 1:
        raise ValueError(
            f"rounds_per_epoch must be 'auto' or a positive integer, got "
            f"{rounds_per_epoch!r}"
        )
    rounds_per_epoch = max(rounds_per_epoch, math.ceil(per_epoch / (n_w * max_steps)))
    steps = max(1, math.ceil(per_epoch / (n_w * rounds_per_epoch)))
    # rows each class needs per worker-round, then row groups of that class to read
    # for them (a class's rows are reused within a round if they run short)
    per_round = []
    for cls, n_cls in (("pos", plan.n_pos), ("neg", plan.n_neg)):
        if cfg.mode == "pairs":
            share = 1.0
        elif cfg.mode == "uniform":
            share = n_cls / (plan.n_pos + plan.n_neg)
        else:
            share = 0.5
        sizes = [u[0].rows / u[0].row_groups for u in units if u[0].cls == cls]
        rows_per_unit = max(1.0, float(np.mean(sizes))) if sizes else 1.0
        per_round.append(max(1, math.ceil((int(steps * share) + 1) / rows_per_unit)))
    if merge == "auto":
        merge = "direct"
    elif merge not in ("direct", "workers", "driver"):
        raise ValueError(
            f"merge must be 'auto', 'direct', 'workers' or 'driver', got {merge!r}"
        )
    cached = [cached_classes(own_pos[k], own_neg[k], cache_mb) for k in range(n_w)]
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
        "training rounds", total=plan.epochs * rounds_per_epoch, enabled=progress
    )
    schedule = {
        "seed": seed,
        "workers": n_w,
        "rounds_per_epoch": rounds_per_epoch,
        "steps": steps,
        "per_round": per_round,
        "epochs": plan.epochs,
    }
    rnd = 0
    stats, n_tasks, epoch_s = np.zeros(6), 0, 0.0
    if resume is not None:
        if resume.schedule != schedule:
            raise ValueError(
                f"the checkpoint was made with schedule {resume.schedule}, this fit "
                f"has {schedule}: resume with the checkpoint's workers (shares) and "
                "the same parameters (or start the run again)"
            )
        st, rnd = resume.state, resume.round
        stats, n_tasks = resume.epoch_stats.copy(), resume.epoch_tasks
        epoch_s = resume.epoch_seconds
        bar.update(rnd)

    def snapshot() -> Snapshot:
        return Snapshot(st, rnd, stats.copy(), n_tasks, epoch_s, list(history),
                        schedule)  # fmt: skip

    last_ckpt_round, last_ckpt_time = rnd, time.monotonic()
    timing: list = []  # a round's (tasks' wall, merge, slowest task, mean task) seconds
    # worker k's task goes to the same worker process every round, so the row groups
    # it decoded stay in that process's cache (with plain tasks, a task landing on
    # the other worker re-read its row groups there), straight to it (actors)
    pool = engine.pinned()
    start: SGDState | RoundSum | Reduced = st  # what the next round starts from
    try:
        # every slot's process loads the step kernels before the first round
        tw = time.perf_counter()
        warm = pool.run(warm_steps, [(cfg,)] * n_w, what="warm-up")
        warm_s = (time.perf_counter() - tw, max(w["seconds"] for w in warm))
        while rnd < plan.epochs * rounds_per_epoch:
            epoch, r = divmod(rnd, rounds_per_epoch)
            tr = time.perf_counter()
            args, slots = [], []
            for k in range(n_w):
                mine = round_units(
                    own_pos[k], epoch, k, 0, seed, r, per_round[0]
                ) + round_units(own_neg[k], epoch, k, 1, seed, r, per_round[1])
                if not any(u[0].cls == "pos" for u in mine) or not any(
                    u[0].cls == "neg" for u in mine
                ):
                    continue  # a worker with no shard of one class sits this round out
                args.append((RoundTask(
                    ds.ref, ds.manifest_sha256, tuple(mine), cfg, steps,
                    (seed, rnd, k), plan.batch_rows, plan.holdout, cache_mb,
                    plan.shuffle_block, cached[k]),))  # fmt: skip
                slots.append(k)
            if not args:
                raise ValueError(
                    f"{ds.path}: no worker holds row groups of both classes"
                )
            tw = time.perf_counter()
            # the workers combine their results along the engine's tree; the next
            # round's start is broadcast from the root's worker down the same tree
            red = pool.allreduce(
                sgd_task, args, combine_rounds, shared=start, slots=slots, on=merge,
                retries=retries, what=f"round {rnd + 1}",
            )  # fmt: skip
            tm = time.perf_counter()
            total: RoundSum = red.value
            new = total.start()
            timing.append(
                (tm - tw, total.combine_s, total.seconds_max,
                 total.seconds_sum / total.tasks, *(total.parts_sum / total.tasks))
            )  # fmt: skip
            # the round is done: commit it (a KeyboardInterrupt before this line
            # leaves the previous round as the last finished one)
            st, stats, n_tasks = new, stats + total.stats, n_tasks + total.tasks
            start = red if red.handle is not None else total
            epoch_s += time.perf_counter() - tr
            rnd += 1
            bar.update(
                1,
                f"Pfa {stats[2] / max(stats[0], 1):.4f} Pnd "
                f"{stats[5] / max(stats[3], 1):.4f} lambda {st.lam:.4g}",
            )
            if r == rounds_per_epoch - 1:
                rec = est.record_epoch(stats, st, epoch_s, steps * n_tasks)
                history.append(rec)
                stats, n_tasks, epoch_s = np.zeros(6), 0, 0.0
            if on_round is not None:
                on_round(rnd, engine)
            if (
                checkpoint is not None
                and (
                    rnd - last_ckpt_round >= checkpoint_rounds
                    or time.monotonic() - last_ckpt_time >= checkpoint_seconds
                )
                and rnd < plan.epochs * rounds_per_epoch
            ):
                checkpoint(snapshot())
                last_ckpt_round, last_ckpt_time = rnd, time.monotonic()
    except BaseException as e:
        if isinstance(e, ClusterLost) and e.at is None:
            e.at = f"at round {rnd + 1}"
        if checkpoint is not None and rnd > last_ckpt_round:
            checkpoint(snapshot())  # the last finished round, for resume
        raise
    finally:
        pool.close()
    bar.close(f"lambda {st.lam:.4g}")
    engine_info = {
        "name": engine.name,
        "workers": n_w,
        "rounds": rnd,
        "steps_per_round": steps,
        "calls": pool.kind,  # how rounds reached the workers: "actors" or "tasks"
        # where the workers' states were combined (an engine without worker slots,
        # such as the local one, and workers that could not connect to each other
        # combine them here)
        "merge": (
            merge if pool.kind == "actors" and not pool.mesh_refused else "driver"
        ),
        "tasks_rerun": pool.fallbacks,  # tasks run again after a lost worker
        "cache_mb": cache_mb,  # decoded row groups a worker keeps across rounds
        # the warm-up's wall time (making the slots included) and its slowest task
        "warm_s": warm_s[0],
        "warm_task_s": warm_s[1],
        **_round_costs(timing, st),
    }
    est.finish_stream(plan, st, ds, started=t_start, engine=engine_info)
    return est
