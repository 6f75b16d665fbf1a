"""The Neyman-Pearson estimators keep their promise on new data by default: over many
random draws of a training set, the share of fits whose false-alarm rate on new data
exceeds rho stays within the binomial interval of delta (the NP umbrella guarantee,
P(Pfa > rho) <= delta), and the fit says which guarantee it got.

Two Gaussian classes: for a linear model the false-alarm rate on new data is exact
(Pfa = Phi(b / ||w||) for negatives ~ N(0, I)); for the kernel SVM it is measured on
20,000 fresh negatives."""

import warnings

import numpy as np
import pytest
from scipy.stats import binom, norm

from bigrate import BigrateWarning, NeymanPearsonSGD, NeymanPearsonSVC

RHO, DELTA = 0.1, 0.05
MU = np.array([1.2, 0.6, 0.0, 0.0, 0.0])  # the positives' mean; negatives at 0


def draw(rng, n):
    y = np.where(rng.random(n) < 0.5, 1, -1)
    X = rng.standard_normal((n, len(MU))) + np.outer(y > 0, MU)
    return X, y


def worst_allowed(n: int) -> int:
    """The most violations in n fits a rate of delta gives with probability 0.999."""
    return int(binom.ppf(0.999, n, DELTA))


@pytest.mark.parametrize("fits", [200])
def test_np_sgd_holds_pfa_on_new_data_by_default(fits):
    rng = np.random.default_rng(0)
    pfa = []
    for k in range(fits):
        X, y = draw(rng, 1000)
        est = NeymanPearsonSGD(rho=RHO, random_state=k).fit(X, y)
        assert est.guarantee_["kind"] == "umbrella", est.guarantee_
        w, b = est.coef_.ravel(), est.intercept_[0]
        pfa.append(norm.cdf(b / np.linalg.norm(w)))  # P(w.x + b >= 0), x ~ N(0, I)
    pfa = np.array(pfa)
    violations = int(np.sum(pfa > RHO))
    assert violations <= worst_allowed(fits), (
        violations,
        np.quantile(pfa, [0.5, 0.95]),
    )
    assert pfa.mean() < RHO  # and not by luck: the threshold sits below rho


def test_np_sgd_holds_pfa_on_a_small_set_by_holding_out_enough_negatives():
    """150 negatives, rho 0.05: 30% of them (45) are too few for the umbrella (59), so
    the default holds out as many as it needs (in memory exactly 59, ~40%, unless its
    random 30% already holds more; nproc holds out half) and keeps the promise; a fixed
    30% gets the expected-Pfa rule, which breaks it far more often."""
    rng = np.random.default_rng(3)
    fits, rho = 200, 0.05
    pfa = {"auto": [], 0.3: []}
    for k in range(fits):
        X, y = draw(rng, 300)
        for frac in pfa:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BigrateWarning)
                est = NeymanPearsonSGD(rho=rho, calibration_fraction=frac,
                                       random_state=k).fit(X, y)  # fmt: skip
            if frac == "auto":
                assert est.guarantee_["kind"] == "umbrella", est.guarantee_
                n, f = est.n_calibration_, est.calibration_fraction_
                assert n == 59 or (n > 59 and f == 0.3), (n, f)  # 0.3 if it is enough
            w, b = est.coef_.ravel(), est.intercept_[0]
            pfa[frac].append(norm.cdf(b / np.linalg.norm(w)))
    violations = {f: int(np.sum(np.array(p) > rho)) for f, p in pfa.items()}
    assert violations["auto"] <= worst_allowed(fits), violations
    assert violations[0.3] > worst_allowed(fits), violations  # the test can tell


def test_np_svc_holds_pfa_on_new_data_by_default():
    rng = np.random.default_rng(1)
    fresh = rng.standard_normal((20_000, len(MU)))  # new negatives
    fits, pfa = 100, []
    for k in range(fits):
        X, y = draw(rng, 600)
        with warnings.catch_warnings():  # a DC run that did not settle in max_iter is
            warnings.simplefilter("ignore", BigrateWarning)  # calibrated all the same
            est = NeymanPearsonSVC(rho=RHO, random_state=k).fit(X, y)
        assert est.guarantee_["kind"] == "umbrella"
        pfa.append(np.mean(est.decision_function(fresh) >= 0))
    pfa = np.array(pfa)
    violations = int(np.sum(pfa > RHO))
    assert violations <= worst_allowed(fits), (
        violations,
        np.quantile(pfa, [0.5, 0.95]),
    )


def test_the_fit_says_which_guarantee_it_got():
    rng = np.random.default_rng(2)
    X, y = draw(rng, 1000)
    for cls in (NeymanPearsonSGD, NeymanPearsonSVC):
        g = cls(rho=0.05, random_state=0).fit(X, y).guarantee_
        assert g["kind"] == "umbrella" and g["n_calibration"] >= 59
        assert g["text"].startswith("P(Pfa > 0.05) <= 0.05 on new data")
        # too few held-out negatives for the umbrella: the expected-Pfa rule, and a
        # warning naming the numbers
        with pytest.warns(Warning, match=r"held-out negatives, fewer than the 59"):
            small = cls(rho=0.05, random_state=0).fit(X[:150], y[:150])
        assert small.guarantee_["kind"] == "expected"
        # enough for the umbrella only if more than 30% are held out: held out
        mid = cls(rho=0.05, random_state=0).fit(X[:300], y[:300])
        assert (
            mid.guarantee_["kind"] == "umbrella"
            and mid.guarantee_["n_calibration"] >= 59
        ), mid.guarantee_
        assert 0.3 < mid.calibration_fraction_ <= 0.6
        # none at all: what it says, without a warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kw = {} if cls is NeymanPearsonSVC else {"epochs": 30}
            g = cls(rho=0.2, calibrate=None, random_state=0, **kw).fit(X, y).guarantee_
        assert g["kind"] == "training" and "training data" in g["text"]
