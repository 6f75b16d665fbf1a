"""Stress run of QuantilePathSVC on small tied sets: is every fit certified?

    python benchmarks/stress_quantile.py [--seeds 0:60]

Sets by seed: rounded Gaussian features (ties), one-hot groups (ties and merged
duplicate rows, like a9a) or sparse Gaussian; n 20-400. Each is fitted with both event
modes, refresh_every 1 / 7 / 60 and alpha 1e-4 / 1e-2, and the relative duality gap is
checked on 11 tau in [0, 1] and at every ~20th kink (zero only at the optimum). A fit
is a failure above 1e-9 or if it raises. Writes benchmarks/out/stress_quantile.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def make_set(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    if seed % 3 == 0:
        X = np.round(rng.standard_normal((n, int(rng.integers(1, 6)))), 1)
    elif seed % 3 == 1:
        groups = int(rng.integers(2, 8))
        X = np.zeros((n, 3 * groups))
        for k in range(groups):
            X[np.arange(n), 3 * k + rng.integers(0, 3, n)] = 1.0
    else:
        d = int(rng.integers(2, 10))
        X = rng.standard_normal((n, d))
        X[rng.random((n, d)) < 0.6] = 0
    score = X @ rng.standard_normal(X.shape[1])
    y = np.where(score + 0.7 * rng.standard_normal(n) > 0, 1, -1)
    if len(set(y)) < 2:
        y[0] = -y[0]
    return X, y


def main() -> None:
    from bigrate import QuantilePathSVC
    from bigrate.files import atomic_write_text

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0:60", help="first:last (exclusive)")
    a = ap.parse_args()
    lo, hi = (int(v) for v in a.seeds.split(":"))
    t0 = time.perf_counter()
    fits, failures, worst = 0, [], 0.0
    for seed in range(lo, hi):
        X, y = make_set(seed)
        for events in ("candidates", "scan"):
            for refresh in (1, 7, 60):
                for alpha in (1e-4, 1e-2):
                    fits += 1
                    case = {"seed": seed, "events": events, "refresh_every": refresh,
                            "alpha": alpha}  # fmt: skip
                    try:
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            p = QuantilePathSVC(
                                alpha=alpha, events=events, refresh_every=refresh
                            ).fit(X, y)
                        step = max(1, p.n_kinks_ // 20)
                        taus = np.r_[np.linspace(0, 1, 11), p.kinks_[::step]]
                        gap = max(p.duality_gap_at(t) for t in taus)
                        if gap <= 1e-9:
                            worst = max(worst, gap)
                        else:
                            failures.append({**case, "gap": gap,
                                             "warned": [str(w.message)[:120]
                                                        for w in caught]})  # fmt: skip
                    except Exception as e:  # noqa: BLE001 - counted and reported
                        failures.append({**case, "error": f"{type(e).__name__}: {e}"})
    res = {"command": f"python benchmarks/stress_quantile.py --seeds {a.seeds}",
           "fits": fits, "failures": len(failures),
           "failing_seeds": sorted({f["seed"] for f in failures}),
           "worst_certified_gap": worst, "seconds": time.perf_counter() - t0,
           "failed": failures}  # fmt: skip
    print(json.dumps({k: v for k, v in res.items() if k != "failed"}, indent=2))
    (HERE / "out").mkdir(exist_ok=True)
    atomic_write_text(HERE / "out" / "stress_quantile.json", json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
