"""Exact AUM/AUC line search against brute force; the AUM subgradient; the learner."""

import numpy as np
import pytest

from bigrate.aum import (
    AUMLinearClassifier,
    Breakpoints,
    aum_auc,
    aum_gradient,
    line_search,
    plot_line_search,
)
from bigrate.aum._kernels import aum_auc_at


def brute(bp, pred, d, s):
    c, m = bp.lines(pred, d)
    return aum_auc_at(c, m, bp.dfp, bp.dfn, s)


@pytest.mark.parametrize("variant", ["first-min", "linear", "quadratic"])
@pytest.mark.parametrize("rounding", [None, 1, 0])  # 0 and 1 decimals make exact ties
def test_line_search_equals_brute_force(seed, variant, rounding):
    rng = np.random.default_rng(seed)
    n = 120
    y = np.where(rng.random(n) < 0.4, 1, -1)
    pred, d = rng.standard_normal(n), rng.standard_normal(n)
    if rounding is not None:
        pred, d = np.round(pred, rounding), np.round(d, rounding)
    bp = Breakpoints.binary(y)
    r = line_search(y, pred, d, variant=variant)
    assert r.step_sizes[0] == 0 and np.all(np.diff(r.step_sizes) > 0)
    # inside the pieces (exactly at an intersection tied thresholds make one diagonal ROC
    # segment, which aum_auc gives; the pieces hold on their open intervals)
    ss = np.r_[rng.random(300) * r.step_sizes[-1] + 1e-12, r.step_sizes[:-1] + 1e-9]
    for s in ss:
        a, u = brute(bp, pred, d, s)
        assert r.aum_at(s) == pytest.approx(a, abs=1e-9)
        assert r.auc_at(s) == pytest.approx(u, abs=1e-9)
    # AUM is continuous and its value at the pieces' starts is exact too
    for s, a in zip(r.step_sizes, r.aum):
        assert a == pytest.approx(brute(bp, pred, d, s)[0], abs=1e-9)
    if variant == "first-min":  # the exact minimiser along the direction (AUM convex)
        best = r.best_step()
        grid = np.linspace(0, 2 * max(r.step_sizes[-1], 1e-3), 2000)
        assert (
            brute(bp, pred, d, best)[0]
            <= min(brute(bp, pred, d, s)[0] for s in grid) + 1e-9
        )
    if variant == "quadratic":  # every intersection: the last piece is final
        big = r.step_sizes[-1] * 10 + 10
        assert r.aum_at(big) == pytest.approx(
            brute(bp, pred, d, big)[0], rel=1e-9, abs=1e-9
        )


@pytest.mark.parametrize("rounding", [None, 1, 0])
def test_bracketed_first_min_finds_the_same_minimum(seed, rounding):
    """bracket=True locates the minimum by sorted evaluations and follows the path only
    near it: the same minimiser and AUM as following it from 0, exact pieces from its
    start on, and far fewer intersections processed."""
    rng = np.random.default_rng(seed)
    n = 400
    y = np.where(rng.random(n) < 0.3, 1, -1)
    pred, d = rng.standard_normal(n), rng.standard_normal(n) + 0.5 * y
    if rounding is not None:
        pred, d = np.round(pred, rounding), np.round(d, rounding)
    bp = Breakpoints.binary(y)
    full = line_search(y, pred, d, variant="first-min")
    near = line_search(y, pred, d, variant="first-min", bracket=True)
    best = near.best_step()
    assert best == pytest.approx(full.best_step(), rel=1e-9, abs=1e-12)
    assert near.aum_at(best) == pytest.approx(full.aum.min(), rel=1e-9, abs=1e-12)
    assert near.aum_at(best) == pytest.approx(brute(bp, pred, d, best)[0], abs=1e-9)
    assert near.intersections <= full.intersections
    for s in np.r_[near.step_sizes[:-1] + 1e-9, best]:
        a, u = brute(bp, pred, d, s)
        assert near.aum_at(s) == pytest.approx(a, abs=1e-9)
        if s != best:
            assert near.auc_at(s) == pytest.approx(u, abs=1e-9)
    if near.step_sizes[0] > 0:
        with pytest.raises(ValueError, match="where this search's pieces start"):
            near.aum_at(0.0)


