"""BPSPSearchCV: the exact cost-weighted K-fold CV error of the cost-sensitive SVM over
every (C+, C-) (Gu et al. 2015), one engine task per (gamma, space, fold). A task
returns its fold's invariant cells (convex polygons with their counts of false
negatives and false positives: they do not depend on the misclassification costs);
the best point for any costs is found by branch-and-bound over the folds' cells
(:func:`_kernels.best_point`), and the full CV-error map is built by GEOS only when
asked for (:meth:`BPSPSearchCV.cv_error_map`, ``run_dir``, ``plot``)."""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import shapely
import shapely.geometry
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data
from threadpoolctl import threadpool_limits

from bigrate.base import RateClassifierMixin
from bigrate.engines import open_engine
from bigrate.model_selection.bpsp import _kernels as _k
from bigrate.model_selection.bpsp.geometry import (
    REPAIR_GRIDS,
    dissolve,
    parts,
    stack_polygons,
    superpose,
)
from bigrate.model_selection.bpsp.partition import (
    SPACES,
    Diagnostics,
    Partitioner,
    Rings,
    merge_duplicates,
)

# pieces of the folds' superposition smaller than this (in the space's units) are
# not candidates for the best point: the strips of width CLIP_TOL along which
# neighbouring regions meet, and optima too thin for an inexact solver to hit
PIECE_TOL = 1e-11

# ---------------------------------------------------------------- the estimator


@dataclass
class BPSPPlan:
    """The tasks of one search (see :meth:`BPSPSearchCV.plan`): the data, the folds,
    the gamma values and spaces, ``tasks`` = [(gamma index, space, fold)] and the
    parameters common to every task."""

    X: np.ndarray
    y: np.ndarray
    data: tuple  # (X, y as +1 / -1): what the tasks read, put on the engine once
    splits: list
    gammas: list
    spaces: list
    tasks: list
    base: dict

    def task_args(self, data, j: int) -> tuple:
        g, sp, k = self.tasks[j]
        train, test = self.splits[k]
        return (data, train, test, {**self.base, "gamma": self.gammas[g], "space": sp})

    def describe(self, j: int) -> str:
        g, sp, k = self.tasks[j]
        return f"(gamma={self.gammas[g]:g}, {sp}, fold {k})"


class LongestFirst:
    """The order a search's tasks start in on the local engine's threads: at each
    free thread, a task of the (gamma, space) whose tasks are expected to take
    longest (longest processing time first, so the last round does not leave a
    thread idle behind one long task). Expected: the mean time of its finished tasks;
    with none finished, at least as long as its running ones have taken so far; with
    none started, first (to learn it). The spaces differ by set (breast cancer 450:
    the (C+, C-) triangle's tasks 3.4 s, the rectangle's 1.4 s; spambase: the
    rectangle's the longer), so no fixed order serves. ``clock``: seconds."""

    def __init__(self, tasks, clock=time.perf_counter):
        self.clock = clock
        self.todo: dict = {}
        for j, (g, sp, _) in enumerate(tasks):
            self.todo.setdefault((g, sp), deque()).append(j)
        self.took = {key: [] for key in self.todo}
        self.running: dict = {}  # task -> (group, start)

    def _expected(self, key, now):
        """(seconds, 1 where that is only a lower bound): a bound wins a tie."""
        if self.took[key]:
            return sum(self.took[key]) / len(self.took[key]), 0
        ran = [now - t0 for k, t0 in self.running.values() if k == key]
        return (max(ran) if ran else float("inf")), 1

    def next(self):
        """The next task's index, or None when every task has started."""
        now = self.clock()
        left = [key for key, q in self.todo.items() if q]
        if not left:
            return None
        key = max(left, key=lambda k: self._expected(k, now))  # the first on ties
        j = self.todo[key].popleft()
        self.running[j] = (key, now)
        return j

    def finished(self, j):
        key, t0 = self.running.pop(j)
        self.took[key].append(self.clock() - t0)


