"""The NP-SVM's multiplier search: a bounded number of DC steps over the whole C range
a sweep walks, with training Pfa in the band (or, where Pfa jumps across it, on its
feasible side), where the paper's gain rule takes tens of steps or does not settle."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification

from bigrate import NeymanPearsonSVC


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=600, n_features=10, weights=[0.3, 0.7],
                               random_state=0)  # fmt: skip
    return X, np.where(y == 1, 1, -1)


@pytest.mark.parametrize("mult", [0.01, 0.1, 1.0, 10.0, 100.0])
def test_dc_steps_stay_bounded_over_c(data, mult):
    X, y = data
    n_pos = int((y > 0).sum())
    kw = dict(rho=0.1, C=mult * n_pos, gamma=0.1, max_iter=300)
    m = NeymanPearsonSVC(**kw).fit(X, y)
    assert m.converged_ and m.n_iter_ <= 25, (m.n_iter_, m.history_[-1]["pfa"])
    last = m.history_[-1]
    assert last["pfa"] <= 0.1 + m.epsilon
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = NeymanPearsonSVC(multiplier_update="gain", **kw).fit(X, y)
    # no worse than the paper's rule where both settle
    if g.converged_:
        assert last["pnd"] <= g.history_[-1]["pnd"] + 0.02
    if mult == 100.0:  # from Pfa = 0 the gain rule shrinks lambda by 0.9 a step
        assert g.n_iter_ >= 2 * m.n_iter_


def test_a_pfa_jump_ends_on_the_feasible_side(data):
    """At a tiny C the classifier is nearly constant and the training Pfa jumps from
    about 1 to about 0 as lambda grows, never entering the band: the search closes its
    bracket and stops on the side where Pfa <= rho."""
    X, y = data
    n_pos = int((y > 0).sum())
    m = NeymanPearsonSVC(rho=0.1, C=0.01 * n_pos, gamma=0.1).fit(X, y)
    pfas = [h["pfa"] for h in m.history_]
    assert not any(abs(p - 0.1) <= m.epsilon for p in pfas), pfas
    assert max(pfas) > 0.5 and m.converged_ and pfas[-1] <= 0.1, pfas


def test_an_unreachable_band_stops_with_a_warning():
    """Negatives on both sides of the positives: no linear classifier has Pfa below
    0.5 here. The fit stops (no multiplier run-away) and says it did not converge."""
    from bigrate import BigrateWarning

    rng = np.random.default_rng(0)
    X = np.r_[rng.normal(0, 0.3, (60, 2)), rng.normal(4, 0.01, (20, 2)),
              rng.normal(-4, 0.01, (20, 2))]  # fmt: skip
    y = np.r_[np.ones(60), -np.ones(40)]
    with pytest.warns(BigrateWarning, match="did not converge"):
        m = NeymanPearsonSVC(
            rho=0.2, C=0.5, kernel="linear", max_iter=200, calibrate=None
        ).fit(X, y)
    assert not m.converged_ and m.n_iter_ < 60
    assert max(h["lambda"] for h in m.history_) < 1e30


@pytest.mark.parametrize("start", [50.0, 1 / 50])
def test_the_search_steps_towards_the_band_along_the_pfa_slope(start):
    """Before a bracket exists, lambda moves by the slope of logit(Pfa) in log lambda
    over the last two steps (aimed at rho), never further than the growing factors
    2, 4, 8, 16: on a smooth Pfa curve the band is reached in a few steps from 50x too
    large or too small a multiplier (the factors alone overshoot: 50x lies between
    2 * 4 and 2 * 4 * 8, and the secant search takes over from there)."""
    from bigrate.kernel.svc import _MultiplierSearch

    rho, eps, star = 0.1, 0.01, 1000.0

    def pfa(lam):  # logistic in log lambda, decreasing, rho at lambda = star
        z = np.log(rho / (1 - rho)) - 1.5 * np.log(lam / star)
        return float(1 / (1 + np.exp(-z)))

    search, lam, seen = _MultiplierSearch(rho, eps), start * star, []
    while abs(pfa(lam) - rho) > eps:
        new = search.next(lam, pfa(lam), settled=True)
        assert max(new / lam, lam / new) <= 2.0 ** min(len(seen) + 1, 4) * (1 + 1e-12)
        seen.append(lam)
        lam = new
        assert len(seen) <= 3, [(round(v), round(pfa(v), 4)) for v in seen]
    assert len(seen) <= 3