def test_bracketed_search_processes_few_intersections():
    rng = np.random.default_rng(7)
    n = 3000
    X = rng.standard_normal((n, 5))
    y = np.where(X[:, 0] + rng.standard_normal(n) > 0, 1, -1)
    pred = X @ (1e-3 * rng.standard_normal(5))  # far from the minimum, as a first step
    d = X @ -(X.T @ aum_gradient(pred, Breakpoints.binary(y)))
    full = line_search(y, pred, d, variant="first-min")
    near = line_search(y, pred, d, variant="first-min", bracket=True)
    assert near.best_step() == pytest.approx(full.best_step(), rel=1e-9)
    assert full.intersections > 100_000 and near.intersections < n


def test_many_lines_meeting_at_one_point():
    # lines T = -(p + s d) all through the same point at s = 1: p + d = 0.5
    rng = np.random.default_rng(3)
    n = 40
    y = np.where(np.arange(n) % 3 == 0, 1, -1)
    d = rng.standard_normal(n)
    pred = 0.5 - d
    bp = Breakpoints.binary(y)
    r = line_search(y, pred, d, variant="quadratic")
    assert 1.0 in set(np.round(r.step_sizes, 12))
    for s in (0.5, 0.999, 1.001, 3.0):
        a, u = brute(bp, pred, d, s)
        assert r.aum_at(s) == pytest.approx(a, abs=1e-9)
        assert r.auc_at(s) == pytest.approx(u, abs=1e-9)


def test_subgradient_matches_finite_differences(seed):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(60) < 0.5, 1, -1)
    pred = rng.standard_normal(60)  # distinct values: away from ties
    bp = Breakpoints.binary(y)
    g = aum_gradient(pred, bp)
    h = 1e-7
    for i in range(60):
        e = np.zeros(60)
        e[i] = h
        fd = (aum_auc(pred + e, bp)[0] - aum_auc(pred - e, bp)[0]) / (2 * h)
        assert g[i] == pytest.approx(fd, abs=1e-6)


def test_changepoint_error_functions_loop_to_auc_two(tmp_path):
    """Non-monotonic FN (a changepoint that disappears from model size 1 to 2) makes the
    ROC curve loop: AUC = 2 at these predictions, in the line search and by brute force."""
    bp = Breakpoints.from_error_functions(
        example=[0, 0, 0, 1, 1, 1],
        threshold=[-np.inf, -1.0, 1.0, -np.inf, -1.0, 1.0],
        fp=[0, 0, 0, 0, 2, 1],
        fn=[0, 2, 0, 1, 0, 0],
    )
    target = np.array([-3.0, -2.5])
    assert aum_auc(target, bp)[1] == pytest.approx(2.0)
    start = np.array([1.0, 0.5])
    r = line_search(bp, start, target - start, variant="quadratic")
    assert r.auc_at(1.0 + 1e-9) == pytest.approx(
        brute(bp, start, target - start, 1.0 + 1e-9)[1]
    )
    assert max(r.auc) >= 2.0 - 1e-12 or r.auc_at(1.0 + 1e-9) == pytest.approx(2.0)
    plot_line_search(r, tmp_path / "ls.png", bp, start, target - start)
    assert (tmp_path / "ls.png").stat().st_size > 1000