class EarlyBest:
    """The branch-and-bound of a (gamma, space) for a fit's costs, started on a
    thread of its own as soon as its last fold's task is in (:meth:`add`), while
    the other tasks run: it waited for every task before, one space after the other
    (hill-valley, 364 CV rows: 3.5 s for the (C+, C-) triangle, whose ~1,400 cells a
    fold meet at the origin, and 0.7 s for the rectangle, after 28 s of tasks on 2
    threads). :meth:`results` waits for them: {(gamma, space): what
    :func:`_best_of_space` gave}, one that failed left out (the fit runs it again,
    to raise there); :meth:`shutdown` ends the thread (after a failed task: without
    waiting for a branch-and-bound under way)."""

    def __init__(self, plan, cost_fn, cost_fp, lambda_min):
        from concurrent.futures import ThreadPoolExecutor

        self.plan, self.costs, self.lambda_min = plan, (cost_fn, cost_fp), lambda_min
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bpsp-best")
        self.running = {}

    def add(self, task, results):
        """``task`` = (g, space, k) is in ``results``: start its (gamma, space)'s
        branch-and-bound if every fold's is."""
        g, sp, _ = task
        gamma = self.plan.gammas[g]
        folds = [results.get((g, sp, k)) for k in range(len(self.plan.splits))]
        if any(f is None for f in folds) or (gamma, sp) in self.running:
            return
        bounds = SPACES[sp].domain(self.lambda_min).bounds
        self.running[(gamma, sp)] = self.pool.submit(
            _best_of_space, folds, *self.costs, bounds, f"gamma={gamma:g}, {sp}"
        )

    def results(self):
        done = {}
        for key, fut in self.running.items():
            try:
                done[key] = fut.result()
            except Exception:  # noqa: BLE001 (the fit's own call raises it)
                continue
        return done

    def shutdown(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


# the walk's ring buffers each thread of this process keeps from task to task, where
# a task's params ask for it (``reuse_rings``: the local engine's threads, within a
# fit or a job, which drop them at their end: :func:`release_rings`)
_RINGS = threading.local()


def release_rings():
    """Drop the ring buffers this thread kept (:class:`Rings`); a thread's own go
    with it when it ends."""
    _RINGS.__dict__.pop("rings", None)


def fold_cells(data, train, test, params):
    """One task of the search: the partition on the training rows and its invariant
    cells on the test rows, as arrays (plain data: ``vert``, ``off``, ``fn``, ``fp``
    and ``diagnostics``). ``params["reuse_rings"]``: its walk's rings are the
    buffers this thread kept from its last task (:class:`Rings`), kept for its
    next."""
    # one BLAS thread: the solves here are of n_M ~ 100 rows, where OpenBLAS's
    # threads cost more in hand-offs than they gain, and the engine runs one task
    # per core (more threads would fight over them)
    with threadpool_limits(1, user_api="blas"):
        return _fold_cells(data, train, test, params)


def _fold_cells(data, train, test, params):
    import time

    X, y = data
    t0 = time.perf_counter()
    Xt, yt, weight = merge_duplicates(X[train], y[train])
    part = Partitioner(
        Xt, yt, kernel=params["kernel"], gamma=params["gamma"],
        coef0=params["coef0"], degree=params["degree"],
        lambda_min=params["lambda_min"], max_regions=params["max_regions"],
        method=params["method"], space=params["space"], weight=weight,
    )  # fmt: skip
    if params.get("reuse_rings"):
        part.rings = _RINGS.__dict__.setdefault("rings", Rings())
    from bigrate.kernel.smo import cross_kernel

    Kv = cross_kernel(X[test], Xt, params["kernel"], params["gamma"],
                      params["coef0"], params["degree"])  # fmt: skip
    cells = part.run_cells(Kv, y[test])
    seconds = time.perf_counter() - t0
    return {
        **cells,
        "diagnostics": {**part.diag.as_dict(),
                        "merged_rows": int(len(train) - len(yt)),
                        "invariant_cells": len(cells["fn"]),
                        "seconds": seconds,
                        "us_per_region": 1e6 * seconds / max(part.diag.regions, 1)},
    }  # fmt: skip


def _check_cells(f, where):
    """The arrays of one fold's cells, checked before a compiled kernel indexes with
    them (they may come from a saved model): vert (V, 2) finite, off from 0 to V
    without a step back, fn and fp one count >= 0 per cell."""
    vert, off = np.asarray(f["vert"]), np.asarray(f["off"])
    fn, fp = np.asarray(f["fn"]), np.asarray(f["fp"])
    problem = None
    if vert.ndim != 2 or vert.shape[1:] != (2,) or not np.isfinite(vert).all():
        problem = f"vert must be a finite (V, 2) array, got shape {vert.shape}"
    elif off.ndim != 1 or len(off) < 1 or off[0] != 0 or off[-1] != len(vert):
        problem = f"off must run from 0 to len(vert) = {len(vert)}"
    elif (np.diff(off) < 3).any():
        problem = "off must give every cell at least 3 vertices"
    elif fn.shape != (len(off) - 1,) or fp.shape != fn.shape:
        problem = f"fn and fp must hold one count per cell ({len(off) - 1})"
    elif (fn < 0).any() or (fp < 0).any():
        problem = "fn and fp must be counts >= 0"
    if problem:
        raise ValueError(f"BPSP cells of {where}: {problem}")


def _best_of_space(folds, cost_fn, cost_fp, bounds, where="a fold"):
    """Branch-and-bound over the folds' cells of one (gamma, space): (least summed
    error, FN, FP, vertices of the largest piece with it, intersections tried)."""
    for k, f in enumerate(folds):
        _check_cells(f, f"{where}, fold {k}")
    vert, off = stack_polygons([f["vert"] for f in folds], [f["off"] for f in folds])
    start = np.cumsum([0] + [len(f["fn"]) for f in folds]).astype(np.int64)
    return _k.best_point(
        vert, off, start,
        np.concatenate([f["fn"] for f in folds]).astype(np.int64),
        np.concatenate([f["fp"] for f in folds]).astype(np.int64),
        float(cost_fn), float(cost_fp), np.asarray(bounds, float), PIECE_TOL,
    )  # fmt: skip


class BPSPSearchCV(RateClassifierMixin, BaseEstimator):
    """Exact K-fold cross-validation of the cost-sensitive SVM over every (C+, C-)
    with C+ + C- >= 1 / lambda_max (Gu et al. 2015): the (lambda, eta) rectangle
    [lambda_min, 1] x [0, 1] (lambda = 1 / (C+ + C-), eta = C+ / (C+ + C-)) is
    partitioned into the critical regions of each training fold, each refined by the
    sign pattern on its validation fold; superposing the folds gives the CV error of
    every parameter pair as polygons, and the centre of the best one is returned.

    Parameters
    ----------
    kernel, gamma, coef0, degree : as CostSensitiveSVC; ``gamma`` may be a list (one
        partition per value).
    cv : int >= 2 or an iterable of (train, test) index arrays
    cost_fn, cost_fp : float > 0
        Validation cost of a positive predicted negative / a negative predicted
        positive (the paper's C(-,+) and C(+,-)).
    engine : {"local", "ray", "dask"}; address: an existing cluster. One task per
        (gamma, space, fold). "local" (the default) runs them in this process on
        ``n_workers`` threads: the partitions are compiled code that releases the GIL,
        so on one machine this needs no processes started, no imports in them and no
        copies of the data (on breast cancer's 300 CV rows, 2 cores: 5.9 s against
        8.9 s on an embedded Dask cluster and 12.8 s on embedded Ray, most of which is
        starting and stopping it). "ray" / "dask" without an address start an embedded
        cluster of ``n_workers`` CPUs on 127.0.0.1; with one, the data go to its object
        store once and the tasks run on its workers.
    n_workers : int >= 1 or None
        Threads of the local engine, or CPUs of an embedded cluster; None: one per
        core. Ignored with an address.
    lambda_min : float in (0, 1)
        Smallest lambda (largest C+ + C- = 1 / lambda_min) searched.
    max_regions : int
        Per fold, gamma and space: stop with an error beyond this many regions. The
        default is 500,000 (spambase's 300 CV rows make ~43,000 regions a fold and
        space, 600 rows up to ~182,000; regions grow faster than the rows); a region
        holds its partition (a byte per training row), its polygon and its invariant
        cells (~0.2 KB). Each task also keeps its walk's ring of recent
        regions' systems: 32 MB, grown 4x at a time up to 1 GiB where the walk
        reaches back most of it for its parents' systems (128 MB on spambase's 450 CV
        rows, 512 MB on its 600). The local engine's threads keep the rings' buffers from task to
        task until the fit ends (new memory is zeroed page by page), so a fit can
        hold up to 1.7 GiB per thread where a ring reaches 1 GiB (the buffers of
        each size it grew through).
    run_dir : path or None
        Where the partition is saved (``bpsp_partition.json``, GeoJSON-like, and the
        CV-error map ``bpsp_cv_error.png``).
    method : {"neighbours", "theorem2"}
        "theorem2": Algorithm 1 with Theorem 2's pieces (each critical region met in
        several pieces). "neighbours": each critical region once, whole, reached from
        its neighbours (Theorem 3), gaps seeded by direct solves and overlaps given to
        the earlier region (about 4x fewer regions, 2x faster). Both partition the
        rectangle exactly.

    spaces : list of {"lambda_eta", "c_pos_c_neg"}
        The (lambda, eta) rectangle (C+ + C- from 1 to 1 / lambda_min) and the (C+, C-)
        lower triangle (C+ + C- <= 1); both by default: all of C+ + C- <= 1/lambda_min.

    Attributes
    ----------
    best_params_ (gamma, space, lambda, eta, C_pos, C_neg: the centroid of the
    largest convex piece of the superposed folds with the least CV error),
    best_region_area_ (that piece's area, in its space's coordinates), cv_error_
    (cost-weighted errors per validation row), cells_ (per gamma and space, per fold:
    the invariant cells as arrays ``vert``, ``off``, ``fn``, ``fp``), diagnostics_
    (per gamma and space, per fold), best_estimator_ (CostSensitiveSVC refitted on all
    rows). :meth:`best_for_costs` scores other costs on the same cells without a new
    partition; :meth:`cv_error_map` builds the map of equal-error polygons.
    """

    _job_fit = "search"
    _job_data = "dense"
    _job_kinds = ("train", "evaluate")
    _accepts_sparse = False  # the partition works on a dense kernel matrix

    _parameter_constraints: dict = {
        "kernel": [StrOptions({"linear", "rbf", "poly"})],
        "gamma": "no_validation",
        "coef0": [Real],
        "degree": [Interval(Integral, 1, None, closed="left")],
        "cv": "no_validation",
        "cost_fn": [Interval(Real, 0, None, closed="neither")],
        "cost_fp": [Interval(Real, 0, None, closed="neither")],
        "engine": [StrOptions({"ray", "dask", "local"})],
        "address": [str, None],
        "n_workers": [Interval(Integral, 1, None, closed="left"), None],
        "lambda_min": [Interval(Real, 0, 1, closed="neither")],
        "max_regions": [Interval(Integral, 1, None, closed="left")],
        "run_dir": "no_validation",
        "random_state": ["random_state"],
        "progress": ["boolean"],
        "method": [StrOptions({"neighbours", "theorem2"})],
        "spaces": "no_validation",
    }

    def __init__(self, *, kernel="rbf", gamma="scale", coef0=0.0, degree=3, cv=5,
                 cost_fn=1.0, cost_fp=1.0, engine="local", address=None,
                 n_workers=None, lambda_min=1e-3, max_regions=500_000, run_dir=None, random_state=0,
                 progress=True, method="neighbours",
                 spaces=("lambda_eta", "c_pos_c_neg")):  # fmt: skip
        self.kernel = kernel
        self.gamma = gamma
        self.coef0 = coef0
        self.degree = degree
        self.cv = cv
        self.cost_fn = cost_fn
        self.cost_fp = cost_fp
        self.engine = engine
        self.address = address
        self.n_workers = n_workers
        self.lambda_min = lambda_min
        self.max_regions = max_regions
        self.run_dir = run_dir
        self.random_state = random_state
        self.progress = progress
        self.method = method
        self.spaces = spaces

    def _splits(self, X, y):
        from bigrate.model_selection.sweep import cv_splits

        return cv_splits(self.cv, y, self.random_state, fraction=False, min_folds=2)

    def _gammas(self, X):
        from bigrate.kernel.smo import resolve_gamma

        raw = self.gamma if isinstance(self.gamma, (list, tuple)) else [self.gamma]
        out = []
        for g in raw:
            if isinstance(g, str) and g in ("scale", "auto"):
                out.append(resolve_gamma(g, X))
            elif isinstance(g, Real) and g > 0:
                out.append(float(g))
            else:
                raise ValueError(
                    f"gamma must be a float > 0, 'scale', 'auto' or a list of them; "
                    f"got {g!r}"
                )
        return out

    def plan(self, X, y) -> BPSPPlan:
        """Validate the parameters and the data and list the search's tasks, one per
        (gamma, space, fold): :meth:`fit` runs them on its engine, the job runner on
        the job's (saving each as it finishes). ``plan.task_args(data, j)`` is task j's
        argument tuple for :func:`fold_cells` given ``data``, the handle of ``(X, y)``
        on the engine (``plan.data``); :meth:`assemble` takes the results."""
        from bigrate.base import binary_classes

        self._validate_params()
        X, y = validate_data(self, X, y, dtype=np.float64)
        yy = binary_classes(self, y).astype(float)
        splits = self._splits(X, yy)
        gammas = self._gammas(X)
        bad = [sp for sp in self.spaces if sp not in SPACES] or not len(self.spaces)
        if bad:
            raise ValueError(
                f"spaces must be a non-empty list of {sorted(SPACES)}, got "
                f"{self.spaces!r}"
            )
        base = {"kernel": self.kernel, "coef0": float(self.coef0),
                "degree": int(self.degree), "lambda_min": float(self.lambda_min),
                "max_regions": int(self.max_regions), "cost_fn": float(self.cost_fn),
                "cost_fp": float(self.cost_fp), "method": self.method}  # fmt: skip
        spaces = list(dict.fromkeys(self.spaces))
        tasks = [(g, sp, k) for g in range(len(gammas)) for sp in spaces
                 for k in range(len(splits))]  # fmt: skip
        return BPSPPlan(X, y, (X, yy), splits, gammas, spaces, tasks, base)

    def fit(self, X, y):
        from bigrate.progress import Progress

        plan = self.plan(X, y)
        bar = Progress("BPSP folds", total=len(plan.tasks), enabled=self.progress)
        results = {}
        early = EarlyBest(plan, self.cost_fn, self.cost_fp, self.lambda_min)
        with self._open_engine() as eng, threadpool_limits(1, user_api="blas"):
            # one BLAS thread in this process too (what each task sets for itself):
            # the local engine's threads would otherwise undo each other's limit
            handle = eng.put(plan.data)
            # threads of this process keep their rings' memory from task to task
            plan.base["reuse_rings"] = eng.name == "local"
            try:
                for j, res in self._run_tasks(eng, plan, handle):
                    if isinstance(res, Exception):
                        raise RuntimeError(
                            f"BPSP task {plan.describe(j)} failed: {res}"
                        ) from res
                    results[plan.tasks[j]] = res
                    early.add(plan.tasks[j], results)
                    bar.update(1)
                known = early.results()
            finally:
                release_rings()  # one thread: the tasks ran on this one
                early.shutdown()
        bar.close()
        return self.assemble(plan, results, known)

    @staticmethod
    def _run_tasks(eng, plan, handle):
        """(task index, result) as the tasks finish. On the local engine's threads
        they start longest first as their times are learnt (:class:`LongestFirst`);
        a cluster's scheduler gets them all at once (its workers may come and go)."""
        if eng.name != "local":
            args = [plan.task_args(handle, j) for j in range(len(plan.tasks))]
            yield from eng.map(fold_cells, args, what="BPSP tasks")
            return
        order = LongestFirst(plan.tasks)

        def next_task():
            j = order.next()
            return None if j is None else (j, plan.task_args(handle, j))

        for j, res in eng.map_dynamic(fold_cells, next_task, in_flight=eng.n_workers,
                                      retries=0, what="BPSP tasks"):  # fmt: skip
            order.finished(j)
            yield j, res

    def _open_engine(self):
        import os

        workers = self.n_workers or os.cpu_count() or 1
        if self.engine == "local":  # open_engine refuses an address for it
            return open_engine("local", self.address, threads=workers)
        if self.address:
            return open_engine(self.engine, self.address)
        return open_engine(self.engine, n_workers=workers, dashboard=False)

    def assemble(self, plan: BPSPPlan, results: dict, known=None):
        """Finish the fit from every task's result (``results[(g, space, k)]``, what
        :func:`fold_cells` returned): the folds' cells, the best point and the
        CostSensitiveSVC refitted there on all rows (``known``: the branch-and-bounds
        of the fitted costs already run, by (gamma, space): :class:`EarlyBest`).
        Returns self."""
        from bigrate.kernel.svc import CostSensitiveSVC

        splits, gammas, spaces = plan.splits, plan.gammas, plan.spaces
        self.n_val_ = int(sum(len(te) for _, te in splits))
        self.cells_, self.diagnostics_ = {}, {}
        for g, gamma in enumerate(gammas):
            self.cells_[gamma], self.diagnostics_[gamma] = {}, {}
            for sp in spaces:
                folds = [results[(g, sp, k)] for k in range(len(splits))]
                self.cells_[gamma][sp] = [
                    {key: f[key] for key in ("vert", "off", "fn", "fp")} for f in folds
                ]
                self.diagnostics_[gamma][sp] = [f["diagnostics"] for f in folds]
        best = self.best_for_costs([(self.cost_fn, self.cost_fp)], known)[0]
        self.cv_error_ = best["cv_error"]
        self.best_params_ = best["params"]
        self.best_region_area_ = best["area"]
        c_pos, c_neg = self.best_params_["C_pos"], self.best_params_["C_neg"]
        self.best_estimator_ = CostSensitiveSVC(
            C_pos=max(c_pos, 1e-12), C_neg=max(c_neg, 1e-12),
            kernel=self.kernel, gamma=self.best_params_["gamma"], coef0=self.coef0,
            degree=self.degree,
        ).fit(plan.X, plan.y)  # fmt: skip
        if self.run_dir is not None:
            self._save()
        return self

    def best_for_costs(self, costs, _known=None):
        """The best point of the fitted partition for other misclassification costs,
        without partitioning again (the partition and the invariant cells do not
        depend on them). ``costs``: [(cost_fn, cost_fp), ...]. Returns, per pair,
        {"cost_fn", "cost_fp", "cv_error", "params" (as best_params_), "area" (of the
        largest piece with that error), "intersections" (tried by the
        branch-and-bound)}; no refit. ``_known``: {(gamma, space): what
        :func:`_best_of_space` gave for the first pair}, from the fit."""
        check_is_fitted(self, "cells_")
        out = []
        for cost_fn, cost_fp in costs:
            if not (float(cost_fn) > 0 and float(cost_fp) > 0):
                raise ValueError(
                    f"costs must be pairs (cost_fn, cost_fp) of floats > 0, got "
                    f"({cost_fn!r}, {cost_fp!r})"
                )
            best, tried = None, 0
            for gamma, per in self.cells_.items():
                for sp, folds in per.items():
                    bounds = SPACES[sp].domain(self.lambda_min).bounds
                    if _known is not None and (gamma, sp) in _known:
                        err, _, _, piece, n = _known[(gamma, sp)]
                    else:
                        err, _, _, piece, n = _best_of_space(
                            folds, cost_fn, cost_fp, bounds, f"gamma={gamma:g}, {sp}"
                        )
                    tried += int(n)
                    if len(piece) and (best is None or err < best[0]):
                        best = (err, gamma, sp, piece)
            _known = None  # for the first pair only
            if best is None:
                raise RuntimeError(
                    "BPSP found no piece of positive area common to every fold's "
                    "cells: see diagnostics_ for unresolved area"
                )
            err, gamma, sp, piece = best
            cx, cy = _k.centroid(piece)
            c_pos, c_neg = SPACES[sp].costs(cx, cy)
            out.append({
                "cost_fn": float(cost_fn), "cost_fp": float(cost_fp),
                "cv_error": float(err) / self.n_val_,
                "params": {"gamma": gamma, "space": sp, "lambda": 1 / (c_pos + c_neg),
                           "eta": c_pos / (c_pos + c_neg), "C_pos": c_pos,
                           "C_neg": c_neg},
                "area": float(_k.area(piece)), "intersections": tried,
            })  # fmt: skip
        return out

    def cv_error_map(self, cost_fn=None, cost_fp=None):
        """The exact CV-error map: per gamma and space, [{"cv_error", "geometry"}]
        (GeoJSON-like polygons of equal error in that space's coordinates, least
        error first), from the folds' cells superposed by GEOS on a 1e-12 grid; the
        fitted costs unless others are given."""
        check_is_fitted(self, "cells_")
        cost_fn = self.cost_fn if cost_fn is None else cost_fn
        cost_fp = self.cost_fp if cost_fp is None else cost_fp
        out = {}
        for gamma, per in self.cells_.items():
            out[gamma] = {}
            for sp, folds in per.items():
                fix = Diagnostics()
                maps = []
                for f in folds:
                    err = cost_fn * np.asarray(f["fn"]) + cost_fp * np.asarray(f["fp"])
                    off = f["off"]
                    polys = [shapely.Polygon(f["vert"][off[c] : off[c + 1]])
                             for c in range(len(err))]  # fmt: skip
                    maps.append(dissolve(zip(err.tolist(), polys, strict=True), fix))
                total = superpose(maps, fix)
                if fix.geometry_repairs:
                    warnings.warn(
                        f"gamma={gamma:g}, {sp}: {fix.geometry_repairs} overlays of "
                        f"the fold superposition were repaired on a grid of "
                        f"{REPAIR_GRIDS[-1]:g} or finer (GEOS topology errors)",
                        stacklevel=2,
                    )
                cells = sorted(((v / self.n_val_, geom) for v, geom in total.items()),
                               key=lambda t: t[0])  # fmt: skip
                out[gamma][sp] = [
                    {"cv_error": e, "geometry": shapely.geometry.mapping(geom)}
                    for e, geom in cells
                ]
        return out

    def decision_function(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.decision_function(X)

    def predict(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)

    def plot(self, path, gamma=None, cv_map=None):
        """The CV-error map as PNG: the (lambda, eta) rectangle, and every searched
        space over (log2 C+, log2 C-) (edges densified before the change of
        coordinates, which bends them)."""
        from matplotlib.collections import PolyCollection

        from bigrate._plot import pyplot, save_png

        gamma = self.best_params_["gamma"] if gamma is None else gamma
        cv_map = self.cv_error_map() if cv_map is None else cv_map
        fig, axes = pyplot().subplots(1, 2, figsize=(10, 4))
        for ax, log_c in zip(axes, (False, True), strict=True):
            polys, vals = [], []
            for sp, cells in cv_map[gamma].items():
                if not log_c and sp != "lambda_eta":
                    continue
                for c in cells:
                    geom = shapely.geometry.shape(c["geometry"])
                    for part in parts(geom):
                        xy = np.array(shapely.segmentize(part, 0.01).exterior.coords)
                        if log_c:
                            xy = np.clip(xy, 1e-4, None)
                            if sp == "lambda_eta":
                                eta = np.clip(xy[:, 1], 1e-4, 1 - 1e-4)
                                xy = np.c_[eta / xy[:, 0], (1 - eta) / xy[:, 0]]
                            xy = np.log2(xy)
                        polys.append(xy)
                        vals.append(c["cv_error"])
            if not polys:
                ax.set_axis_off()
                continue
            pc = PolyCollection(polys, array=np.array(vals), cmap="viridis",
                                edgecolors="none")  # fmt: skip
            ax.add_collection(pc)
            ax.autoscale()
            bp = self.best_params_
            best = ((np.log2(max(bp["C_pos"], 1e-4)), np.log2(max(bp["C_neg"], 1e-4)))
                    if log_c else (bp["lambda"], bp["eta"]))  # fmt: skip
            ax.plot(*best, "r*", ms=12)
            ax.set_xlabel("log2 C+" if log_c else "lambda = 1 / (C+ + C-)")
            ax.set_ylabel("log2 C-" if log_c else "eta = C+ / (C+ + C-)")
            fig.colorbar(pc, ax=ax, label="CV error")
        fig.suptitle(f"BPSP CV error (gamma {gamma:.4g}), best {self.cv_error_:.4f}")
        return save_png(fig, path)

    def _save(self):
        import json
        from pathlib import Path

        from bigrate.files import atomic_write_text

        cv_map = self.cv_error_map()
        out = {
            "best_params": self.best_params_,
            "cv_error": self.cv_error_,
            "best_region_area": self.best_region_area_,
            "partition": [
                {"gamma": g, "space": sp, "cells": cells}
                for g, per in cv_map.items()
                for sp, cells in per.items()
            ],
            "diagnostics": [
                {"gamma": g, "space": sp, "folds": d}
                for g, per in self.diagnostics_.items()
                for sp, d in per.items()
            ],
        }
        path = Path(self.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / "bpsp_partition.json", json.dumps(out) + "\n")
        self.plot(path / "bpsp_cv_error.png", cv_map=cv_map)
