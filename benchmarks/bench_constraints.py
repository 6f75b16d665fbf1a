"""Dataset-constraint benchmark (issue: dataset constraints, Goh et al.).

    python benchmarks/bench_constraints.py [--rows N]

On UCI adult (a stratified-by-nothing random subsample of N training rows, default
3,000; the full test set), for demographic-parity ratio targets kappa in {0.5, ..., 1.0}
with sex as the group: test error, achieved ratio (train and test, deterministic rule)
and fit time of RateConstrainedClassifier, against fairlearn's ExponentiatedGradient
(DemographicParity(ratio_bound=kappa)) over logistic regression, measured in the same
run when fairlearn is installed (it is not a bigrate dependency). Writes
benchmarks/out/constraints.json and benchmarks/out/constraints_fairness.png.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SHARED = HERE.parent.parent / "shared" / "data"


def ratio(pred, sex):
    f, m = pred[sex == "Female"].mean(), pred[sex == "Male"].mean()
    return float(f / m) if m > 0 else float("nan")


def main():
    from bigrate import BigrateWarning, RateConstrainedClassifier
    from bigrate.constraints import positive_rate
    from bigrate.datasets import load_adult
    from bigrate.path import plot_target_vs_achieved

    rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 3000
    d = load_adult(SHARED)
    X, y, sex = d["train"]
    idx = np.random.default_rng(0).permutation(len(y))[:rows]
    X, y, sex = X[idx], y[idx], sex[idx]
    Xt, yt, st = d["test"]
    out = {"rows": rows, "bigrate": [], "fairlearn": []}
    for kappa in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        c = positive_rate(group="Female") >= kappa * positive_rate(group="Male")
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BigrateWarning)
            clf = RateConstrainedClassifier(constraints=[c], mm_iterations=4).fit(
                X, y, groups=sex
            )
        fit_s = time.perf_counter() - t
        p, pt = clf.predict(X) == 1, clf.predict(Xt) == 1
        r = {
            "kappa": kappa,
            "fit_s": fit_s,
            "test_error": float((clf.predict(Xt) != yt).mean()),
            "train_ratio": ratio(p, sex),
            "test_ratio": ratio(pt, st),
            "train_ramp_constraint": clf.history_[-1]["constraints"][0],
        }
        out["bigrate"].append(r)
        print("bigrate", json.dumps(r), flush=True)
        try:
            from fairlearn.reductions import DemographicParity, ExponentiatedGradient
            from sklearn.linear_model import LogisticRegression
        except ImportError:
            continue
        t = time.perf_counter()
        eg = ExponentiatedGradient(
            LogisticRegression(max_iter=1000),
            DemographicParity(ratio_bound=kappa),
        ).fit(X.toarray(), (y > 0).astype(int), sensitive_features=sex)  # dense only
        fit_s = time.perf_counter() - t
        p = eg.predict(X.toarray(), random_state=0) == 1
        pt = eg.predict(Xt.toarray(), random_state=0) == 1
        r = {
            "kappa": kappa,
            "fit_s": fit_s,
            "test_error": float((np.where(pt, 1, -1) != yt).mean()),
            "train_ratio": ratio(p, sex),
            "test_ratio": ratio(pt, st),
        }
        out["fairlearn"].append(r)
        print("fairlearn", json.dumps(r), flush=True)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "constraints.json").write_text(json.dumps(out, indent=2) + "\n")
    plot_target_vs_achieved(
        [
            {"target": r["kappa"], "train": r["train_ratio"], "test": r["test_ratio"]}
            for r in out["bigrate"]
        ],
        HERE / "out" / "constraints_fairness.png",
        xlabel="target ratio kappa",
        ylabel="achieved P(+|F) / P(+|M)",
        title=f"adult ({rows} rows): demographic parity",
    )


if __name__ == "__main__":
    main()
