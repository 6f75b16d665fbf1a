"""Shrinking in the SMO solver: the same solution as without it, including problems where
variables are set aside, reactivated by the gradient reconstruction and move again."""

import numpy as np
import pytest
import scipy.sparse as sp

from bigrate.kernel.smo import KernelProblem, cross_kernel


def _problem(seed, scale, n=300, sparse=False, fixed=0.03, svc=False):
    """Per-example boxes, some with negative lower bounds and some fixed (lo = hi), a
    random linear term and a non-zero equality right-hand side; with ``svc`` the boxes
    of a cost-sensitive SVM, [0, C_y]."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4))
    y = np.where(X[:, 0] + 0.8 * rng.standard_normal(n) > 0, 1.0, -1.0)
    lo = -scale * rng.random(n) * (rng.random(n) < 0.3)
    hi = lo + scale * (0.2 + rng.random(n))
    fixed = rng.random(n) < fixed
    hi[fixed] = lo[fixed]
    if svc:
        lo, hi = np.zeros(n), np.where(y > 0, scale, 3.0 * scale)
    p = 1 + 0.2 * rng.random(n)
    starts = {
        "cold": None,
        "hi": hi.copy(),
        "lo": lo.copy(),
        "inside": lo + rng.random(n) * (hi - lo),
    }
    if sparse:
        X[rng.random(X.shape) < 0.4] = 0.0
        X = sp.csr_matrix(X)
    return X, y, lo, hi, p, starts


def _check(X, y, lo, hi, p, a0, kernel, gamma, cache_mb, eps=1e-9, delta=0.2):
    kw = dict(kernel=kernel, gamma=gamma, coef0=1.0, degree=2)
    shr = KernelProblem(X, cache_mb=cache_mb, **kw).solve(
        y, p, lo, hi, delta, alpha0=a0, eps=eps
    )
    ref = KernelProblem(X, **kw).solve(
        y, p, lo, hi, delta, alpha0=a0, eps=eps, shrinking=False
    )
    assert shr.converged and ref.converged
    assert shr.n_reconstructions >= 1 if shr.n_shrunk else True
    Q = np.outer(y, y) * cross_kernel(X, X, kernel, gamma, 1.0, 2)
    a = shr.alpha
    assert np.all(a >= lo) and np.all(a <= hi)
    assert y @ a == pytest.approx(delta, abs=1e-9)
    # the returned gradient is exact on every variable, set aside or not
    np.testing.assert_allclose(shr.gradient, Q @ a - p, rtol=0, atol=1e-9)
    # the stopping rule holds on all variables at the returned point
    mg = -y * (Q @ a - p)
    up = np.where(y > 0, a < hi, a > lo)
    low = np.where(y > 0, a > lo, a < hi)
    assert mg[up].max() - mg[low].min() <= eps * (1 + 1e-6)
    # the same optimum as without shrinking
    obj = 0.5 * a @ Q @ a - p @ a
    assert shr.objective == pytest.approx(obj, rel=1e-12, abs=1e-12)
    assert shr.objective == pytest.approx(ref.objective, rel=1e-10)
    return shr


@pytest.mark.parametrize("start", ["cold", "hi", "lo", "inside"])
@pytest.mark.parametrize("kernel, sparse", [("rbf", False), ("rbf", True),
                                            ("linear", False), ("poly", True)])  # fmt: skip
def test_shrinking_reaches_the_same_optimum(seed, start, kernel, sparse):
    X, y, lo, hi, p, starts = _problem(seed, scale=1.0, sparse=sparse)
    res = _check(X, y, lo, hi, p, starts[start], kernel, 0.7, cache_mb=1)
    assert res.n_shrunk > 0  # the heuristic did set variables aside


@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("sparse", [False, True])
def test_cold_svc_problems_keep_g_bar_and_reach_the_same_optimum(seed, scale, sparse):
    """The boxes of a cost-sensitive SVM from alpha = 0: the reconstruction by libsvm's
    G_bar (kept up to date as variables reach and leave their bounds)."""
    X, y, lo, hi, p, _ = _problem(seed, scale=scale, sparse=sparse, svc=True)
    res = _check(X, y, lo, hi, np.ones(len(y)), None, "rbf", 0.7, cache_mb=1,
                 delta=0.0)  # fmt: skip
    assert res.g_bar and res.n_shrunk > 0 and res.n_reconstructions >= 1


@pytest.mark.parametrize("cache_rows", [3, 300])
def test_variables_set_aside_reenter_and_move(cache_rows):
    """Large boxes and a warm start at the lower bounds: many iterations, shrinking
    early, and set-aside variables that become violating again and move after the
    reconstruction (counted by the solver); with a 3-row cache partial rows are
    evicted and recomputed all along."""
    X, y, lo, hi, p, starts = _problem(0, scale=100.0)
    res = _check(X, y, lo, hi, p, starts["lo"], "rbf", 0.05,
                 cache_mb=cache_rows * 8 * len(y) / 2**20)  # fmt: skip
    assert res.n_reentered >= 1
    assert res.n_reconstructions >= 2


def test_warm_gradient_from_a_previous_solution_is_the_same_start(seed):
    """Qa0 (Q alpha0 carried over) starts from the same gradient as recomputing it,
    when the new boxes move some of the previous duals, at fewer kernel rows; the
    solves reach the same optimum (their paths may part on rounding-level ties)."""
    X, y, lo, hi, p, _ = _problem(seed, scale=1.0)
    prob = KernelProblem(X, gamma=0.7, cache_mb=1)
    first = prob.solve(y, p, lo, hi, 0.2, eps=1e-10)
    hi2 = hi * np.where(np.arange(len(y)) % 3 == 0, 0.5, 1.0)  # clips a third
    hi2 = np.maximum(hi2, lo)
    carried = prob.solve(y, p, lo, hi2, 0.2, alpha0=first.alpha,
                         Qa0=first.gradient + p, eps=1e-10)  # fmt: skip
    fresh = KernelProblem(X, gamma=0.7, cache_mb=1).solve(
        y, p, lo, hi2, 0.2, alpha0=first.alpha, eps=1e-10
    )
    assert carried.objective == pytest.approx(fresh.objective, rel=1e-12)
    np.testing.assert_allclose(carried.alpha, fresh.alpha, rtol=0, atol=1e-6)
    Q = np.outer(y, y) * cross_kernel(X, X, "rbf", 0.7, 0, 3)
    np.testing.assert_allclose(carried.gradient, Q @ carried.alpha - p, atol=1e-9)
    with pytest.raises(ValueError, match="Qa0 has shape"):
        prob.solve(y, p, lo, hi, 0.2, alpha0=first.alpha, Qa0=np.zeros(3))


def test_a_warm_start_an_ulp_outside_its_box_is_counted_once():
    """feasible_point lands exactly on a bound when it uses a variable's whole room (a
    sum can miss it by an ulp, and a value outside its box was neither free nor at a
    bound for the gradient reconstruction: every set-aside gradient came out wrong).
    The problem is the one where this was found."""
    rng = np.random.default_rng(5)
    n = 400
    X = rng.standard_normal((n, 4))
    y = np.where(X[:, 0] + 0.8 * rng.standard_normal(n) > 0, 1.0, -1.0)
    lo = -rng.random(n) * (rng.random(n) < 0.3)
    hi = lo + 0.2 + rng.random(n)
    fixed = rng.random(n) < 0.05
    hi[fixed] = lo[fixed]
    p = 1 + 0.2 * rng.random(n)
    _check(X, y, lo, hi, p, hi.copy(), "rbf", 0.7, cache_mb=100)
