"""QuantilePathSVC: the recovered solution at any tau is the optimum (against an
independent L-BFGS-B solve of the dual), KKT holds, the path is continuous, and the
bookkeeping (kinks, save/load, sparse vs dense, merged duplicates) is consistent."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize

from bigrate import QuantilePathSVC, load_model


def _data(n=160, d=4, seed=0, noise=0.8):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.where(X[:, 0] - 0.5 * X[:, 1] + noise * rng.standard_normal(n) > 0, 1, -1)
    return X, y


def _direct_dual(X, y, tau, lam):
    """min 1/(2 lam) a^T Q a - sum(a), 0 <= a <= c(tau), by L-BFGS-B (bias column)."""
    n = len(y)
    Z = y[:, None] * np.hstack([X, np.ones((n, 1))])
    Q = Z @ Z.T
    c = np.where(y > 0, 2 * (1 - tau) / n, 2 * tau / n)

    def f(a):
        Qa = Q @ a
        return 0.5 / lam * a @ Qa - a.sum(), Qa / lam - 1.0

    r = minimize(
        f,
        np.zeros(n),
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(np.zeros(n), c)),
        options={"ftol": 1e-15, "gtol": 1e-13, "maxiter": 50000},
    )
    return r.fun


@pytest.fixture(scope="module")
def fitted():
    X, y = _data()
    return X, y, QuantilePathSVC(alpha=1e-2).fit(X, y)


def test_recovered_dual_matches_direct_solve_at_20_random_taus(fitted):
    X, y, path = fitted
    rng = np.random.default_rng(1)
    for tau in rng.uniform(0, 1, 20):
        ours = path.dual_objective_at(tau)
        ref = _direct_dual(X, y, tau, 1e-2)
        # the path is exact; L-BFGS-B is the looser of the two
        assert ours <= ref + 1e-9
        assert abs(ours - ref) <= 1e-6 * abs(ref), (tau, ours, ref)


def test_kkt_conditions_hold_on_the_path(fitted):
    X, y, path = fitted
    n = len(y)
    Xa = np.hstack([X, np.ones((n, 1))])
    for tau in np.r_[np.random.default_rng(2).uniform(0, 1, 10), path.kinks_[5:8]]:
        a = path.dual_coef_at(tau)
        coef, b = path.coef_at(tau)
        w = np.r_[coef, b]
        # primal-dual link w = (1/lambda) sum a_i y_i x_i
        np.testing.assert_allclose(w, (a * y) @ Xa / 1e-2, atol=1e-9)
        c = np.where(y > 0, 2 * (1 - tau) / n, 2 * tau / n)
        assert (a >= -1e-12).all() and (a <= c + 1e-12).all()
        margin = y * (Xa @ w)
        scale = c.max()
        inside = (a > 1e-9 * scale) & (a < c - 1e-9 * scale)
        assert np.abs(margin[inside] - 1).max() < 1e-7
        assert (margin[a <= 1e-9 * scale] >= 1 - 1e-7).all()
        assert (margin[a >= c - 1e-9 * scale] <= 1 + 1e-7).all()


def _duality_gap(path, X, y, tau, lam):
    """P(w) + D(alpha) >= 0 for any w and feasible alpha, with equality only at the
    optimum: a certificate that needs no solver. Returns (gap, scale, box violation,
    link error)."""
    n = len(y)
    Xa = np.hstack([X, np.ones((n, 1))])
    a = path.dual_coef_at(tau)
    c = np.where(y > 0, 2 * (1 - tau) / n, 2 * tau / n)
    coef, b = path.coef_at(tau)
    w = np.r_[coef, b]
    primal = lam / 2 * w @ w + (c * np.maximum(0.0, 1 - y * (Xa @ w))).sum()
    dual = path.dual_objective_at(tau)
    box = max((-a).max(), (a - c).max())
    link = np.abs(w - (a * y) @ Xa / lam).max()
    return primal + dual, abs(dual), box, link


def test_plateaus_of_a_low_dimensional_set_are_crossed_exactly():
    """n >> d: w stays constant on long stretches of tau while the dual moves over a
    large tie set (at tau = 0 every positive is on the margin of the constant
    classifier). The follower used to creep through such stretches in tiny steps (this
    set did not finish in 60 s); each is now one segment from a linear programme. The
    recovered solution is certified optimal by a zero duality gap (L-BFGS-B stalls on
    these flat duals: at tau = 0.14 of a similar set it stopped at -0.080 against the
    optimum -0.303)."""
    X, y = _data(n=300, d=20, noise=2.0)
    path = QuantilePathSVC(alpha=1e-3).fit(X, y)
    assert path.diagnostics_["plateaus_crossed"] > 0
    first = path.kinks_[1]  # the end of the plateau that starts at tau = 0
    taus = np.r_[np.random.default_rng(4).uniform(0, 1, 20), first / 3, first / 2]
    for tau in taus:
        gap, scale, box, link = _duality_gap(path, X, y, tau, 1e-3)
        assert abs(gap) <= 1e-9 * max(scale, 1.0), (tau, gap)
        assert box <= 1e-12 and link <= 1e-9, (tau, box, link)
        # the estimator's own certificate is this gap
        assert path.duality_gap_at(tau) == pytest.approx(
            gap / max(scale, 1.0), abs=1e-15
        )
    # and the fixture's set agrees with the independent L-BFGS-B solve (above) while
    # crossing plateaus too
    X, y = _data()
    assert QuantilePathSVC(alpha=1e-2).fit(X, y).diagnostics_["plateaus_crossed"] > 0


def _one_hot(n=300, levels=(3, 4, 3, 5, 2, 4), seed=0):
    """Categorical data one-hot encoded (like a9a): many rows share a score, so the
    margin set grows past the rank d and the dual direction is not unique."""
    rng = np.random.default_rng(seed)
    cols, score = [], np.zeros(n)
    for k in levels:
        c = rng.integers(0, k, n)
        cols.append(np.eye(k)[c])
        score += rng.standard_normal(k)[c]
    y = np.where(score + 0.8 * rng.standard_normal(n) > 0, 1, -1)
    return np.hstack(cols), y


@pytest.mark.parametrize("seed", [0, 1])
def test_dense_and_cg_directions_give_the_same_certified_path(seed):
    """On tie-heavy one-hot data the dense route solves directions in the primal
    (|M| above the rank) and both routes' solutions are certified optimal by a zero
    duality gap at random tau; w(tau) is unique, so the two paths give the same
    classifier even though their dual paths (and kinks) differ. The primal
    directions project out the unbounded columns through their Gram matrix's
    Cholesky factor; on seed 1 one direction has dependent unbounded columns and
    takes the eigendecomposition."""
    X, y = _one_hot(seed=seed)
    lam = 1e-3
    dense = QuantilePathSVC(alpha=lam, direction="dense").fit(X, y)
    cg = QuantilePathSVC(alpha=lam, direction="cg").fit(X, y)
    dg = dense.diagnostics_
    assert dg["primal_directions"] > dg["primal_dependent_directions"]
    assert (dg["primal_dependent_directions"] > 0) == (seed == 1)
    assert cg.diagnostics_["primal_directions"] == 0
    assert dense.path_summary()["n_margin"].max() > X.shape[1] + 1  # |M| > rank
    for tau in np.random.default_rng(1).uniform(0, 1, 20):
        for path in (dense, cg):
            gap, scale, box, link = _duality_gap(path, X, y, tau, lam)
            # the certificate on the merged rows (one-hot rows repeat) is the gap on
            # the rows as given
            rel = path.duality_gap_at(tau)
            assert rel == pytest.approx(gap / max(scale, 1.0), abs=1e-15)
            assert abs(rel) <= 1e-9, (path.direction, tau, rel)
            assert box <= 1e-12 and link <= 1e-9, (path.direction, tau, box, link)
        wd = np.r_[dense.coef_at(tau)[0], dense.coef_at(tau)[1]]
        wc = np.r_[cg.coef_at(tau)[0], cg.coef_at(tau)[1]]
        assert np.abs(wd - wc).max() <= 1e-7 * max(1.0, np.abs(wc).max()), tau
    # at every kink, too: the dependent direction's segment included
    for tau in dense.kinks_[1:-1:3]:
        assert abs(dense.duality_gap_at(tau)) <= 1e-9, tau


def test_nnls_and_box_qp_kernels_match_reference_solvers():
    """The direction's two dense solvers against scipy: Lawson-Hanson NNLS (over sparse
    columns, optionally projected out of a basis or of independent columns' span,
    with their least-squares fit) against scipy.optimize.nnls and lstsq, the
    Cholesky active set against L-BFGS-B on random boxed QPs (free, lower-bounded and upper-bounded
    variables mixed)."""
    from scipy.optimize import nnls as scipy_nnls

    from bigrate.quantile import _kernels as K
    from bigrate.solvers.least_squares import factor_lsq, nnls

    rng = np.random.default_rng(0)
    for trial in range(200):
        d, p = int(rng.integers(2, 12)), int(rng.integers(1, 20))
        C = rng.standard_normal((d, p))
        C[rng.uniform(size=C.shape) < 0.3] = 0.0  # sparse columns
        t = rng.standard_normal(d)
        # the kernel reads C's columns as signed sparse rows and minimises the
        # residual projected on the complement of a span with orthonormal basis P:
        # the reference solves min ||P^T C z - P^T t||
        sgn = rng.choice([-1.0, 1.0], p)
        rows = sp.csr_matrix((C * sgn).T)
        Xt = (rows.indptr.astype(np.int64), rows.indices.astype(np.int64),
              rows.data, np.ones(p), np.ones(p))  # fmt: skip
        # no projection (trial % 3 == 0), a random orthonormal basis P of the
        # complement (1), or the complement of the span of random independent
        # sparse columns A_U given by the Cholesky factor of their Gram matrix (2)
        none, ui, us = np.zeros((0, 0)), np.zeros(0, np.int64), np.zeros(0)
        mode = trial % 3
        if mode == 0:
            R, P = (none, none, ui, us), np.eye(d)
        elif mode == 1:
            f = int(rng.integers(1, d + 1))
            P = np.ascontiguousarray(
                np.linalg.qr(rng.standard_normal((d, d)))[0][:, :f]
            )
            R = (P, none, ui, us)
        else:
            nu = int(rng.integers(1, d))
            A = rng.standard_normal((d, nu))
            A[rng.uniform(size=A.shape) < 0.3] = 0.0
            A[rng.integers(0, d, nu), np.arange(nu)] += 3.0  # independent columns
            U = sp.csr_matrix(np.c_[C * sgn, A].T)
            Xt = (U.indptr.astype(np.int64), U.indices.astype(np.int64), U.data,
                  np.ones(p + nu), np.ones(p + nu))  # fmt: skip
            ucols = np.arange(p, p + nu)
            KU = (np.zeros((d, d)), np.zeros(d, np.int64), np.zeros(3, np.int64),
                  np.zeros(p + nu, np.int64))  # fmt: skip
            order = np.zeros(nu, np.int64)
            kind0 = np.zeros(nu, np.int8)
            assert K._unbounded_factor(Xt, ucols, nu, kind0, KU, -1, 0, d, order) == nu
            np.testing.assert_array_equal(order, np.arange(nu))
            L = KU[0]
            # the reference's basis of the complement of range(A): from an SVD
            P = np.linalg.svd(A, full_matrices=True)[0][:, nu:]
            R = (none, L, ucols, np.ones(nu))
        z, _ = nnls(Xt, np.arange(p), sgn, p, R, t, 1e-12, 10 * p + 50)
        ref, _ = scipy_nnls(P.T @ C, P.T @ t)
        assert (z >= 0).all()
        got = np.linalg.norm(P.T @ (C @ z - t))
        assert got <= np.linalg.norm(P.T @ (C @ ref - t)) + 1e-10
        if mode == 2:
            # and the least-squares fit of the rest on A_U, against lstsq
            rest = t - C @ z
            a = np.empty(nu)
            factor_lsq(Xt, R, rest, a)
            ref_a = np.linalg.lstsq(A, rest, rcond=None)[0]
            np.testing.assert_allclose(a, ref_a, rtol=1e-9, atol=1e-10)
    worked = 0
    for _ in range(100):
        m = int(rng.integers(1, 25))
        A = rng.standard_normal((m + int(rng.integers(0, 10)), m))
        G, b = A.T @ A, rng.standard_normal(m)
        kind = rng.integers(0, 3, m).astype(np.int8)
        h = rng.uniform(-1.0, 1.0, m)
        x, pin = np.zeros(m), np.zeros(m, np.int8)
        # the free part's factor as the path forms it anew (no rows kept yet)
        KF = (np.zeros((m, m)), np.zeros(m, np.int64), np.zeros(2, np.int64))
        rows, free = np.arange(m), np.zeros(m, np.int64)
        nf = K._kept_free_factor(G, rows, m, rows, kind, KF, free, 1e-10, 0)
        assert nf == int((kind == 0).sum())
        kept = KF[0][:nf, :nf].copy()
        ok, steps = K._box_qp_from(G, b, m, kind, h, x, pin, 1e-10, KF[0], free, nf)
        assert ok
        worked += int(steps >= 3)  # releases and pins below the kept lines
        # the kept factor's lines are left as they were: the QP works below them
        np.testing.assert_array_equal(np.tril(KF[0][:nf, :nf]), np.tril(kept))
        lo = np.where(kind == 1, 0.0, -np.inf)
        hi = np.where(kind == 2, h, np.inf)
        assert (x >= lo - 1e-12).all() and (x <= hi + 1e-12).all()
        r = minimize(
            lambda a, G=G, b=b: (0.5 * a @ G @ a - b @ a, G @ a - b),
            np.clip(np.zeros(m), lo, hi),
            jac=True,
            method="L-BFGS-B",
            bounds=list(zip(lo, hi)),
            options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10000},
        )
        f = 0.5 * x @ G @ x - b @ x
        assert f <= r.fun + 1e-8 * max(1.0, abs(r.fun))
    assert worked >= 10


def test_kept_unbounded_factor_matches_the_gram_matrix_of_the_current_columns():
    """The primal route's factor of the unbounded columns, kept between calls: over
    a random sequence of margin sets (columns entering and leaving U, positions
    reshuffled), its lines' columns are exactly U's, and L L^T is their Gram
    matrix in the factor's order; a new generation of slots or max_calls calls
    form it anew; dependent columns report -1."""
    from bigrate.quantile import _kernels as K

    rng = np.random.default_rng(3)
    n, d = 60, 12
    A = sp.random(n, d, density=0.3, random_state=4, format="csr")
    A = (A + sp.eye(n, d, format="csr")).tocsr()  # no empty rows
    A = sp.vstack([A[:50], A[:10]]).tocsr()  # rows 50-59 repeat 0-9: dependent
    y = rng.choice([-1.0, 1.0], n)
    Xt = (A.indptr.astype(np.int64), A.indices.astype(np.int64), A.data, y,
          np.ones(n))  # fmt: skip
    Ad = A.toarray() * y[:, None]
    KU = (np.zeros((d, d)), np.zeros(d, np.int64), np.zeros(3, np.int64),
          np.zeros(n, np.int64))  # fmt: skip
    kept, dependent = 0, 0
    for call in range(80):
        m = int(rng.integers(d, 3 * d))
        ml = rng.choice(n, m, replace=False)
        kind = rng.choice(np.array([0, 1, 2], np.int8), m, p=[0.2, 0.4, 0.4])
        if call % 7:
            # mostly the last call's unbounded rows, a few changed
            prev = KU[1][: int(KU[2][0])]
            keep = prev[rng.uniform(size=len(prev)) < 0.8]
            ml = np.r_[keep, np.setdiff1d(ml, keep)][:m]
            rng.shuffle(ml)
            kind = np.where(np.isin(ml, keep), 0, kind).astype(np.int8)
        nu = int((kind == 0).sum())
        order = np.zeros(nu, np.int64)
        before = int(KU[2][1])
        gen = call // 40
        nl = K._unbounded_factor(Xt, ml, m, kind, KU, gen, 10, d, order)
        rank = np.linalg.matrix_rank(Ad[ml[kind == 0]])
        if rank < nu:
            assert nl == -1 and KU[2][0] == 0
            dependent += 1
            continue
        assert nl == nu
        assert sorted(order) == sorted(np.flatnonzero(kind == 0))
        L = KU[0][:nl, :nl]
        cols = Ad[ml[order]]
        np.testing.assert_allclose(L @ L.T, cols @ cols.T, atol=1e-10)
        kept += int(0 < before < 10 and KU[2][1] == before + 1)
    assert kept > 20 and dependent > 0  # calls that updated a kept factor


def test_path_is_continuous_at_kinks(fitted):
    _, _, path = fitted
    for k in range(1, min(len(path.kinks_) - 1, 40)):
        t = path.kinks_[k]
        left = path.kinks_[k - 1] + 0.999999 * (t - path.kinks_[k - 1])
        wl = np.r_[path.coef_at(left)]
        w0 = np.r_[path.coef_at(t)]
        np.testing.assert_allclose(
            np.r_[path.coef_at(left)[0], path.coef_at(left)[1]],
            np.r_[path.coef_at(t)[0], path.coef_at(t)[1]],
            atol=1e-5 * (1 + np.abs(w0).max()),
        )
        assert wl.shape == w0.shape


def test_tpr_falls_and_tnr_rises_with_tau_on_training_data(fitted):
    """The paper (Fig. 2) says TPR decreases 'but not necessarily strictly' with tau and
    TNR rises. On training data that trend is not a theorem for a finite sample (the
    hinge solution at a larger FP cost can still flip a point either way), so we check
    the ends exactly and the trend with at most one example of slack per step."""
    X, y, path = fitted
    r = path.roc_path(X, y, taus=np.linspace(0, 1, 41))
    n_pos, n_neg = (y > 0).sum(), (y < 0).sum()
    assert r["tpr"][0] == 1.0 and r["tnr"][-1] == 1.0
    assert (np.diff(r["tpr"]) <= 1.0 / n_pos + 1e-12).all()
    assert (np.diff(r["tnr"]) >= -1.0 / n_neg - 1e-12).all()
    assert r["tpr"][-5] < r["tpr"][5] and r["tnr"][-5] > r["tnr"][5]


def test_sparse_and_dense_inputs_agree(fitted):
    X, y, path = fitted
    sparse = QuantilePathSVC(alpha=1e-2).fit(sp.csr_matrix(X), y)
    np.testing.assert_array_equal(sparse.kinks_, path.kinks_)
    for tau in (0.2, 0.5, 0.8):
        np.testing.assert_allclose(sparse.coef_at(tau)[0], path.coef_at(tau)[0])
        np.testing.assert_allclose(
            sparse.decision_function(sp.csr_matrix(X), tau=tau),
            path.decision_function(X, tau=tau),
        )


def test_duplicated_rows_are_merged_exactly():
    X, y = _data(n=80, seed=3)
    Xd, yd = np.vstack([X, X[:30]]), np.r_[y, y[:30]]
    path = QuantilePathSVC(alpha=1e-2).fit(Xd, yd)
    assert path.diagnostics_["merged_rows"] == 30
    for tau in (0.1, 0.45, 0.9):
        ref = _direct_dual(Xd, yd, tau, 1e-2)
        assert abs(path.dual_objective_at(tau) - ref) <= 1e-6 * abs(ref)
    # weight 2 on the first 30 rows is the same problem (costs are 2 w_i (1 - tau) / n
    # with n the number of rows, hence the 80 / 110)
    sw = np.r_[np.full(30, 2.0), np.ones(50)] * 80 / 110
    weighted = QuantilePathSVC(alpha=1e-2).fit(X, y, sample_weight=sw)
    for tau in (0.1, 0.45, 0.9):
        np.testing.assert_allclose(
            weighted.coef_at(tau)[0], path.coef_at(tau)[0], rtol=1e-7, atol=1e-9
        )


def test_path_summary_counts_add_up(fitted):
    _, y, path = fitted
    s = path.path_summary()
    assert s["tau"][0] == 0.0 and s["tau"][-1] == 1.0
    assert (np.diff(s["tau"]) > 0).all()
    np.testing.assert_array_equal(s["n_margin"] + s["n_error"] + s["n_right"], len(y))
    assert path.n_kinks_ == len(s["tau"])
    assert path.diagnostics_["max_kkt_drift"] < 1e-6


def test_predict_uses_tau_parameter_and_predicts_fewer_positives_as_tau_grows(fitted):
    X, y, path = fitted
    np.testing.assert_array_equal(path.predict(X), path.predict(X, tau=0.5))
    rates = [(path.predict(X, tau=t) == 1).mean() for t in (0.05, 0.5, 0.95)]
    assert rates[0] > rates[1] > rates[2]
    assert set(np.unique(path.predict(X))) <= set(path.classes_)


def test_save_load_round_trip(tmp_path, fitted):
    X, _, path = fitted
    path.save(tmp_path / "q")
    back = load_model(tmp_path / "q")
    for tau in (0.0, 0.33, 1.0):
        np.testing.assert_array_equal(
            back.decision_function(X, tau=tau), path.decision_function(X, tau=tau)
        )
    assert "pickle" not in (tmp_path / "q" / "model.json").read_text()


def test_plot_writes_png(tmp_path, fitted):
    X, y, path = fitted
    out = path.plot_roc_path(X, y, tmp_path / "roc.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"tau": 1.5}, "tau"),
        ({"direction": "lu"}, "direction"),
    ],
)
def test_bad_parameters(kwargs, match):
    X, y = _data(n=20)
    with pytest.raises(ValueError, match=match):
        QuantilePathSVC(**kwargs).fit(X, y)


def test_bad_input():
    X, y = _data(n=40)
    with pytest.raises(ValueError, match="exactly two classes"):
        QuantilePathSVC().fit(X, np.ones(40))
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        QuantilePathSVC().fit(Xn, y)
    path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    with pytest.raises(ValueError, match=r"tau must be in \[0, 1\]"):
        path.coef_at(1.2)
    with pytest.raises(ValueError, match="sample_weight"):
        QuantilePathSVC().fit(X, y, sample_weight=-np.ones(40))


def test_max_kinks_guard_has_a_clear_message():
    X, y = _data(n=120)
    with pytest.raises(RuntimeError, match="max_kinks"):
        QuantilePathSVC(alpha=1e-2, max_kinks=3).fit(X, y)


def test_gram_matrix_kept_between_kinks_equals_a_fresh_one():
    """The Gram matrix Q_MM is kept between kinks and only the positions whose row
    changed are recomputed: after joins, swap-removals, and M shrinking then growing
    back with its old rows at their old positions, it equals Q_MM built afresh."""
    import scipy.sparse as sp

    from bigrate.quantile import _kernels as K

    rng = np.random.default_rng(3)
    X = sp.random(60, 12, density=0.4, random_state=4, format="csr")
    X.sort_indices()
    y = np.where(rng.random(60) > 0.5, 1.0, -1.0)
    Xt = (X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data, y,
          np.ones(60))  # fmt: skip
    cap = 10
    G, gm = np.zeros((cap, cap)), np.full(cap, -1, np.int64)
    tmp, b, s_l = np.zeros(12), np.zeros(cap), rng.standard_normal(12)
    mlist = list(rng.choice(60, 6, replace=False))
    for step in range(300):
        r = rng.random()
        if r < 0.35 and len(mlist) < cap:  # a row joins at the end
            mlist.append(int(rng.choice(np.setdiff1d(np.arange(60), mlist))))
        elif r < 0.7 and len(mlist) > 1:  # a row leaves: the last takes its place
            k = int(rng.integers(len(mlist)))
            mlist[k] = mlist[-1]
            mlist.pop()
        elif r < 0.8 and len(mlist) > 3:
            # M shrinks while its first row changes, then the other rows come back
            # at their old positions (their entries against the new first row were
            # never computed)
            mlist[0] = int(rng.choice(np.setdiff1d(np.arange(60), mlist)))
            K._gram(Xt, np.array(mlist, np.int64), 2, s_l, tmp, G, gm, b)
        m = len(mlist)
        ml = np.array(mlist, np.int64)
        K._gram(Xt, ml, m, s_l, tmp, G, gm, b)
        XM = X[ml].toarray()
        Q = (y[ml, None] * XM) @ (y[ml, None] * XM).T
        assert np.allclose(G[:m, :m], Q, rtol=1e-12, atol=1e-12), step
        assert np.allclose(b[:m], y[ml] * (XM @ s_l), rtol=1e-12, atol=1e-12)
        assert not tmp.any()


def _one_hot_ties(n=400, seed=0):
    """Three categorical features one-hot encoded and one rounded number: many rows
    share a score, so events tie (zero-length steps, several index changes at one
    kink) and rows of both labels share a feature vector (they do not merge)."""
    rng = np.random.default_rng(seed)
    levels = (3, 4, 5)
    cats = [rng.integers(0, k, n) for k in levels]
    num = np.round(rng.standard_normal(n), 1)
    X = np.hstack([np.eye(k)[c] for c, k in zip(cats, levels)] + [num[:, None]])
    score = cats[0] - 0.5 * cats[1] + 0.3 * cats[2] + num
    y = np.where(score + rng.standard_normal(n) > 0.5, 1, -1)
    return sp.csr_matrix(X), y


def test_candidate_list_visits_exactly_the_kinks_of_a_full_scan_on_ties():
    """The event detection from a candidate list (rows whose gradient can reach 0
    while w stays within the list's radius) is exact: with a refresh after every
    kink (so both runs do the same arithmetic on the rows they read) it visits the
    same kinks, at the same tau to the last bit, with the same index changes, as the
    scan of every row, on a set where events tie, also where its rebuilds read only
    the rows near the list (the middle list). And it reads far fewer rows."""
    X, y = _one_hot_ties()
    kw = dict(alpha=1e-2, refresh_every=1)
    a = QuantilePathSVC(events="candidates", **kw).fit(X, y)
    b = QuantilePathSVC(events="scan", **kw).fit(X, y)
    assert a.diagnostics_["zero_steps"] > 20  # ties happen
    assert a.diagnostics_["index_changes"] > 1.5 * a.n_kinks_
    assert a.n_kinks_ == b.n_kinks_
    np.testing.assert_array_equal(a.kinks_, b.kinks_)
    np.testing.assert_array_equal(a._kink_cptr, b._kink_cptr)
    np.testing.assert_array_equal(a._cidx, b._cidx)
    np.testing.assert_array_equal(a._cto, b._cto)
    np.testing.assert_array_equal(a._bstore, b._bstore)
    assert a.diagnostics_["radius_regrowths"] > 0  # the widening path was taken
    assert a.diagnostics_["rows_examined"] < 0.3 * b.diagnostics_["rows_examined"]
    # most rebuilds chose from the middle list; the scan's are all full
    rebuilds = a.diagnostics_["refreshes"] + a.diagnostics_["radius_regrowths"]
    assert a.diagnostics_["full_rebuilds"] < 0.2 * rebuilds
    assert b.diagnostics_["full_rebuilds"] == b.diagnostics_["refreshes"]


@pytest.mark.parametrize("refresh_every", [3, 10, 30])
def test_candidate_list_path_is_certified_with_sparse_refreshes(refresh_every):
    """With refreshes only at rebuilds of the list (every refresh_every advances at
    most, and whenever a segment would leave the radius), rows outside the list go
    unread for many kinks: the path stays certified at every kink and between."""
    X, y = _one_hot_ties(n=300, seed=1)
    path = QuantilePathSVC(alpha=1e-2, refresh_every=refresh_every).fit(X, y)
    Xd = X.toarray()
    taus = np.r_[path.kinks_[:: max(1, path.n_kinks_ // 25)], 0.37, 0.61, 1.0]
    for tau in taus:
        gap, scale, box, link = _duality_gap(path, Xd, y, tau, 1e-2)
        assert gap <= 1e-10 * max(scale, 1.0), (tau, gap)
        assert box <= 1e-12 and link <= 1e-9
    assert path.diagnostics_["scan_share"] < 0.8


@pytest.mark.parametrize("events", ["scan", "candidates"])
def test_the_path_ends_when_tau_is_one_rounding_unit_below_1(events):
    """On scikit-learn's dtype-check data (20 rows of small integers, most tied)
    some refresh periods leave tau at 1 - 2.2e-16 with no event left; that last
    step used to be snapped to a zero step (it is within the tie tolerance) and was
    taken again until the stall guard fired. Every refresh period finishes, and the
    path is certified at its end."""
    rnd = np.random.RandomState(0)
    X = (3 * rnd.uniform(size=(20, 5)).astype(np.float32)).astype(np.int64)
    X = X.astype(np.float64)
    y = np.array([1, 2] * 10)
    yy = np.where(y == 2, 1, -1)
    for refresh_every in (7, 10, 30, 59, 60, 61):
        path = QuantilePathSVC(refresh_every=refresh_every, events=events).fit(X, y)
        assert path.kinks_[-1] == 1.0
        for tau in (0.5, 1.0 - 1e-9, 1.0):
            gap, scale, box, link = _duality_gap(path, X, yy, tau, path.alpha)
            assert gap <= 1e-9 * max(scale, 1.0), (refresh_every, tau, gap)


def _kink_state(path, want_m):
    """The state recorded at a kink of a fitted path whose margin set has want_m
    rows: (X tuple, S tuple, W, F, kappa, tau, beta_M as recorded)."""
    from bigrate.quantile import _kernels as K

    Xt = path._X()
    n, d = len(Xt[3]), int(Xt[1].max()) + 1
    for k in range(1, path.n_kinks_ - 1):
        b0, b1 = path._kink_bptr[k], path._kink_bptr[k + 1]
        if b1 - b0 == want_m:
            break
    else:
        raise AssertionError(f"no kink with |M| = {want_m}")
    state = path._state_at_kink(k)
    tau = float(path.kinks_[k])
    M = np.flatnonzero(state == K.M_SET)
    y, sw = Xt[3], Xt[4]
    beta = np.where(state == K.L_SET, np.where(y > 0, sw * (1 - tau), sw * tau), 0.0)
    beta[M] = path._bstore[b0:b1]
    Xd = sp.csr_matrix((Xt[2], Xt[1], Xt[0]), shape=(n, d)).toarray()
    w = path._kappa * (beta * y) @ Xd
    mlist = np.zeros(n, np.int64)
    mlist[: len(M)] = M
    mpos = np.full(n, -1, np.int64)
    mpos[M] = np.arange(len(M))
    scal = np.array([tau, len(M), 0.0, -1.0])
    S = (state, beta, np.zeros(n), w, np.zeros(d), mlist, mpos, np.zeros(n),
         np.zeros(n), scal, np.zeros(n))  # fmt: skip
    W = (np.zeros(d),) + tuple(np.zeros(n) for _ in range(5))
    F = (None, None, None, None, np.zeros((d, d)), np.full(d, -1, np.int64))
    return K, Xt, S, W, F, path._kappa, tau, beta[M].copy(), Xd


def test_newton_repair_removes_margin_drift_exactly():
    """The per-kink drift repair: one Newton step on the Gram matrix takes margin
    multipliers moved off a kink's solution back to it (g_M = 0), with w = kappa
    sum beta y x kept."""
    X, y = _data(n=120, d=4, seed=4)
    path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    K, Xt, S, W, F, kappa, tau, bM, Xd = _kink_state(path, 3)
    beta, w, mlist = S[1], S[3], S[5]
    M = mlist[:3]
    assert K._margin_drift(Xt, mlist, 3, w, W[5]) < 1e-10  # the recorded kink
    yy = Xt[3]
    beta[M] += 1e-7 * np.array([1.0, -2.0, 1.5])
    w[:] = kappa * (beta * yy) @ Xd
    assert K._margin_drift(Xt, mlist, 3, w, W[5]) > 1e-9
    assert K._newton_repair(Xt, S, W, F, kappa, tau, 128)
    np.testing.assert_allclose(beta[M], bM, rtol=0, atol=1e-12)
    assert K._margin_drift(Xt, mlist, 3, w, W[5]) < 1e-12
    np.testing.assert_allclose(w, kappa * (beta * yy) @ Xd, atol=1e-13)


def test_newton_repair_declines_a_margin_set_above_the_rank():
    """More margin rows than design columns make Q_MM singular: no Newton step and
    nothing changed (the path then refreshes and re-solves by coordinate descent)."""
    X, y = _data(n=300, d=2, seed=2, noise=0.3)
    X = np.round(X, 1)  # ties: margin sets larger than the 3 design columns
    path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    sizes = np.diff(path._kink_bptr)
    m = int(sizes[sizes > 3].min())
    K, Xt, S, W, F, kappa, tau, bM, Xd = _kink_state(path, m)
    F = (None, None, None, None, np.zeros((m, m)), np.full(m, -1, np.int64))
    beta, w = S[1].copy(), S[3].copy()
    K._margin_drift(Xt, S[5], m, S[3], W[5])
    assert not K._newton_repair(Xt, S, W, F, kappa, tau, 128)
    np.testing.assert_array_equal(S[1], beta)
    np.testing.assert_array_equal(S[3], w)


def _full_work(Xt, d):
    from bigrate.quantile.svc import direction_work

    n = len(Xt[3])
    W = (np.zeros(d),) + tuple(np.zeros(n) for _ in range(5))
    W += (np.zeros(d), np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
    W += (np.zeros(n, np.int8), np.zeros(n), np.zeros(n), np.zeros(n))
    return W, direction_work(Xt, d, True)


def test_least_squares_repair_restores_the_kink_above_the_rank():
    """Where |M| exceeds the rank (Q_MM singular, no Newton step), the refresh's
    least-squares repair takes margin multipliers moved off a kink's solution back
    to a solution: g_M = 0 again, every multiplier in its box, and w back at the
    kink's w (unique, though beta_M is not)."""
    X, y = _data(n=300, d=2, seed=2, noise=0.3)
    X = np.round(X, 1)
    path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    sizes = np.diff(path._kink_bptr)
    tried = 0
    for m in sorted(set(sizes[sizes > 4].tolist()))[:6]:
        K, Xt, S, _, _, kappa, tau, bM, Xd = _kink_state(path, m)
        beta, g, w, mlist = S[1], S[2], S[3], S[5]
        d = len(w)
        W, F = _full_work(Xt, d)
        M = mlist[:m]
        yy, sw = Xt[3], Xt[4]
        ub = np.where(yy[M] > 0, sw[M] * (1 - tau), sw[M] * tau)
        inside = (beta[M] > 1e-6) & (ub - beta[M] > 1e-6)
        if inside.sum() < 2:
            continue
        tried += 1
        w0 = w.copy()
        rng = np.random.default_rng(m)
        beta[M[inside]] += 1e-7 * rng.standard_normal(inside.sum()) * ub[inside]
        w[:] = kappa * (beta * yy) @ Xd
        K.gradient_all(Xt, w, g)
        assert np.abs(g[M]).max() > 1e-9
        xnorm = np.sqrt(np.asarray((sp.csr_matrix(Xd).multiply(Xd)).sum(axis=1)))
        assert K._lsq_repair(Xt, S, W, F, kappa, tau, xnorm.ravel(), 1e-9)
        w[:] = kappa * (beta * yy) @ Xd
        K.gradient_all(Xt, w, g)
        assert np.abs(g[M]).max() < 1e-12, m
        assert np.all(beta[M] >= 0) and np.all(beta[M] <= ub + 1e-15)
        np.testing.assert_allclose(w, w0, rtol=0, atol=1e-12)
    assert tried >= 2


def test_refreshes_repair_tied_data_by_least_squares_and_stay_certified():
    """On one-hot data (margin sets above the rank, as on a9a) the refreshes' repairs
    go through least squares (a wrong repair would leave drift and fall back to
    coordinate descent), and the path is certified at its kinks themselves."""
    rng = np.random.default_rng(0)
    n, groups = 800, 8
    X = np.zeros((n, 3 * groups))
    for k in range(groups):
        X[np.arange(n), 3 * k + rng.integers(0, 3, n)] = 1.0
    noise = 0.7 * rng.standard_normal(n)
    y = np.where(X @ rng.standard_normal(X.shape[1]) + noise > 0, 1, -1)
    path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    d = path.diagnostics_
    assert d["lsq_repairs"] > 0
    assert d["recoveries"] >= d["lsq_repairs"] + d["cd_repairs"]
    for tau in path.kinks_[1 : -1 : max(1, path.n_kinks_ // 60)]:
        gap, scale, _, _ = _duality_gap(path, X, y, tau, path.alpha)
        assert gap <= 1e-9 * max(scale, 1.0), tau


def test_segment_after_simultaneous_box_events_on_merged_one_hot_rows():
    """Rows that leave M at a kink where several box events tie may come back once
    at that tau: barred (as the follower first did), their gradients crossed their
    bounds along the whole next segment and the path was not optimal there (gap
    0.26 at tau 0.60 on these 43 rows, merged to 14; found by a stress run of 720
    fits, 16 of them uncertified)."""
    rng = np.random.default_rng(34)
    n, groups = int(rng.integers(20, 400)), int(rng.integers(2, 8))  # 43 rows, 2
    X = np.zeros((n, 3 * groups))
    for k in range(groups):
        X[np.arange(n), 3 * k + rng.integers(0, 3, n)] = 1.0
    score = X @ rng.standard_normal(3 * groups)
    y = np.where(score + 0.7 * rng.standard_normal(n) > 0, 1, -1)
    path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    gaps = [path.duality_gap_at(t) for t in np.linspace(0.0, 1.0, 41)]
    assert max(gaps) <= 1e-9


def test_a_newton_repair_cut_short_by_the_boxes_refreshes_at_once(shared_data):
    """A Newton repair of the margin drift whose step the multipliers' boxes cut
    short left the drift in place until the next refresh: on this a9a subsample a
    drift of 1e-2 was recorded at a kink near tau = 0.790 (duality gap 5e-3 there).
    The drift is now measured again after the step and the refresh brought forward."""
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(shared_data / "a9a" / "a9a.bz2"), n_features=123)
    rows = np.random.default_rng(4).choice(X.shape[0], 8000, replace=False)
    X, y = X[rows], y[rows].astype(int)
    p = QuantilePathSVC(alpha=1e-3).fit(X, y)
    d = p.diagnostics_
    assert d["drift_refreshes"] > 0
    assert d["max_kkt_drift"] < 1e-6
    near = p.kinks_[(p.kinks_ > 0.7885) & (p.kinks_ < 0.7915)]
    assert len(near) > 20
    assert max(p.duality_gap_at(t) for t in near) <= 2e-11


def test_kept_cholesky_factor_follows_the_free_set_through_updates():
    """The Gram route's factor kept between kinks, after random events (rows in and
    out of M, the positions reshuffled as dpf_run does, multipliers onto and off
    their bounds): L L^T equals the Gram matrix of the free rows, in the order the
    factor keeps them, and those rows are exactly the free ones."""
    from bigrate.quantile import _kernels as K

    rng = np.random.default_rng(3)
    n, d, cap = 60, 40, 40
    A = rng.standard_normal((n, d))
    Q = A @ A.T  # rank d: any 40 rows or fewer are independent almost surely
    G = np.zeros((cap, cap))
    KF = (np.zeros((cap, cap)), np.zeros(cap, np.int64), np.zeros(2, np.int64))
    mlist = np.zeros(n, np.int64)
    mpos = np.full(n, -1, np.int64)
    members = list(rng.choice(n, 20, replace=False))
    kinds = {i: int(rng.integers(0, 3)) for i in range(n)}
    updated = 0
    for step in range(300):
        r = rng.random()
        if r < 0.3 and len(members) < 35:
            members.append(int(rng.choice([i for i in range(n) if i not in members])))
        elif r < 0.6 and len(members) > 5:
            members.remove(members[int(rng.integers(len(members)))])
        else:
            i = members[int(rng.integers(len(members)))]
            kinds[i] = int(rng.integers(0, 3))
        if rng.random() < 0.2:
            rng.shuffle(members)
        m = len(members)
        mpos[:] = -1
        mlist[:m] = members
        mpos[mlist[:m]] = np.arange(m)
        G[:m, :m] = Q[np.ix_(mlist[:m], mlist[:m])]
        kind = np.array([kinds[i] for i in members], np.int8)
        free = np.zeros(m, np.int64)
        calls = 64 if step % 50 else 0  # formed anew now and then
        updated += KF[2][0] > 0 and calls > 0
        nf = K._kept_free_factor(G, mlist, m, mpos, kind, KF, free, 1e-10, calls)
        assert nf == int((kind == 0).sum())
        assert sorted(free[:nf]) == sorted(np.flatnonzero(kind == 0))
        assert list(KF[1][:nf]) == list(mlist[free[:nf]])
        L = np.tril(KF[0][:nf, :nf])
        Gf = G[np.ix_(free[:nf], free[:nf])]
        assert np.abs(L @ L.T - Gf).max() <= 1e-11 * max(1.0, np.abs(Gf).max())
    assert updated > 200


def test_kept_cholesky_factor_gives_the_same_classifiers_as_factorising_anew(
    monkeypatch,
):
    """The path with the Gram route's factor kept between kinks and the one
    factorising it at every kink, on data whose margin set stays under the rank
    (the Gram route throughout) and on one-hot data (margin sets above it:
    directions not unique, so the dual paths may differ in their rounding): both
    certified, at the kinks too, and w(tau), which is unique, the same."""
    import bigrate.quantile.svc as svc

    rng = np.random.default_rng(5)
    Xg = rng.standard_normal((500, 40))
    yg = np.where(Xg @ rng.standard_normal(40) + rng.standard_normal(500) > 0, 1, -1)
    Xo, yo = _one_hot(n=600, seed=2)
    for X, y in ((Xg, yg), (Xo, yo)):
        _same_classifiers_kept_or_anew(monkeypatch, svc, X, y)


def _same_classifiers_kept_or_anew(monkeypatch, svc, X, y):
    kept_calls = svc.KEPT_FACTOR_CALLS
    assert kept_calls > 1
    paths = []
    for calls in (0, kept_calls):
        monkeypatch.setattr(svc, "KEPT_FACTOR_CALLS", calls)
        paths.append(QuantilePathSVC(alpha=1e-2).fit(X, y))
    anew, kept = paths
    for tau in np.linspace(0.0, 1.0, 41):
        assert kept.duality_gap_at(tau) <= 2e-11
        w1, b1 = kept.coef_at(tau)
        w0, b0 = anew.coef_at(tau)
        np.testing.assert_allclose(w1, w0, atol=1e-8)
        assert abs(b1 - b0) <= 1e-8
    assert max(kept.duality_gap_at(t) for t in kept.kinks_) <= 2e-11


def test_running_error_set_sums_and_sorted_margin_set_stay_exact(monkeypatch):
    """Between refreshes the kernel keeps, instead of recomputing: the error set's
    sums of sw x by class (compensated, from which w and s_L are rebuilt reading only
    the margin rows) and M's indices in increasing order (the beta records' order).
    After every chunk of the path both equal what the sets give from scratch: the
    sums within a rounding unit of an extended-precision sum (values and merged
    weights not integers, so the sums round), the order exactly; and the margin
    rows' copy read at primal kinks holds each position's row."""
    import bigrate.quantile._kernels as K

    rng = np.random.default_rng(5)
    X, y = _one_hot_ties(n=900, seed=2)
    X = X.multiply(rng.uniform(0.3, 3.0, X.shape[1])).tocsr()
    X = sp.vstack([X, X[:200]]).tocsr()  # duplicates merge into weights of 2
    y = np.r_[y, y[:200]]
    run = K.dpf_run
    checks, copies = [], []

    def checked(Xt, S, *args):
        status = run(Xt, S, *args)
        state, mlist, scal, lsum, msorted = S[0], S[5], S[9], S[11], S[12]
        if args[4][K.V_VALID] == 0:
            # the sets changed outside the kernel (a plateau's programme) and the
            # call returned before its first refresh (full buffers): both are
            # formed anew when the next call starts, and not read before
            return status
        m = int(scal[1])
        np.testing.assert_array_equal(msorted[:m], np.sort(mlist[:m]))
        indptr, indices, data, yt, sw = Xt
        A = sp.csr_matrix((data, indices, indptr)).astype(np.longdouble)
        for c, cls in ((0, yt > 0), (2, yt < 0)):
            rows = np.flatnonzero((state == K.L_SET) & cls)
            exact = A[rows].T @ sw[rows].astype(np.longdouble)
            scale = np.abs(A[rows]).T @ sw[rows] + 1.0
            err = np.abs((lsum[c] + lsum[c + 1]) - exact) / scale
            assert float(err.max()) <= 4e-16, float(err.max())
        checks.append(len(rows))
        # the margin rows' copy, where it is kept: each position's slot holds that
        # position's row, label and weight
        cptr, cind, cdat, yc, swc, xnc, slot, meta = args[1][9:17]
        if meta[1] != 0:
            for k in range(m):
                i, sl = mlist[k], slot[k]
                np.testing.assert_array_equal(
                    cind[cptr[sl] : cptr[sl + 1]], indices[indptr[i] : indptr[i + 1]]
                )
                np.testing.assert_array_equal(
                    cdat[cptr[sl] : cptr[sl + 1]], data[indptr[i] : indptr[i + 1]]
                )
                assert (yc[sl], swc[sl]) == (yt[i], sw[i])
                xi = data[indptr[i] : indptr[i + 1]]
                assert xnc[sl] == pytest.approx(np.linalg.norm(xi))
            copies.append(m)
        return status

    monkeypatch.setattr(K, "dpf_run", checked)
    path = QuantilePathSVC(alpha=1e-2, refresh_every=60).fit(X, y)
    assert len(checks) >= 4 and max(checks) > 50  # chunks with a populated L
    assert max(copies) > X.shape[1] + 1  # copies of a margin set above the rank
    assert path.diagnostics_["merged_rows"] >= 200


def test_the_whole_a9a_quantile_path_is_the_recorded_one(shared_data):
    """The kinks, recorded multipliers, set changes, checkpoint states and 11
    recovered models of all of a9a are the bits recorded before the kernel was split
    into named parts (:mod:`tests.golden`)."""
    from sklearn.datasets import load_svmlight_file

    from bigrate import QuantilePathSVC
    from tests.golden import check

    X, y = load_svmlight_file(str(shared_data / "a9a" / "a9a.bz2"), n_features=123)
    m = QuantilePathSVC(alpha=1e-3).fit(X, y)
    assert m.n_kinks_ > 90_000
    check("quantile_a9a", (m.kinks_, m._kink_bptr, m._bstore, m._kink_cptr,
                           m._cidx, m._cto, m._ck_kink, m._ck_cpos, m._ck_state))  # fmt: skip
    taus = np.linspace(0.0, 1.0, 11)
    check("quantile_a9a_coef", tuple(np.r_[m.coef_at(t)[0].ravel(), m.coef_at(t)[1]]
                                      for t in taus))  # fmt: skip
