"""The Neyman-Pearson promise on new data, measured as the literature does, against nproc.

    python benchmarks/bench_np_guarantee.py [--splits 200] [--sets a9a,spambase,...]
        [--nproc-python /work/benchenv/bin/python] [--estimators sgd,sgd_logistic,svc]

For every shared set, rho in {0.05, 0.1, 0.2} and ``--splits`` random stratified 50/50
train/test splits: each bigrate estimator of ``--estimators`` with its defaults
(calibrate="auto": the umbrella order statistic on held-out training negatives, delta =
0.05): "sgd" NeymanPearsonSGD, "sgd_logistic" the same from ``init="logistic"``, "svc"
the kernel NeymanPearsonSVC, "search_init" NPSearchCV choosing the SGD's start by J_val
over 5 folds, "svc_search" NPSearchCV choosing the SVC's (C, gamma) by J_val over 3 folds from a
3 x 3 grid around its defaults, C "auto" and gamma "scale" (rows "bigrate_<name>"; the
points chosen are counted); "plain_svc" the peer of "svc" at the same held-out negatives
and threshold rule: scikit-learn's SVC (C = 1, gamma "scale") trained without a rate
(rows "peer_plain_svc"); and nproc's
umbrella algorithm (Tong, Feng & Li 2018; PyPI ``nproc``, installed with ``--no-deps``
beside scikit-learn in its own environment, run there as a subprocess on the same
splits) over its base classifiers (logistic regression, SVM, random forest). Reported
per row: the violation rate (the share of splits whose test Pfa exceeds rho) with its
95% Clopper-Pearson interval, the rate an umbrella threshold on each split's held-out
count should give on average whatever the model (``expected_violation_rate``, where
every split got the umbrella), and the mean test Pnd. Goal: violation rate <= delta
(within the interval) on every row; mean Pnd at most nproc's best + 1 point.

The test Pfa of a split is measured on that split's test negatives; on the small sets it
scatters around the true rate, so a classifier whose true rate sits just below rho
still exceeds it on many test sets (the table gives the test negatives per split).

Writes benchmarks/out/np_guarantee.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SETS = (
    "a9a",
    "spambase",
    "hill_valley",
    "breast_cancer_wisconsin_diagnostic",
    "breast_cancer_wisconsin_original",
    "ionosphere",
)
RHOS = (0.05, 0.1, 0.2)
DELTA = 0.05
A9A_ROWS = 4000  # a9a: a fixed random subsample (the splits are drawn within it)

# run by the nproc environment's python: reads X, y and the splits, prints the
# test predictions of nproc's umbrella classifier for every split, method and rho
NPROC_SCRIPT = r"""
import json, sys, warnings
import numpy as np
from nproc import npc
warnings.filterwarnings("ignore")
z = np.load(sys.argv[1])
X, y01, splits = z["X"], z["y01"], z["splits"]
rhos, delta = json.loads(sys.argv[2]), float(sys.argv[3])
out = {}
m = npc()
for s, train in enumerate(splits):
    tr, te = np.flatnonzero(train), np.flatnonzero(~train)
    rng = np.random.default_rng(s)
    i0, i1 = tr[y01[tr] == 0], tr[y01[tr] == 1]
    # nproc's own split (split=1, split_ratio=0.5): half of the class-0 rows train the
    # base classifier with every class-1 row, the other half sets the cutoff
    fit0 = rng.choice(i0, round(len(i0) * 0.5), replace=False)
    rest0 = np.setdiff1d(i0, fit0)
    xtr, ytr = X[np.r_[fit0, i1]], y01[np.r_[fit0, i1]]
    xcut, ycut = X[np.r_[rest0, i1]], y01[np.r_[rest0, i1]]
    for method in ("logistic", "svm", "rf"):
        fit_model, score_cut = m.classification(method, None, xtr, ytr, xcut)
        score_te = fit_model.predict_proba(X[te])[:, -1]
        for rho in rhos:
            cutoff = m.npc_core(ycut, score_cut, rho, delta, 1)[0]
            out.setdefault(f"{method} {rho}", []).append(
                (score_te > cutoff).astype(np.int8).tolist())
    print(f"split {s}", file=sys.stderr, flush=True)
