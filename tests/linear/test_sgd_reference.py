"""The numba kernels against a brute-force NumPy transcription of Algorithm 4."""

import numpy as np
import pytest
import scipy.sparse as sp

from bigrate.linear.steps import KernelConfig, run_steps
from bigrate.losses import loss_code


def ref_loss(name, z, eta):
    if name == "sigmoid":
        l = 1.0 / (1.0 + np.exp(eta * z))
        return l, -eta * l * (1 - l)
    if z <= -eta:
        return 1.0, 0.0
    if z >= eta:
        return 0.0, 0.0
    return (eta - z) / (2 * eta), -1 / (2 * eta)


def ref_flow(name, z, eta, h, kappa, dl):
    """The factor on a step of size h (margin z, ||x||^2 + intercept rate kappa) that
    makes it the gradient flow of the example's own loss, where the linear step would
    move u = eta z by more than 0.5 (sigmoid) or past the ramp's end; found here by
    integrating dz/ds = -l'(z) kappa numerically (the kernel uses a closed form)."""
    from scipy.integrate import solve_ivp

    if dl == 0.0:
        return 1.0
    dz = -h * dl * kappa
    if name == "ramp":
        return min(dz, eta - z) / dz
    if eta * dz <= 0.5:
        return 1.0
    sol = solve_ivp(
        lambda s, zz: [-ref_loss(name, zz[0], eta)[1] * kappa],
        (0.0, h), [z], method="DOP853", rtol=1e-13, atol=1e-13,
    )  # fmt: skip
    return (sol.y[0, -1] - z) / dz


def ref_np(X, y, order, cfg, loss, lam0, flow=True):
    """Alg. 4 as printed (dense w, no scaling trick), each step along the example's
    loss's gradient flow where it is large (ref_flow)."""
    w = np.zeros(X.shape[1])
    b, lam, t = 0.0, lam0, 0
    for i in order:
        f = X[i] @ w + b
        l, dl = ref_loss(loss, y[i] * f, cfg.eta)
        gamma = cfg.gamma0 / (1 + cfg.lambda_c * t)
        a = cfg.w_pos if y[i] > 0 else lam * cfg.w_neg
        kappa = X[i] @ X[i] + cfg.intercept_rate
        if flow:
            dl *= ref_flow(loss, y[i] * f, cfg.eta, gamma * a, kappa, dl)
        grad_w = dl * y[i] * X[i]
        w = (1 - gamma * cfg.lambda_c) * w - gamma * a * grad_w
        b = b - cfg.intercept_rate * gamma * a * dl * y[i]
        if y[i] < 0:
            lam = lam * (1 + cfg.nu * (l - cfg.target))
        t += 1
    return w, b, lam


def ref_q(X, pos, neg, cfg, loss, lam0):
    w = np.zeros(X.shape[1])
    b, lam, t = 0.0, lam0, 0
    for ip, ineg in zip(pos, neg):
        fp, fn = X[ip] @ w + b, X[ineg] @ w + b
        lp, dlp = ref_loss(loss, fp, cfg.eta)
        ln, dln = ref_loss(loss, -fn, cfg.eta)
        gamma = cfg.gamma0 / (1 + cfg.lambda_c * t)
        kp = X[ip] @ X[ip] + cfg.intercept_rate
        kn = X[ineg] @ X[ineg] + cfg.intercept_rate
        dlp *= ref_flow(loss, fp, cfg.eta, gamma * (1 + lam * cfg.target), kp, dlp)
        dln *= ref_flow(loss, -fn, cfg.eta, gamma * lam, kn, dln)
        gw = (1 + lam * cfg.target) * dlp * X[ip] + lam * dln * (-1) * X[ineg]
        gb = (1 + lam * cfg.target) * dlp + lam * dln * (-1)
        w = (1 - gamma * cfg.lambda_c) * w - gamma * gw
        b = b - cfg.intercept_rate * gamma * gb
        lam = lam * (1 + cfg.nu * (ln - cfg.target * (1 - lp)))
        t += 1
    return w, b, lam


def problem(seed, n=300, d=20):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.4)
    y = np.where(X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(n) > 0.2, 1, -1)
    return X, y.astype(np.int8), rng


