"""Dataset-constraint benchmark (issue: dataset constraints, Goh et al.).

    python benchmarks/bench_constraints.py [--rows N | --rows all] [--stream]

On UCI adult (a random subsample of N training rows, default 2,000, or all 32,561; the
full test set), for demographic-parity ratio targets kappa in {0.5, ..., 1.0} with sex
as the group: test error, achieved ratio (train and test, deterministic rule) and fit
time of RateConstrainedClassifier, against fairlearn (when installed; it is not a
bigrate dependency) in the same run: ExponentiatedGradient(DemographicParity(
ratio_bound=kappa)) over logistic regression, and ThresholdOptimizer (demographic
parity, relaxed by tol in {0, 0.02, ..., 0.1} on the difference of selection rates).

"At equal achieved fairness": for each bigrate point, fairlearn's best test error among
all its points (both methods) whose test ratio is at least bigrate's. Writes
benchmarks/out/constraints[_ROWS].json and constraints_fairness[_ROWS].png.

--stream: instead, kappa 0.8 on the same rows in memory and written as shards
(ShardedDataset input, block-wise solver); benchmarks/out/constraints_stream_ROWS.json.
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
    from bigrate.constrained import plot_target_vs_achieved, positive_rate
    from bigrate.datasets import load_adult

    arg = sys.argv[sys.argv.index("--rows") + 1] if "--rows" in sys.argv else "2000"
    d = load_adult(SHARED)
    X, y, sex = d["train"]
    rows = len(y) if arg == "all" else int(arg)
    idx = np.random.default_rng(0).permutation(len(y))[:rows]
    X, y, sex = X[idx], y[idx], sex[idx]
    if "--stream" in sys.argv:
        return stream(X, y, sex)
    Xt, yt, st = d["test"]
    out = {"rows": rows, "bigrate": [], "fairlearn": [], "threshold_optimizer": []}
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
        peer(out, "fairlearn", {"kappa": kappa}, fit_s, p, pt, yt, sex, st)
    threshold_optimizer(X, y, sex, Xt, yt, st, out)
    compare(out)
    suffix = "" if rows == 2000 else f"_{rows}"
    (HERE / "out").mkdir(exist_ok=True)
    from bigrate.files import atomic_write_text

    atomic_write_text(
        HERE / "out" / f"constraints{suffix}.json", json.dumps(out, indent=2) + "\n"
    )
    plot_target_vs_achieved(
        [
            {"target": r["kappa"], "train": r["train_ratio"], "test": r["test_ratio"]}
            for r in out["bigrate"]
        ],
        HERE / "out" / f"constraints_fairness{suffix}.png",
        xlabel="target ratio kappa",
        ylabel="achieved P(+|F) / P(+|M)",
        title=f"adult ({rows} rows): demographic parity",
    )


def stream(X, y, sex, kappa=0.8):
    """The same rows in memory and as shards (block-wise solver, blocks of 500
    positives + 500 negatives kept in memory after the first pass)."""
    import tempfile

    import scipy.sparse as sp

    from bigrate import BigrateWarning, RateConstrainedClassifier, ShardedDataset
    from bigrate.constrained import positive_rate
    from bigrate.data.format import RowBlock
    from bigrate.data.writer import DatasetWriter

    c = positive_rate(group="Female") >= kappa * positive_rate(group="Male")
    out = {"rows": len(y), "kappa": kappa}
    with tempfile.TemporaryDirectory() as tmp:
        with DatasetWriter(Path(tmp) / "adult", splits=("train",),
                           has_group=True) as w:  # fmt: skip
            w.append("train", RowBlock(
                X=sp.csr_matrix(X, dtype=np.float32), y=y.astype(np.int8),
                row_id=np.arange(len(y)), group=sex.astype(object),
            ))  # fmt: skip
            w.commit(n_features=X.shape[1], label_mapping={}, preprocessing={},
                     sources=[])  # fmt: skip
        ds = ShardedDataset(Path(tmp) / "adult")
        block = ds.to_csr(order="file", with_group=True)  # the same rows, in memory
        memory = ((block.X.astype(np.float64), block.y), {"groups": block.group})
        for key, (args, kw) in (("in_memory", memory), ("shards", ((ds,), {}))):
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BigrateWarning)
                clf = RateConstrainedClassifier(constraints=[c], mm_iterations=4,
                                                batch_rows=500)  # fmt: skip
                clf.fit(*args, **kw)
            h = clf.history_[-1]
            out[key] = {"fit_s": time.perf_counter() - t,
                        "objective": h["objective"], "constraint": h["constraints"][0]}  # fmt: skip
            print(key, json.dumps(out[key]), flush=True)
    (HERE / "out").mkdir(exist_ok=True)
    from bigrate.files import atomic_write_text

    atomic_write_text(
        HERE / "out" / f"constraints_stream_{len(y)}.json",
        json.dumps(out, indent=2) + "\n",
    )


def peer(out, key, setting, fit_s, p, pt, yt, sex, st):
    """Record one fairlearn point: train / test predictions (True = positive)."""
    r = {
        **setting,
        "fit_s": fit_s,
        "test_error": float((np.where(pt, 1, -1) != yt).mean()),
        "train_ratio": ratio(p, sex),
        "test_ratio": ratio(pt, st),
    }
    out[key].append(r)
    print(key, json.dumps(r), flush=True)


def threshold_optimizer(X, y, sex, Xt, yt, st, out):
    try:
        from fairlearn.postprocessing import ThresholdOptimizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        return
    X, Xt = X.toarray(), Xt.toarray()  # fairlearn takes dense input only
    for tol in (0.0, 0.02, 0.04, 0.06, 0.08, 0.1):
        t = time.perf_counter()
        to = ThresholdOptimizer(
            estimator=LogisticRegression(max_iter=1000),
            constraints="demographic_parity",
            tol=tol or None,
            predict_method="predict_proba",
        ).fit(X, (y > 0).astype(int), sensitive_features=sex)
        fit_s = time.perf_counter() - t
        p = to.predict(X, sensitive_features=sex, random_state=0) == 1
        pt = to.predict(Xt, sensitive_features=st, random_state=0) == 1
        peer(out, "threshold_optimizer", {"tol": tol}, fit_s, p, pt, yt, sex, st)


def compare(out):
    """For each bigrate point: fairlearn's best test error at a test ratio >= ours."""
    peers = out["fairlearn"] + out["threshold_optimizer"]
    if not peers:
        return
    for r in out["bigrate"]:
        ok = [p for p in peers if p["test_ratio"] >= r["test_ratio"]]
        best = min(ok, key=lambda p: p["test_error"]) if ok else None
        r["fairlearn_best_error_at_ratio"] = best and best["test_error"]
        r["error_gap_points"] = best and 100 * (r["test_error"] - best["test_error"])
        r["fairlearn_fit_s_of_best"] = best and best["fit_s"]
        print("compare", json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