with open(sys.argv[4], "w") as f:  # nproc prints its notices to stdout
    json.dump(out, f)
"""


def load(name: str, out: Path):
    """All rows of the shared set ``name`` (dense, standardised as its recipe does),
    labels in {-1, +1} with +1 the class the set's recipe calls positive."""
    from bigrate import ShardedDataset
    from bigrate.data.prep import run_recipe

    path = out / "shared" / name
    if not (path / "manifest.json").exists():
        run_recipe(name, path, progress=False, overwrite=True)
    ds = ShardedDataset(path)
    parts = [ds.to_csr(s) for s in ds.splits]
    X = np.vstack([p.X.toarray() for p in parts])
    y = np.concatenate([p.y for p in parts]).astype(int)
    if name == "a9a":
        keep = np.random.default_rng(0).choice(len(y), A9A_ROWS, replace=False)
        X, y = X[keep], y[keep]
    return X, y


def stratified_splits(y, n: int) -> np.ndarray:
    """``n`` boolean train masks, each half of every class, seeded by split."""
    out = np.zeros((n, len(y)), dtype=bool)
    for s in range(n):
        rng = np.random.default_rng([7, s])
        for c in (-1, 1):
            idx = np.flatnonzero(y == c)
            out[s, rng.choice(idx, len(idx) // 2, replace=False)] = True
    return out


def rates(y_test, pred) -> tuple[float, float]:
    neg, pos = y_test < 0, y_test > 0
    return float(np.mean(pred[neg] > 0)), float(np.mean(pred[pos] <= 0))


def interval(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import beta

    lo = beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


class PlainSVCUmbrella:
    """The peer of NeymanPearsonSVC's defaults: scikit-learn's SVC (C = 1, RBF gamma
    "scale", no rate in its training) on the rows left after holding out the same
    negatives NeymanPearsonSVC holds out (``frac`` of them, "auto" as its default:
    ``auto_calibration_fraction``; drawn by the same seed), its threshold set by
    bigrate's default calibration (``np_threshold``) on their scores: what nproc's
    umbrella over an SVM does, at bigrate's held-out share. Its rows are
    "peer_plain_svc"."""

    def __init__(self, rho: float, random_state: int, frac="auto"):
        self.rho, self.random_state, self.frac = rho, random_state, frac

    def fit(self, X, y):
        from sklearn.svm import SVC
        from sklearn.utils import check_random_state

        from bigrate.metrics import auto_calibration_fraction, np_threshold

        neg = np.flatnonzero(y < 0)
        frac = self.frac
        if frac == "auto":
            frac = auto_calibration_fraction(len(neg), self.rho, DELTA)
        m = int(round(frac * len(neg)))
        held = np.zeros(len(y), bool)
        held[check_random_state(self.random_state).choice(neg, m, replace=False)] = True
        self.svc_ = SVC(C=1.0, gamma="scale").fit(X[~held], y[~held])
        t, self.guarantee_ = np_threshold(
            self.svc_.decision_function(X[held]), self.rho, DELTA
        )
        self.threshold_ = 0.0 if t is None else t
        return self

    def decision_function(self, X):  # positive above the threshold, as bigrate's
        return self.svc_.decision_function(X) - np.nextafter(self.threshold_, np.inf)


def _estimators(n_features: int = 1, frac="auto", n_rows: int = 1, x_var=1.0) -> dict:
    """bigrate's NP estimators by name, each a function of (rho, seed), defaults
    otherwise. The kernel search's grid is around NeymanPearsonSVC's defaults:
    gamma around "scale", 1 / (``n_features`` * ``x_var``, the data's variance), and C
    around "auto", which is C = the rows fitted (``n_rows``, a split's training rows).
    ``frac``: the estimators' ``calibration_fraction``."""
    from bigrate import NeymanPearsonSGD, NeymanPearsonSVC, NPSearchCV

    gammas = [g / (n_features * float(x_var)) for g in (0.25, 1.0, 4.0)]
    cs = [c * float(n_rows) for c in (0.1, 1.0, 10.0)]

    return {
        "sgd": lambda rho, s: NeymanPearsonSGD(
            rho=rho, random_state=s, calibration_fraction=frac
        ),
        "sgd_logistic": lambda rho, s: NeymanPearsonSGD(
            rho=rho, init="logistic", random_state=s, calibration_fraction=frac
        ),
        "svc": lambda rho, s: NeymanPearsonSVC(
            rho=rho, random_state=s, calibration_fraction=frac
        ),
        # the peer at the same held-out negatives: a plain SVC, thresholded alike
        "plain_svc": lambda rho, s: PlainSVCUmbrella(rho, s, frac),
        # the start chosen per split by J_val over 5 folds, refit on the training half
        "search_init": lambda rho, s: NPSearchCV(
            NeymanPearsonSGD(rho=rho, random_state=s, calibration_fraction=frac),
            {"init": ["zeros", "logistic"]},
            rho=rho,
            cv=5,
            engine="local",
            progress=False,
            random_state=s,
        ),  # fmt: skip
        # (C, gamma) chosen per split by J_val over 3 folds (each fold's fit calibrated
        # on its own held-out negatives, as the refit), refit on the training half
        "svc_search": lambda rho, s: NPSearchCV(
            NeymanPearsonSVC(rho=rho, random_state=s, calibration_fraction=frac),
            {"C": cs, "gamma": gammas},
            rho=rho,
            cv=3,
            engine="local",
            progress=False,
            random_state=s,
            warm_start=True,
        ),  # fmt: skip
    }


def run_set(
    name: str,
    out: Path,
    n_splits: int,
    nproc_python: str | None,
    estimators=("sgd",),
    frac="auto",
) -> dict:
    from bigrate import BigrateWarning

    X, y = load(name, out)
    splits = stratified_splits(y, n_splits)
    ESTIMATORS = _estimators(X.shape[1], frac, int(splits[0].sum()), X.var())
    res: dict = {"rows": len(y), "features": X.shape[1],
                 "test_negatives": int((~splits[0] & (y < 0)).sum())}  # fmt: skip
    for est_name in estimators:
        t = time.perf_counter()
        key = "peer_plain_svc" if est_name == "plain_svc" else f"bigrate_{est_name}"
        for rho in RHOS:
            got, kinds, chosen, expect = [], [], {}, []
            for s, train in enumerate(splits):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", BigrateWarning)
                    est = ESTIMATORS[est_name](rho, s).fit(X[train], y[train])
                got.append(rates(y[~train], est.decision_function(X[~train])))
                g = getattr(
                    est, "best_estimator_", est
                ).guarantee_  # a search: its refit
                kinds.append(g["kind"])
                if g["kind"] == "umbrella":
                    expect.append(umbrella_test_violation(
                        g["n_calibration"], rho, int((~train & (y < 0)).sum())))  # fmt: skip
                if hasattr(est, "best_params_"):  # a search: which point it chose
                    p = json.dumps(est.best_params_, sort_keys=True)
                    chosen[p] = chosen.get(p, 0) + 1
            res[f"{key} {rho}"] = summarise(got, rho)
            if len(expect) == len(got):
                res[f"{key} {rho}"]["expected_violation_rate"] = float(np.mean(expect))
            res[f"{key} {rho}"]["guarantee"] = {k: kinds.count(k) for k in set(kinds)}
            if chosen:
                res[f"{key} {rho}"]["chosen"] = chosen
        res[f"{key}_seconds"] = time.perf_counter() - t
    if nproc_python:
        t = time.perf_counter()
        with np.errstate(all="ignore"):
            f = out / f"np_guarantee_{name}.npz"
            np.savez(f, X=X, y01=(y > 0).astype(int), splits=splits)
        p = subprocess.run(
            [nproc_python, "-c", NPROC_SCRIPT, str(f), json.dumps(list(RHOS)),
             str(DELTA), str(f) + ".json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        os.unlink(f)
        if p.returncode != 0:
            raise RuntimeError(f"nproc failed on {name}: {p.stderr[-2000:]}")
        preds = json.loads(Path(str(f) + ".json").read_text())
        os.unlink(str(f) + ".json")
        res["nproc_small_sample_notices"] = p.stdout.count("Sample size is too small")
        for key, per_split in preds.items():
            method, rho = key.split()
            got = [
                rates(y[~train], np.where(np.array(pr) > 0, 1, -1))
                for train, pr in zip(splits, per_split, strict=True)
            ]
            res[f"nproc_{method} {rho}"] = summarise(got, float(rho))
        res["nproc_seconds"] = time.perf_counter() - t
    return res


def umbrella_test_violation(m: int, rho: float, n_test: int) -> float:
    """P(test Pfa > rho) of an umbrella threshold set on ``m`` held-out negatives, for
    ``n_test`` test negatives exchangeable with them: the threshold is the r-th largest
    held-out score, so the share of new negatives above it is Beta(r, m + 1 - r) and
    the test count beta-binomial, whatever the model. The violation rate a row of this
    benchmark should show on average; its spread around it is the splits' noise."""
    from scipy.stats import betabinom

    from bigrate.metrics import np_umbrella_order

    r = m + 1 - np_umbrella_order(m, rho, DELTA)
    return float(betabinom.sf(int(np.floor(rho * n_test + 1e-9)), n_test, r, m + 1 - r))


def summarise(got: list, rho: float) -> dict:
    pfa = np.array([g[0] for g in got])
    pnd = np.array([g[1] for g in got])
    k = int(np.sum(pfa > rho))
    return {
        "violation_rate": k / len(pfa),
        "violation_interval": interval(k, len(pfa)),
        "mean_pfa": float(pfa.mean()),
        "mean_pnd": float(pnd.mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--nproc-python", default=None,
                    help="python of an environment with nproc (pip install nproc "
                    "--no-deps scikit-learn)")  # fmt: skip
    ap.add_argument("--estimators", default="sgd",
                    help="bigrate estimators: sgd, sgd_logistic, svc, search_init, "
                         "svc_search; plain_svc (scikit-learn's SVC at svc's hold-out)")  # fmt: skip
    ap.add_argument("--calibration-fraction", default="auto",
                    help="the estimators' calibration_fraction: auto or a share")  # fmt: skip
    ap.add_argument("--out", default=str(HERE / "out"))
    a = ap.parse_args()
    frac = a.calibration_fraction
    frac = frac if frac == "auto" else float(frac)
    unknown = set(a.estimators.split(",")) - set(_estimators())
    if unknown:
        ap.error(f"--estimators: unknown {sorted(unknown)}; expected some of "
                 f"{sorted(_estimators())}")  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"splits": a.splits, "delta": DELTA, "calibration_fraction": frac,
           "sets": {}}  # fmt: skip
    for name in a.sets.split(","):
        res["sets"][name] = r = run_set(name, out, a.splits, a.nproc_python,
                                        a.estimators.split(","), frac)  # fmt: skip
        print(name, {k: v for k, v in r.items() if not isinstance(v, dict)},
              flush=True)  # fmt: skip
        for rho in RHOS:
            rows = {k.split()[0]: v for k, v in r.items()
                    if isinstance(v, dict) and k.endswith(f" {rho}")}  # fmt: skip
            line = "  ".join(
                f"{m}: viol {v['violation_rate']:.3f} "
                f"[{v['violation_interval'][0]:.3f}, {v['violation_interval'][1]:.3f}]"
                + (
                    f" (expected {v['expected_violation_rate']:.3f})"
                    if "expected_violation_rate" in v
                    else ""
                )  # fmt: skip
                + f" Pnd {v['mean_pnd']:.3f}"
                for m, v in rows.items()
            )
            print(f"  rho {rho}: {line}", flush=True)
        tmp = out / "np_guarantee.json.tmp"
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(out / "np_guarantee.json")


if __name__ == "__main__":
    main()
