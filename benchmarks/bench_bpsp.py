"""BPSP vs grid search for the cost-sensitive SVM (issue: BPSP, Gu et al. 2015 Table 1).

    python benchmarks/bench_bpsp.py [--sets sonar,ionosphere,...] [--costs 2,5,10,ratio]
        [--rows N] [--engine local|ray|dask] [--workers N] [--no-path]

The paper's protocol: 30% of a dataset (stratified; standardised) is the CV set, split
into 5 folds. Validation cost: cost_fn = C(-,+) in {2, 5, 10, class ratio} for a
positive predicted negative, cost_fp = C(+,-) = 1. RBF kernel, gamma "scale". BPSP
(BPSPSearchCV's defaults, see below) searches every (C+, C-) with C+ + C- <= 100: the (lambda,
eta) rectangle with lambda in [0.01, 1] and the (C+, C-) triangle C+ + C- <= 1; the
grid search (the paper's: 20 x 20 in log2 (C+, C-) over [0.01, 100]^2, then 20 x 20
around the best point; scikit-learn's SVC, i.e. libsvm, with class weights) keeps to
the same domain (grid points with C+ + C- > 100 are skipped), on the same folds.
The one-parameter path crossed with a grid (bigrate.model_selection.bpsp.eta_path): exact
paths in eta = C+ / (C+ + C-) at 20 values of C+ + C- log-spaced over [0.02, 100], then
20 within one step of the best, on the same folds.
CV error = cost-weighted errors per CV row. BPSP partitions once per set (a whole fit at
the first cost) and re-scores the other costs on it (``best_for_costs``); each row
reports the whole fit's time (as if run alone) and the re-scoring time. Writes
benchmarks/out/bpsp.json after every row (rows of other datasets / sizes / costs already
there are kept).

``--rows N``: the CV set is a stratified sample of N rows (instead of 30%, or spambase's
200), for the sets of 250-600 CV rows. BPSP runs with BPSPSearchCV's defaults but the
grid's domain (``lambda_min``): the local engine, a thread per core in this process.
``--workers N``: N threads (1: one task after another, as the grid's fits);
``--engine ray`` / ``dask``: an embedded cluster of N (default: all) CPUs on 127.0.0.1,
started and stopped inside the clock, as a fit does. Every row
also reports where the tasks' time went (the compiled walk, the seeding of gaps, the
invariant cells) and the regions per space. ``--no-path`` skips the eta-path column.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SETS = ("sonar", "ionosphere", "heart_statlog", "breast_cancer_wisconsin_original",
        "hill_valley", "ecoli1", "spambase")  # fmt: skip
LAMBDA_MIN = 0.01


def load(name):
    from bigrate import ShardedDataset
    from bigrate.data.prep import run_recipe

    path = HERE / "out" / "shared" / name
    if not (path / "manifest.json").exists():
        run_recipe(name, path, progress=False, overwrite=True)
    ds = ShardedDataset(path)
    parts = [ds.to_csr(s) for s in ds.manifest["splits"]]
    X = np.vstack([p.X.toarray() for p in parts])
    y = np.concatenate([p.y for p in parts]).astype(float)
    return X, y


def cv_set(X, y, seed=0, cap=None, rows=None):
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    size = 0.3 if cap is None else min(0.3, cap / len(y))
    if rows is not None:
        if not 10 <= rows < len(y):
            raise SystemExit(f"--rows must be from 10 to {len(y) - 1}, got {rows}")
        size = rows
    _, Xc, _, yc = train_test_split(X, y, test_size=size, stratify=y, random_state=seed)
    return StandardScaler().fit_transform(Xc), yc


def grid_cv(X, y, folds, gamma, cost_fn, cost_fp):
    """The paper's two-stage grid on the BPSP domain; returns (best error, C+, C-,
    fits)."""
    from sklearn.svm import SVC

    def err(cp, cn):
        total = 0.0
        for tr, te in folds:
            m = SVC(C=1.0, class_weight={1.0: cp, -1.0: cn}, gamma=gamma).fit(
                X[tr], y[tr]
            )
            pred = np.where(m.decision_function(X[te]) > 0, 1.0, -1.0)
            total += (np.where(y[te] > 0, cost_fn, cost_fp) * (pred != y[te])).sum()
        return total / sum(len(te) for _, te in folds)

    def ok(cp, cn):
        return cp + cn <= 1.0 / LAMBDA_MIN

    lo, hi = np.log2(1e-2), np.log2(1.0 / LAMBDA_MIN)
    coarse = np.linspace(lo, hi, 20)
    step = coarse[1] - coarse[0]
    fits, best = 0, (np.inf, None, None)
    for grid in (coarse, None):
        if grid is None:  # fine: 20 x 20 within one coarse step of the best point
            a, b = np.log2(best[1]), np.log2(best[2])
            pts = [(p, q) for p in np.linspace(a - step, a + step, 20)
                   for q in np.linspace(b - step, b + step, 20)]  # fmt: skip
        else:
            pts = [(p, q) for p in grid for q in grid]
        for p, q in pts:
            cp, cn = 2.0**p, 2.0**q
            if not ok(cp, cn):
                continue
            e = err(cp, cn)
            fits += len(folds)
            if e < best[0]:
                best = (e, cp, cn)
    return best[0], best[1], best[2], fits


def warm_up(name):
    """One untimed search on 40 rows of the first set, so that no timed row pays for
    numba's compilation (or its cache load) and the first imports."""
    from sklearn.model_selection import StratifiedKFold

    from bigrate import BPSPSearchCV
    from bigrate.model_selection.bpsp.eta_path import eta_path_cv

    X, y = load(name)
    Xc, yc = cv_set(X, y, cap=40)
    folds = list(StratifiedKFold(2, shuffle=True, random_state=0).split(Xc, yc))
    BPSPSearchCV(gamma=1.0 / Xc.shape[1], cv=folds, engine="local",
                 lambda_min=0.1, progress=False).fit(Xc, yc)  # fmt: skip
    eta_path_cv(Xc, yc, folds, gamma=1.0 / Xc.shape[1], cost_fn=1.0, c_sum=(0.1, 10.0))
    # the gap searches a small search may never need (a cold cache compiled
    # edge_gaps inside a timed spambase 600 task: 8.5 s): one square, the same types
    from bigrate.model_selection.bpsp import _kernels as K
    from bigrate.model_selection.bpsp.partition import CLIP_TOL

    sq = np.array([[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [0.0, 1.0]])
    off = np.array([0, 4], np.int64)
    K.edge_gaps(sq, off, 0.0, 0.0, 1.0, 1.0, 1e-10, 1e-9, CLIP_TOL, 0, 1e-10)
    pts = np.array([0.25, 0.75])
    K.cover_points(pts, pts.copy(), sq, off, np.zeros(2, np.bool_))


def main():
    import argparse

    from sklearn.model_selection import StratifiedKFold

    from bigrate import BPSPSearchCV
    from bigrate.files import atomic_write_text
    from bigrate.kernel.smo import resolve_gamma
    from bigrate.model_selection.bpsp.eta_path import eta_path_cv

    ap = argparse.ArgumentParser(
        description="BPSP against the paper's grid of libsvm fits (see the module's "
        "docstring); writes benchmarks/out/bpsp.json"
    )
    ap.add_argument(
        "--sets", default=",".join(SETS), help="comma-separated shared sets"
    )
    ap.add_argument("--costs", default="2,5,10,ratio", help="cost_fn values, or ratio")
    ap.add_argument("--rows", type=int, default=None, help="CV rows (default: 30%%)")
    ap.add_argument("--engine", choices=("local", "ray", "dask"), default="local")
    ap.add_argument("--workers", type=int, default=None, help="threads / CPUs")
    ap.add_argument("--no-path", action="store_true", help="skip the eta-path column")
    opts = ap.parse_args()
    sets, costs, rows = opts.sets.split(","), opts.costs.split(","), opts.rows
    engine, workers, with_path = opts.engine, opts.workers, not opts.no_path
    path = HERE / "out" / "bpsp.json"
    out = {"lambda_min": LAMBDA_MIN, "results": []}
    warm_up(sets[0])
    for name in sets:
        X, y = load(name)
        Xc, yc = cv_set(X, y, cap=200 if name == "spambase" else None, rows=rows)
        folds = list(StratifiedKFold(5, shuffle=True, random_state=0).split(Xc, yc))
        gamma = resolve_gamma("scale", Xc)
        s = None
        for c in costs:
            cost_fn = (
                float((yc < 0).sum() / (yc > 0).sum()) if c == "ratio" else float(c)
            )
            # the first cost: a whole fit (partition, cells, branch-and-bound, refit);
            # the others re-score that partition (it does not depend on the costs).
            # A row's BPSP time is a whole fit's, as if run alone; the re-scoring time
            # is reported beside it
            if s is None:
                t = time.perf_counter()
                # the estimator's defaults but the grid's domain (lambda_min) and
                # the engine asked for
                s = BPSPSearchCV(gamma=gamma, cv=folds, cost_fn=cost_fn,
                                 engine=engine, n_workers=workers,
                                 lambda_min=LAMBDA_MIN,
                                 progress=False).fit(Xc, yc)  # fmt: skip
                fit_s = time.perf_counter() - t
            t = time.perf_counter()
            best = s.best_for_costs([(cost_fn, 1.0)])[0]
            rescore_s = time.perf_counter() - t
            bpsp_s = fit_s
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g_err, g_cp, g_cn, fits = grid_cv(Xc, yc, folds, gamma, cost_fn, 1.0)
            grid_s = time.perf_counter() - t
            t = time.perf_counter()
            walk = (
                eta_path_cv(
                    Xc,
                    yc,
                    folds,
                    gamma=gamma,
                    cost_fn=cost_fn,
                    c_sum=(0.02, 1.0 / LAMBDA_MIN),
                )  # fmt: skip
                if with_path
                else {"cv_error": None, "pieces": None, "C_pos": None, "C_neg": None}
            )
            path_s = time.perf_counter() - t if with_path else None
            d = s.diagnostics_[gamma]
            per_fold = [f for per in d.values() for f in per]
            # where the tasks' time went, and the regions, per space
            spaces = {
                sp: {k: sum(f[k] for f in d[sp])
                     for k in ("regions", "walk_seconds", "seeding_seconds",
                               "cells_seconds", "seconds", "direct_solves",
                               "corrections", "degenerate_moves", "updated_systems",
                               "pool_misses", "slow_path")}
                | {"pool_mb": max(f["pool_mb"] for f in d[sp])}
                for sp in d
            }  # fmt: skip
            r = {
                "dataset": name, "cv_rows": len(yc), "cost_fn": cost_fn,
                "engine": engine, "workers": workers or os.cpu_count(),
                "spaces": spaces,
                "bpsp_cv_error": best["cv_error"], "bpsp_seconds": bpsp_s,
                "bpsp_rescore_seconds": rescore_s, "bpsp_params": best["params"],
                "bpsp_best_area": best["area"],
                "regions": sum(f["regions"] for f in per_fold),
                "cells": sum(f["invariant_cells"] for f in per_fold),
                "task_seconds": sum(f["seconds"] for f in per_fold),
                "us_per_region": 1e6 * sum(f["seconds"] for f in per_fold)
                / max(sum(f["regions"] for f in per_fold), 1),
                "slow_path_tasks": sum(f["slow_path"] for f in per_fold),
                "direct_solves": sum(f["direct_solves"] for per in d.values()
                                     for f in per),
                "unresolved_area": sum(f["unresolved_area"] for per in d.values()
                                       for f in per),
                "merged_rows": [f["merged_rows"] for f in d["lambda_eta"]],
                "grid_cv_error": g_err, "grid_seconds": grid_s, "grid_fits": fits,
                "grid_params": {"C_pos": g_cp, "C_neg": g_cn},
                "path_cv_error": walk["cv_error"], "path_seconds": path_s,
                "path_pieces": walk["pieces"],
                "path_params": {"C_pos": walk["C_pos"], "C_neg": walk["C_neg"]},
            }  # fmt: skip
            # rows of other (dataset, cost) pairs are kept, read just before writing
            # (a run on other sets may have added some meanwhile)
            if path.exists():
                out["results"] = json.loads(path.read_text()).get("results", [])
            key = (name, len(yc), cost_fn, engine, r["workers"])
            out["results"] = [
                o for o in out["results"]
                if (o["dataset"], o["cv_rows"], o["cost_fn"],
                    o.get("engine", "local"), o.get("workers", 1)) != key
            ] + [r]  # fmt: skip
            print(json.dumps(r), flush=True)
            # after every row, atomically: an interrupted run keeps what it measured
            path.parent.mkdir(exist_ok=True)
            atomic_write_text(path, json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