@pytest.mark.parametrize("loss", ["sigmoid", "ramp"])
@pytest.mark.parametrize("mode", ["balanced", "uniform"])
def test_np_kernel_matches_reference_iterates(loss, mode, seed):
    X, y, rng = problem(seed)
    order = rng.integers(0, len(y), 2000)
    n, npos = len(y), int((y > 0).sum())
    cfg = KernelConfig(
        mode=mode,
        w_pos=1.0 if mode == "balanced" else n / npos,
        w_neg=1.0 if mode == "balanced" else n / (n - npos),
        lambda_c=1e-2,
        gamma0=0.05,
        nu=0.01,
        target=0.1,
        eta=0.7,
        loss=loss_code(loss),
        intercept_rate=1.0,
    )
    v, state, stats = np.zeros(X.shape[1]), np.array([1.0, 0.0, 1.3, 0.0]), np.zeros(6)
    Xs = sp.csr_matrix(X)
    # in three chunks, to check that the state carries over exactly
    for part in np.array_split(order, 3):
        run_steps(cfg, v, state, Xs, y, part, stats)
    w_ref, b_ref, lam_ref = ref_np(X, y, order, cfg, loss, 1.3)
    np.testing.assert_allclose(v * state[0], w_ref, rtol=1e-9, atol=1e-12)
    assert state[1] == pytest.approx(b_ref, rel=1e-9, abs=1e-12)
    assert state[2] == pytest.approx(lam_ref, rel=1e-9)
    assert state[3] == len(order)
    assert stats[0] + stats[3] == len(order)


@pytest.mark.parametrize("loss", ["sigmoid", "ramp"])
def test_qvalue_kernel_matches_reference(loss, seed):
    X, y, rng = problem(seed)
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    po, no = rng.choice(pos, 800), rng.choice(neg, 800)
    cfg = KernelConfig(
        mode="pairs",
        w_pos=1,
        w_neg=1,
        lambda_c=1e-2,
        gamma0=0.05,
        nu=0.02,
        target=0.05,
        eta=1.0,
        loss=loss_code(loss),
        intercept_rate=0.5,
    )
    v, state, stats = np.zeros(X.shape[1]), np.array([1.0, 0.0, 1.0, 0.0]), np.zeros(6)
    run_steps(cfg, v, state, sp.csr_matrix(X), y, (po, no), stats)
    w_ref, b_ref, lam_ref = ref_q(X, po, no, cfg, loss, 1.0)
    np.testing.assert_allclose(v * state[0], w_ref, rtol=1e-9, atol=1e-12)
    assert state[1] == pytest.approx(b_ref, rel=1e-9, abs=1e-12)
    assert state[2] == pytest.approx(lam_ref, rel=1e-9)


def test_scale_renormalisation_keeps_iterates(seed):
    """A huge regulariser drives the scale below 1e-9 many times; w stays exact."""
    X, y, rng = problem(seed, n=100, d=8)
    order = rng.integers(0, 100, 3000)
    cfg = KernelConfig(
        mode="balanced",
        w_pos=1,
        w_neg=1,
        lambda_c=5.0,
        gamma0=0.1,
        nu=0.0,
        target=0.1,
        eta=1.0,
        loss=0,
        intercept_rate=1.0,
    )
    v, state = np.zeros(8), np.array([1.0, 0.0, 1.0, 0.0])
    run_steps(cfg, v, state, sp.csr_matrix(X), y, order, np.zeros(6))
    w_ref, b_ref, _ = ref_np(X, y, order, cfg, "sigmoid", 1.0)
    np.testing.assert_allclose(v * state[0], w_ref, rtol=1e-8, atol=1e-14)


def test_loss_derivatives_by_finite_differences():
    from bigrate.losses import loss_and_derivative

    for code, eta in ((0, 0.7), (0, 5.0), (1, 0.4), (1, 2.0)):
        for z in np.linspace(-3, 3, 61):
            if code == 1 and abs(abs(z) - eta) < 1e-3:
                continue  # the ramp's kinks
            h = 1e-6
            lp, _ = loss_and_derivative(code, z + h, eta)
            lm, _ = loss_and_derivative(code, z - h, eta)
            _, d = loss_and_derivative(code, z, eta)
            assert d == pytest.approx((lp - lm) / (2 * h), abs=1e-6)
    # the ramp's gradient is 0 at its kinks: the step is skipped (Gasso et al. 3.3)
    assert loss_and_derivative(1, 0.4, 0.4)[1] == 0.0
    assert loss_and_derivative(1, -0.4, 0.4) == (1.0, 0.0)


