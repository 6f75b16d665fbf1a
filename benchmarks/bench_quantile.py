"""Quantile-SVM path benchmark (issue: the entire quantile path, DPF).

    python benchmarks/bench_quantile.py [--quick]

For spambase (standardised, subsamples up to all 4,601 rows), a synthetic set of
n = 10,000 (20 Gaussian features, noisy linear labels) and a9a subsamples: number of kinks
against n log n, path time, the time to recover one tau, and the mean time of one
scikit-learn LinearSVC solve with the matching class weights (tau in 0.1, 0.5, 0.9), in
the same run, kinks per second and the share of a full scan of the rows read per
kink (``scan_share``: candidate lists and their rebuilds). Ratios: path / LinearSVC (the paper's Python DPF: 2,800x-3,600x LIBLINEAR)
and LinearSVC / recovery (goal >= 20). a9a and synthetic fits run in a subprocess with a
time limit: a9a's one-hot ties can stall the path (see BENCHMARKS.md).

Every timing follows a fit of 100 rows in the same process (compiled kernels loaded).
Writes benchmarks/out/quantile.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SHARED = HERE.parent.parent / "shared" / "data"


def spambase():
    from sklearn.preprocessing import StandardScaler

    D = np.loadtxt(SHARED / "spambase" / "spambase.tsv.gz", delimiter="\t", skiprows=1)
    return StandardScaler().fit_transform(D[:, :-1]), np.where(D[:, -1] > 0, 1, -1)


def synthetic(n=10_000, d=20, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w = rng.standard_normal(d)
    y = np.where(X @ w + 2.0 * rng.standard_normal(n) > 0, 1, -1)
    return X, y


def a9a():
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(SHARED / "a9a" / "a9a.bz2"), n_features=123)
    return X, y.astype(int)


def measure(X, y, alpha):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import LinearSVC

    from bigrate import QuantilePathSVC

    # load the compiled kernels first (numba's cache, ~0.2 s once a process): the
    # path is timed, not the import; LinearSVC's first solve likewise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        QuantilePathSVC(alpha=alpha).fit(X[:100], y[:100])
        LinearSVC(loss="hinge", dual=True).fit(X[:100], y[:100])

    n = X.shape[0]
    t = time.perf_counter()
    path = QuantilePathSVC(alpha=alpha).fit(X, y)
    t_path = time.perf_counter() - t
    t = time.perf_counter()
    for tau in (0.1, 0.5, 0.9):
        path.coef_at(tau)
    t_rec = (time.perf_counter() - t) / 3
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for tau in (0.1, 0.5, 0.9):
            LinearSVC(
                C=1.0 / (n * alpha),
                class_weight={1: 2 * (1 - tau), -1: 2 * tau},
                loss="hinge",
                dual=True,
                tol=1e-4,
                max_iter=100_000,
            ).fit(X, y)
    t_svc = (time.perf_counter() - t) / 3
    dg = path.diagnostics_
    return {
        "max_rel_duality_gap": duality_gap(path),
        "n": n,
        "alpha": alpha,
        "kinks": path.n_kinks_,
        "n_log_n": n * np.log(n),
        "kinks_over_nlogn": path.n_kinks_ / (n * np.log(n)),
        "path_s": t_path,
        "recover_s": t_rec,
        "linearsvc_s": t_svc,
        "path_over_linearsvc": t_path / t_svc,
        "linearsvc_over_recover": t_svc / t_rec,
        "kinks_per_s": path.n_kinks_ / t_path,
        "scan_share": dg["scan_share"],
        "refreshes": dg["refreshes"],
        "recoveries": dg["recoveries"],
        "degenerate_directions": dg["degenerate_directions"],
        "merged_rows": dg["merged_rows"],
        "max_kkt_drift": dg["max_kkt_drift"],
    }


def duality_gap(path, n_tau=21):
    """Largest relative duality gap of the recovered solutions over tau in [0, 1]
    (QuantilePathSVC.duality_gap_at: zero exactly at the optimum)."""
    return max(abs(path.duality_gap_at(t)) for t in np.linspace(0.0, 1.0, n_tau))


def _child(name, n, alpha):
    if name == "a9a":
        X, y = a9a()
        idx = np.random.default_rng(0).permutation(X.shape[0])[:n]
        X, y = X[idx], y[idx]
    else:
        X, y = synthetic(n)
    print(json.dumps(measure(X, y, alpha)))


def _limited(name, n, limit):
    cmd = [sys.executable, __file__, "--child", name, str(n), "1e-3"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        return json.loads(p.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"n": n, "alpha": 1e-3, "finished": False, "time_limit_s": limit}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return
    quick = "--quick" in sys.argv
    out = {"spambase": [], "synthetic": [], "a9a": []}
    X, y = spambase()
    sizes = [500, 1000] if quick else [500, 1000, 2000, len(y)]
    for n in sizes:
        idx = np.random.default_rng(0).permutation(len(y))[:n]
        r = measure(X[idx], y[idx], 1e-3)
        out["spambase"].append(r)
        print("spambase", json.dumps(r), flush=True)
    limit = 60 if quick else 300
    for n in [2000] if quick else [2000, 10_000]:
        r = _limited("synthetic", n, limit)
        out["synthetic"].append(r)
        print("synthetic", json.dumps(r), flush=True)
    for n in [500, 1000] if quick else [500, 1000, 2000, 4000, 8000, 32_561]:
        r = _limited("a9a", n, limit)
        out["a9a"].append(r)
        print("a9a", json.dumps(r), flush=True)
    for name in ("spambase", "synthetic"):
        rs = [r for r in out[name] if "kinks" in r]
        if len(rs) > 1:
            ln = np.log([r["n"] for r in rs])
            out[f"{name}_kinks_loglog_slope"] = float(
                np.polyfit(ln, np.log([r["kinks"] for r in rs]), 1)[0]
            )
    (HERE / "out").mkdir(exist_ok=True)
    from bigrate.files import atomic_write_text

    atomic_write_text(HERE / "out" / "quantile.json", json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if "slope" in k}))


if __name__ == "__main__":
    main()
