"""Rate metrics against brute-force counts; the umbrella threshold's binomial rule."""

import math

import numpy as np
import pytest

from bigrate.metrics import (
    Confusion,
    j_val,
    np_umbrella_order,
    np_umbrella_threshold,
    pfa_pnd,
    positives_at_q,
    qvalues,
    roc_points,
)


def test_pfa_pnd_ties_count_as_errors_for_both():
    y = np.array([1, 1, -1, -1, -1])
    f = np.array([0.0, 2.0, 0.0, -1.0, 3.0])
    assert pfa_pnd(y, f) == (2 / 3, 1 / 2)
    assert Confusion.of(y[:2], f[:2]) + Confusion.of(y[2:], f[2:]) == Confusion.of(y, f)
    assert j_val(0.1, 0.2, 0.05) == pytest.approx(0.2 + 0.05 / 0.05)
    assert j_val(0.01, 0.2, 0.05) == 0.2


def brute_qvalues(y, f, plus_one=False):
    out = np.empty(len(y))
    for i in range(len(y)):
        best = np.inf
        for t in f[f <= f[i]]:  # every threshold at or below this score
            above = f >= t
            p, n = (above & (y > 0)).sum(), (above & (y < 0)).sum() + plus_one
            if p:
                best = min(best, n / p)
        out[i] = best
    return out


@pytest.mark.parametrize("plus_one", [False, True])
def test_qvalues_match_brute_force_with_ties(seed, plus_one):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(120) < 0.6, 1, -1)
    f = np.round(rng.normal(y * 0.8, 1.0), 1)  # rounding makes ties
    np.testing.assert_allclose(
        qvalues(y, f, plus_one=plus_one), brute_qvalues(y, f, plus_one)
    )
    q = 0.1
    want = int(((brute_qvalues(y, f, plus_one) <= q) & (y > 0)).sum())
    assert positives_at_q(y, f, q, plus_one=plus_one) == want
    # invariance: row order does not matter
    perm = rng.permutation(120)
    assert positives_at_q(y[perm], f[perm], q, plus_one=plus_one) == want


def test_roc_points_end_at_one():
    y = np.array([1, -1, 1, -1])
    fpr, tpr, thr = roc_points(y, np.array([0.9, 0.8, 0.3, 0.1]))
    np.testing.assert_allclose(fpr, [0, 0, 0.5, 0.5, 1])
    np.testing.assert_allclose(tpr, [0, 0.5, 0.5, 1, 1])


def test_umbrella_order_is_the_binomial_rule():
    n, rho, delta = 200, 0.05, 0.05
    k = np_umbrella_order(n, rho, delta)

    def tail(k):  # P(Binomial(n, 1 - rho) >= k), summed exactly
        return sum(
            math.comb(n, j) * (1 - rho) ** j * rho ** (n - j) for j in range(k, n + 1)
        )

    assert tail(k) <= delta < tail(k - 1)
    s = np.arange(n, dtype=float)[::-1]
    assert np_umbrella_threshold(s, rho, delta) == float(k - 1)
    with pytest.raises(ValueError, match="needs at least 59 held-out negatives"):
        np_umbrella_order(58, 0.05, 0.05)


def test_umbrella_guarantee_holds_in_repeated_draws():
    """P(Pfa > rho) <= delta over draws of the held-out negatives (scores ~ N(0, 1))."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    rho, delta, n = 0.1, 0.1, 300
    over = 0
    for _ in range(400):
        t = np_umbrella_threshold(rng.standard_normal(n), rho, delta)
        over += norm.sf(t) > rho
    assert over / 400 <= delta + 0.03


def test_bad_metric_input():
    with pytest.raises(ValueError, match="labels must be"):
        pfa_pnd([0, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        pfa_pnd([1, -1], [np.nan, 0.2])
    with pytest.raises(ValueError, match="q must be in"):
        positives_at_q([1, -1], [1.0, 0.0], 1.5)