@pytest.mark.parametrize("loss", ["sigmoid", "ramp"])
def test_large_steps_follow_the_losss_gradient_flow(loss, seed):
    """A large multiplier makes most negative steps large: each is taken along the
    gradient flow of the example's loss (numerically integrated in the reference)."""
    X, y, rng = problem(seed, n=200, d=10)
    order = rng.integers(0, len(y), 600)
    cfg = KernelConfig(
        mode="balanced", w_pos=1.0, w_neg=1.0, lambda_c=1e-3, gamma0=0.5, nu=0.01,
        target=0.05, eta=1.0, loss=loss_code(loss), intercept_rate=1.0,
    )  # fmt: skip
    v, state, stats = np.zeros(X.shape[1]), np.array([1.0, 0.0, 50.0, 0.0]), np.zeros(6)
    run_steps(cfg, v, state, sp.csr_matrix(X), y, order, stats)
    w_ref, b_ref, lam_ref = ref_np(X, y, order, cfg, loss, 50.0)
    np.testing.assert_allclose(v * state[0], w_ref, rtol=1e-9, atol=1e-12)
    assert state[1] == pytest.approx(b_ref, rel=1e-9, abs=1e-12)
    assert state[2] == pytest.approx(lam_ref, rel=1e-9)
    # the linear steps of Alg. 4 as printed throw w much further out (here 9-31
    # against 1.8-4.4)
    w_linear, _, _ = ref_np(X, y, order, cfg, loss, 50.0, flow=False)
    assert np.linalg.norm(w_ref) < 0.5 * np.linalg.norm(w_linear)


def test_flow_root_solves_its_equation():
    from bigrate.linear._kernels import _flow_root

    for T in (-1e12, -37.0, -1.0, -1e-9, 0.0, 1e-9, 0.3, 4.0, 123.0, 1e15):
        u = _flow_root(T)
        assert 2 * u + 2 * np.sinh(u) == pytest.approx(T, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("mode", ["balanced", "pairs"])
@pytest.mark.parametrize("loss", ["sigmoid", "ramp"])
def test_steps_on_rows_where_they_lie_equal_steps_on_the_gathered_rows(mode, loss):
    """Out of core, the step kernels read a chunk's rows in the sampler's buffers
    (a RowSequence of decoded row groups, several buffers joined): the same steps, bit
    for bit, as on the rows first copied into one CSR matrix in step order."""
    from bigrate.data.format import RowBlock, RowSequence, gather

    rng = np.random.default_rng(3)

    def block(n):
        X = sp.random(n, 40, density=0.2, format="csr", dtype=np.float32,
                      random_state=rng)  # fmt: skip
        y = rng.choice(np.array([-1, 1], dtype=np.int8), n)
        return RowBlock(X, y, rng.integers(0, 10**9, n))

    seq = RowSequence.joined(
        [RowSequence([block(n) for n in (90, 0, 7, 150)]), RowSequence([block(60)])]
    )
    pos, neg = np.flatnonzero(seq.y > 0), np.flatnonzero(seq.y < 0)
    steps = 3000  # rows drawn with repeats, hopping between the blocks
    cfg = KernelConfig(mode, 1.0, 1.0, 1e-3, 0.5, 0.05, 0.1, 2.0, loss_code(loss), 0.1)
    if mode == "pairs":
        order = (rng.choice(pos, steps), rng.choice(neg, steps))
        chunk = gather([(seq, order[0]), (seq, order[1])])
        flat = (np.arange(steps), np.arange(steps, 2 * steps))
    else:
        order = rng.integers(0, len(seq), steps)
        chunk = gather([(seq, order)])
        flat = np.arange(steps)
    runs = []
    for X, y, o in ((seq, seq.y, order), (chunk.X, chunk.y, flat)):
        v, state, stats = np.zeros(40), np.array([1.0, 0.0, 1.0, 0.0]), np.zeros(6)
        run_steps(cfg, v, state, X, y, o, stats)
        runs.append((v, state, stats))
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.abs(runs[0][0]).sum() > 0 and runs[0][1][2] != 1.0  # steps were taken
    with pytest.raises(IndexError, match="chunk positions"):
        bad = (order[0], order[1] + len(seq)) if mode == "pairs" else order + len(seq)
        run_steps(cfg, np.zeros(40), np.array([1.0, 0, 1, 0]), seq, seq.y, bad,
                  np.zeros(6))  # fmt: skip
