"""AUM line-search benchmarks (issue: exact AUM/AUC line search).

    python benchmarks/bench_aum.py

growth:  line-search intersections and seconds of one line search from random weights
         against n for the three variants and for first-min with bracket=True, on
         scikit-learn's bundled digits (class 0 vs the rest, with features repeated with
         noise to reach larger n) and on a9a; fitted log-log slopes.
descent: the paper's Figure 5 measure: mean intersections (and seconds) per gradient
         step over a whole AUMLinearClassifier descent, first-min with and without
         bracket, against n; fitted log-log slopes.
grid:    best validation AUC and total time of AUMLinearClassifier with the first-min line
         search (bracketed, the default, and following the path from 0) vs a 100-point
         grid of step sizes (brute force AUM at each).

Writes benchmarks/out/aum.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _data():
    from sklearn.datasets import load_digits

    from bigrate import ShardedDataset
    from bigrate.data.prep import run_recipe

    d = load_digits()
    X = d.data / 16.0
    y = np.where(d.target == 0, 1, -1)
    rng = np.random.default_rng(0)
    reps = 4  # 7,188 rows: the digits four times with pixel noise
    Xd = np.vstack([X + 0.05 * rng.standard_normal(X.shape) for _ in range(reps)])
    yd = np.tile(y, reps)
    path = HERE / "out" / "shared" / "a9a"
    if not (path / "manifest.json").exists():
        run_recipe("a9a", path, progress=False, overwrite=True)
    tr = ShardedDataset(path).to_csr("train")
    return {"digits": (Xd, yd), "a9a": (tr.X.toarray(), tr.y.astype(int))}


def growth(data) -> dict:
    from bigrate.aum import Breakpoints, aum_gradient, line_search

    res = {}
    rng = np.random.default_rng(1)
    for name, (X, y) in data.items():
        ns = [n for n in (250, 500, 1000, 2000, 4000, 8000) if n <= len(y)]
        rows = {}
        for variant in ("first-min", "first-min bracketed", "linear", "quadratic"):
            bracket = variant.endswith("bracketed")
            ls_variant = variant.split()[0]
            its, secs = [], []
            for n in ns:
                if variant == "quadratic" and n > 2000:
                    break
                idx = rng.choice(len(y), n, replace=False)
                Xs, ys = X[idx], y[idx]
                if len(np.unique(ys)) < 2:
                    continue
                w = rng.standard_normal(X.shape[1]) * 0.1
                pred = Xs @ w
                g = aum_gradient(pred, Breakpoints.binary(ys))
                pd = Xs @ (-(Xs.T @ g))
                line_search(ys, pred, pd, ls_variant, bracket=bracket)  # warm up
                t = time.perf_counter()
                r = line_search(ys, pred, pd, ls_variant, bracket=bracket)
                secs.append(time.perf_counter() - t)
                its.append(max(r.intersections, 1))
            m = len(its)
            slope_it = (
                float(np.polyfit(np.log(ns[:m]), np.log(its), 1)[0]) if m > 1 else None
            )
            slope_t = (
                float(np.polyfit(np.log(ns[:m]), np.log(secs), 1)[0]) if m > 1 else None
            )
            rows[variant] = {
                "n": ns[:m],
                "intersections": its,
                "seconds": secs,
                "loglog_slope_intersections": slope_it,
                "loglog_slope_seconds": slope_t,
            }
            print(name, variant, rows[variant], flush=True)
        res[name] = rows
    return res


def descent(data) -> dict:
    """Mean intersections and seconds per gradient step over whole descents."""
    from bigrate.aum import AUMLinearClassifier

    res = {}
    rng = np.random.default_rng(2)
    for name, (X, y) in data.items():
        rows = {}
        for bracket in (True, False):
            ns = [n for n in (250, 500, 1000, 2000, 4000, 8000) if n <= len(y)]
            if not bracket:
                ns = [n for n in ns if n <= 4000]  # up to n^2 / 2 crossings per step
            its, secs = [], []
            for n in ns:
                idx = rng.choice(len(y), n, replace=False)
                t = time.perf_counter()
                clf = AUMLinearClassifier(
                    bracket=bracket, max_iter=100, random_state=0
                ).fit(X[idx], y[idx])
                secs.append((time.perf_counter() - t) / clf.n_iter_)
                its.append(
                    max(np.mean([h["line_search_iterations"] for h in clf.history_]), 1)
                )
            key = "first-min bracketed" if bracket else "first-min"
            rows[key] = {
                "n": ns,
                "mean_intersections_per_step": its,
                "seconds_per_step": secs,
                "loglog_slope_intersections": float(
                    np.polyfit(np.log(ns), np.log(its), 1)[0]
                ),
                "loglog_slope_seconds": float(
                    np.polyfit(np.log(ns), np.log(secs), 1)[0]
                ),
            }
            print(name, key, rows[key], flush=True)
        res[name] = rows
    return res


def grid_vs_line_search(data) -> dict:
    from bigrate.aum import AUMLinearClassifier

    res = {}
    for name, (X, y) in data.items():
        row = {}
        for key, ls, bracket in (
            ("first-min bracketed", "first-min", True),
            ("first-min", "first-min", False),
            ("grid", "grid", False),
        ):
            t = time.perf_counter()
            clf = AUMLinearClassifier(
                line_search=ls, bracket=bracket, max_iter=30, validation=0.25,
                random_state=0,
            ).fit(X, y)  # fmt: skip
            row[key] = {
                "seconds": time.perf_counter() - t,
                "best_validation_auc": clf.best_validation_auc_,
                "steps": clf.n_iter_,
            }
        for key in ("first-min bracketed", "first-min"):
            row[f"speedup {key} vs grid"] = row["grid"]["seconds"] / row[key]["seconds"]
        res[name] = row
        print(name, row, flush=True)
    return res


def main() -> None:
    out = HERE / "out"
    out.mkdir(parents=True, exist_ok=True)
    data = _data()
    res = {
        "growth": growth(data),
        "descent": descent(data),
        "grid": grid_vs_line_search(data),
    }
    from bigrate.files import atomic_write_text

    atomic_write_text(out / "aum.json", json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
