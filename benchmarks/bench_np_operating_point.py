"""NeymanPearsonSVC trained at rho against trained for its calibrated operating point
(issue 48): the same estimator, splits and held-out negatives, the training
false-alarm target either rho (how fits were made before 336dbc1) or the mean rate of
the threshold the held-out negatives give (``training_rho_``, the default now).

    python benchmarks/bench_np_operating_point.py --set breast_cancer_wisconsin_original \\
        --rho 0.05 --splits 1000

Each split is bench_np_guarantee.py's (stratified halves, seeded by split); prints and
saves, per arm, the violation rate (test Pfa > rho) with its Clopper-Pearson interval
and the mean test Pnd. The "at rho" arm replaces the estimator module's
``calibrated_pfa`` by one returning rho: the one line the change added."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_np_guarantee import interval, load, stratified_splits  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="breast_cancer_wisconsin_original")
    ap.add_argument("--rho", type=float, default=0.05)
    ap.add_argument("--splits", type=int, default=1000)
    ap.add_argument("--out", default=str(HERE / "out"))
    a = ap.parse_args()

    import bigrate.kernel.svc as svc
    from bigrate import BigrateWarning, NeymanPearsonSVC
    from bigrate.metrics import pfa_pnd

    out = Path(a.out)
    X, y = load(a.set, out)
    masks = stratified_splits(y, a.splits)
    operating_point = svc.calibrated_pfa
    res = {"set": a.set, "rho": a.rho, "splits": a.splits, "arms": {}}
    for arm in ("at rho", "operating point"):
        svc.calibrated_pfa = (
            operating_point if arm == "operating point" else lambda m, rho, *_: rho
        )
        got = []
        for s, tr in enumerate(masks):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BigrateWarning)
                m = NeymanPearsonSVC(rho=a.rho, random_state=s).fit(X[tr], y[tr])
            got.append(pfa_pnd(y[~tr], m.decision_function(X[~tr])))
        got = np.array(got)
        k = int(np.sum(got[:, 0] > a.rho))
        res["arms"][arm] = {
            "violation_rate": k / a.splits,
            "violation_interval": list(interval(k, a.splits)),
            "mean_pnd": float(got[:, 1].mean()),
            "training_rho": float(m.training_rho_),
        }
        r = res["arms"][arm]
        print(f"{a.set} rho {a.rho} {arm:>16}: violations {r['violation_rate']:.4f} "
              f"[{r['violation_interval'][0]:.4f}, {r['violation_interval'][1]:.4f}], "
              f"Pnd {r['mean_pnd']:.3f} (training rate of the last fit "
              f"{r['training_rho']:.4f})", flush=True)  # fmt: skip
    svc.calibrated_pfa = operating_point
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"np_operating_point_{a.set}_{a.rho}.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