def test_learner_decreases_aum_every_step(seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((400, 6))
    y = np.where(X[:, 0] - 0.5 * X[:, 1] + 0.5 * rng.standard_normal(400) > 0, 1, -1)
    for ls, bracket in (("first-min", True), ("first-min", False), ("linear", False),
                        ("quadratic", False), ("grid", False)):  # fmt: skip
        clf = AUMLinearClassifier(
            line_search=ls, bracket=bracket, max_iter=15, validation=0.25,
            random_state=seed,
        ).fit(X, y)  # fmt: skip
        aums = [h["aum"] for h in clf.history_]
        assert all(b <= a + 1e-12 for a, b in zip(aums, aums[1:])), (ls, aums)
        vals = [h["validation_auc"] for h in clf.history_]
        assert clf.best_validation_auc_ == max(vals)
        if ls == "linear":  # small steps (B intersections): slower, as in the paper
            assert vals[-1] > vals[0]
        else:
            assert clf.best_validation_auc_ > 0.85
        assert set(clf.predict(X)) <= {-1, 1}


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: line_search(
                [1, -1, 1], [0.0, 1.0, 2.0], [1.0, 0.0, 1.0], variant="cubic"
            ),
            "variant must be one of",
        ),
        (
            lambda: line_search([1, 1, 1], [0.0, 1.0, 2.0], [1.0, 0.0, 1.0]),
            "both classes",
        ),
        (lambda: line_search([1, -1], [0.0, np.nan], [1.0, 0.0]), "finite"),
        (
            lambda: line_search(
                [1, -1], [0.0, 1.0], [1.0, 0.0], "linear", bracket=True
            ),
            'bracket=True needs variant="first-min"',
        ),
        (
            lambda: line_search(
                Breakpoints.from_error_functions(
                    [0, 0, 0, 1, 1],
                    [-np.inf, 0.0, 1.0, -np.inf, 0.5],
                    [0, 1, 0, 0, 1],
                    [1, 1, 0, 1, 0],
                ),
                [0.0, 1.0],
                [1.0, -1.0],
                bracket=True,
            ),
            "bracket=True needs binary-classification breakpoints",
        ),
        (
            lambda: Breakpoints.from_error_functions(
                [0, 0], [-np.inf, 0.0], [1, 0], [1, 0]
            ),
            "FP does not start at 0",
        ),
        (
            lambda: Breakpoints.from_error_functions(
                [0, 0], [-np.inf, 0.0], [0, 1], [1, 1]
            ),
            "FN does not end at 0",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def independent_aum(y, pred):
    """The AUM by its definition, with NumPy only: the threshold tau sweeps the real
    line; a negative is a false positive once tau >= -pred (FP rate counts them / n-),
    a positive a false negative while tau < -pred (/ n+); integrate min(FP, FN) over
    the intervals between consecutive thresholds, where both are constant."""
    y, t = np.asarray(y), -np.asarray(pred, dtype=float)
    ts = np.unique(t)
    mids = (ts[:-1] + ts[1:]) / 2
    fp = ((y < 0)[None, :] & (t[None, :] <= mids[:, None])).sum(1) / (y < 0).sum()
    fn = ((y > 0)[None, :] & (t[None, :] > mids[:, None])).sum(1) / (y > 0).sum()
    return float(np.sum(np.minimum(fp, fn) * np.diff(ts)))


@pytest.mark.parametrize("rounding", [None, 1])  # 1 decimal: many tied predictions
def test_aum_and_auc_against_outside_references(seed, rounding):
    """The package's AUM against the definition's integral, its AUC against
    scikit-learn's roc_auc_score (ties count one half in both), at predictions and
    along a line search's pieces."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    n = 90
    y = np.where(rng.random(n) < 0.35, 1, -1)
    pred, d = rng.standard_normal(n) + 0.8 * y, rng.standard_normal(n)
    if rounding is not None:
        pred, d = np.round(pred, rounding), np.round(d, rounding)
    bp = Breakpoints.binary(y)
    a, u = aum_auc(pred, bp)
    assert a == pytest.approx(independent_aum(y, pred), abs=1e-12)
    assert u == pytest.approx(roc_auc_score(y, pred), abs=1e-12)
    r = line_search(y, pred, d, variant="quadratic")
    for s in rng.random(40) * r.step_sizes[-1] * 1.5:
        f = pred + s * d
        assert r.aum_at(s) == pytest.approx(independent_aum(y, f), abs=1e-9)
        assert r.auc_at(s) == pytest.approx(roc_auc_score(y, f), abs=1e-9)
