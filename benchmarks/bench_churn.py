"""Recall + churn experiment in the spirit of Goh et al. (2016), sec. 4.2.

    python benchmarks/bench_churn.py [--runs R]   (default 5 runs)

On a9a (train and test files pooled, 48,842 rows; random splits per run):

- D0, 2,000 rows: trains the *deployed* model (LinearSVC, C = 0.01);
- D1, 10,000 rows "actively sampled": drawn from 20,000 rows with probability
  proportional to 1 / (0.25 + |deployed score|), so it over-represents hard rows;
- D2, 8,000 rows i.i.d., labeled; D3, 8,000 rows i.i.d., unlabeled (labels dropped).

Each of D1-D3 is split 80% train / 20% test. RateConstrainedClassifier minimises
(errors on D1 + false positives on D2) / (|D1| + |D2|) subject to recall on D2 at
least the deployed model's (measured on D2 train) and churn against the deployed model
on D3 at most a target in {0.02, ..., 0.06}. Baseline (as in the paper): an
unconstrained LinearSVC on D1 + D2 (C by 3-fold cross-validation over powers of 10),
thresholded by shifting its bias to the smallest shift meeting the same recall on D2
train; it makes no effort on churn. Our alpha is the baseline's C in our units,
1 / (C n); MM starts from the deployed model (feasible for both constraints). Reported per target, averaged over runs: churn on D3 and error on D1 + D2
(train and test), recall on D2 test vs the deployed model's, fit times. Writes
benchmarks/out/churn.json and churn.png.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SHARED = HERE.parent.parent / "shared" / "data"
TARGETS = (0.02, 0.03, 0.04, 0.05, 0.06)


def load_a9a():
    from sklearn.datasets import load_svmlight_file

    parts = [
        load_svmlight_file(str(SHARED / "a9a" / f), n_features=123)
        for f in ("a9a.bz2", "a9a.t.bz2")
    ]
    X = sp.vstack([p[0] for p in parts], format="csr")
    return X, np.concatenate([p[1] for p in parts]).astype(int)


def make_splits(X, y, seed):
    from sklearn.svm import LinearSVC

    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    d0, rest = perm[:2000], perm[2000:]
    deployed = LinearSVC(C=0.01).fit(X[d0], y[d0])
    pool, rest = rest[:20000], rest[20000:]
    p = 1.0 / (0.25 + np.abs(deployed.decision_function(X[pool])))
    d1 = rng.choice(pool, size=10000, replace=False, p=p / p.sum())
    d2, d3 = rest[:8000], rest[8000:16000]
    out = {}
    for name, rows in (("D1", d1), ("D2", d2), ("D3", d3)):
        cut = int(0.8 * len(rows))
        out[name] = {"train": rows[:cut], "test": rows[cut:]}
    return deployed, out


def churn_of(pred, base):
    return float((pred != base).mean())


def main():
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 5
    X, y = load_a9a()
    records = []
    for run in range(runs):
        records += one_run(X, y, run)
    summary = summarise(records)
    out = {"runs": runs, "targets": list(TARGETS), "summary": summary,
           "records": records}  # fmt: skip
    (HERE / "out").mkdir(exist_ok=True)
    from bigrate.files import atomic_write_text

    atomic_write_text(HERE / "out" / "churn.json", json.dumps(out, indent=2) + "\n")
    plot(summary, HERE / "out" / "churn.png")
    for row in summary:
        print("summary", json.dumps(row), flush=True)


def one_run(X, y, run):
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import LinearSVC

    from bigrate import BigrateWarning, RateConstrainedClassifier
    from bigrate.constrained import churn, count_false_positives, error_rate, recall

    records = []
    deployed, S = make_splits(X, y, seed=run)

    def rows(name, part):
        return S[name][part]

    d12 = {p: np.r_[rows("D1", p), rows("D2", p)] for p in ("train", "test")}
    base3 = {p: deployed.predict(X[rows("D3", p)]) for p in ("train", "test")}
    d2tr = rows("D2", "train")
    r0 = float((deployed.predict(X[d2tr])[y[d2tr] == 1] == 1).mean())

    # baseline: LinearSVC on D1 + D2, bias shifted to meet the recall on D2 train
    t = time.perf_counter()
    grid = GridSearchCV(LinearSVC(), {"C": [10.0**k for k in range(-3, 2)]}, cv=3).fit(
        X[d12["train"]], y[d12["train"]]
    )
    svm = grid.best_estimator_
    s_pos = np.sort(svm.decision_function(X[d2tr])[y[d2tr] == 1])
    k = int(np.floor((1 - r0) * len(s_pos)))  # at most k positives may fall
    thr = np.nextafter(s_pos[k], -np.inf) if k < len(s_pos) else s_pos[-1]
    svm_fit_s = time.perf_counter() - t
    C = grid.best_params_["C"]
    alpha = 1.0 / (C * len(d12["train"]))

    def measure(decide):
        out = {}
        for p in ("train", "test"):
            r12, r3, r2 = d12[p], rows("D3", p), rows("D2", p)
            out[f"error_{p}"] = float((decide(X[r12]) != y[r12]).mean())
            out[f"churn_{p}"] = churn_of(decide(X[r3]), base3[p])
            out[f"recall_D2_{p}"] = float((decide(X[r2])[y[r2] == 1] == 1).mean())
        return out

    base = {
        "method": "thresholded_svm",
        "run": run,
        "C": C,
        "fit_s": svm_fit_s,
        **measure(lambda Z: np.where(svm.decision_function(Z) > thr, 1, -1)),
    }
    base["deployed_recall_D2_train"] = r0
    records.append(base)
    print(json.dumps(base), flush=True)

    # MM starts from a feasible point (Alg. 1): the deployed model meets both
    # constraints; its scores x4 put few rows in the ramp's band |z| < 1/2, so its
    # ramp churn against itself is near 0 (at scale 1 it is ~0.07, infeasible)
    start = SimpleNamespace(
        coef_=4 * deployed.coef_, intercept_=4 * deployed.intercept_
    )
    n1, n2 = len(rows("D1", "train")), len(d2tr)
    objective = (n1 * error_rate() + count_false_positives(dataset="D2")) * (
        1.0 / (n1 + n2)
    )
    datasets = {
        "D2": {"X": X[d2tr], "y": y[d2tr]},
        "D3": X[rows("D3", "train")],
    }
    for target in TARGETS:
        clf = RateConstrainedClassifier(
            objective=objective,
            constraints=[
                recall(dataset="D2") >= r0,
                churn(baseline=deployed, dataset="D3") <= target,
            ],
            alpha=alpha,
            mm_iterations=5,
            init=start,
        )
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BigrateWarning)
            clf.fit(X[rows("D1", "train")], y[rows("D1", "train")],
                    datasets=datasets)  # fmt: skip
        fit_s = time.perf_counter() - t
        for rule in ("deterministic", "randomized"):
            clf.set_params(randomized=rule == "randomized", random_state=run)
            r = {
                "method": f"bigrate_{rule}",
                "run": run,
                "target": target,
                "fit_s": fit_s,
                "mm_steps": clf.n_iter_,
                "ramp_constraints_train": clf.constraint_values_.tolist(),
                **measure(clf.predict),
            }
            records.append(r)
            print(json.dumps(r), flush=True)
    return records


KEYS = ("error_train", "error_test", "churn_train", "churn_test", "recall_D2_train",
        "recall_D2_test", "fit_s")  # fmt: skip


def summarise(records):
    """Means over runs, per method and target (the baseline has one point per run,
    repeated at every target)."""
    rows = []
    base = [r for r in records if r["method"] == "thresholded_svm"]
    for target in TARGETS:
        for method in ("bigrate_deterministic", "bigrate_randomized"):
            sel = [
                r for r in records if r["method"] == method and r["target"] == target
            ]
            rows.append({"method": method, "target": target,
                         **{k: float(np.mean([r[k] for r in sel])) for k in KEYS}})  # fmt: skip
        rows.append({"method": "thresholded_svm", "target": target,
                     **{k: float(np.mean([r[k] for r in base])) for k in KEYS}})  # fmt: skip
    rows.append({"method": "deployed_recall_D2_train",
                 "value": float(np.mean([r["deployed_recall_D2_train"] for r in base]))})  # fmt: skip
    return rows


def plot(summary, path):
    from bigrate._plot import pyplot, save_png

    fig, axes = pyplot().subplots(1, 2, figsize=(9, 3.5))
    for method, colour in (("bigrate_deterministic", "C0"),
                           ("bigrate_randomized", "C3"), ("thresholded_svm", "C2")):  # fmt: skip
        sel = [r for r in summary if r.get("method") == method]
        t = [r["target"] for r in sel]
        for ax, key in zip(axes, ("churn", "error"), strict=True):
            ax.plot(t, [r[f"{key}_train"] for r in sel], ":", color=colour)
            ax.plot(t, [r[f"{key}_test"] for r in sel], "--", color=colour,
                    label=method.replace("_", " "))  # fmt: skip
    axes[0].plot(TARGETS, TARGETS, color="grey", lw=0.8, label="target")
    axes[0].set_ylabel("churn on D3 vs deployed")
    axes[1].set_ylabel("error on D1 + D2")
    for ax in axes:
        ax.set_xlabel("churn target")
    axes[0].legend(fontsize=7)
    fig.suptitle("a9a: recall >= deployed, churn <= target (dotted train, dashed test)",
                 fontsize=9)  # fmt: skip
    return save_png(fig, path)


if __name__ == "__main__":
    main()
