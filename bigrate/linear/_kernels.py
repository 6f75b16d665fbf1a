"""Numba kernels of the stochastic NP and q-value learners (Gasso et al. 2011, Alg. 4).

The weight vector is kept as w = scale * v (Bottou's trick), so the L2 decay
w <- (1 - gamma_t lambda_c) w is one scalar multiply and a step costs O(nnz(x)).

``intercept_rate`` scales the step on b: 0 without an intercept, and (as in
scikit-learn's SGD, its ``intercept_decay``) 0.01 on sparse rows, where b takes a step on
every example while each word feature takes one only on the rare rows that hold it.

``state`` is a float64 array [scale, b, lam, t]; ``stats`` accumulates, over the steps
of a call, [n_neg, sum l(-f) over negatives, n_neg with f >= 0, n_pos, sum l(f) over
positives, n_pos with f <= 0] (margins taken before each update: a progressive estimate).
"""

import numpy as np

from bigrate._jit import njit
from bigrate.losses._kernels import SIGMOID, loss_and_derivative
from bigrate.solvers.sparse_rows import row_axpy, row_dot, row_dot_sq

OK = 0
NON_FINITE = 1  # w, b or lambda became NaN / inf (learning rate too large)

_RESCALE = 1e-9

# A sigmoid step that would move its example's margin u = eta z by more than this is
# taken along the loss's gradient flow instead (see _flow_factor); below it the linear
# step and the flow agree to within 0.3% (a step of 0.5 from u = 0: 0.497).
_LINEAR_DU = 0.5


@njit(cache=True, nogil=True, inline="always")
def _rescaled(v, scale):
    """The scale of w = scale * v after a step: when it gets tiny (the decay's
    products), it is put back into v and is 1 again."""
    if scale < _RESCALE:
        for k in range(v.shape[0]):
            v[k] *= scale
        return 1.0
    return scale


@njit(cache=True, nogil=True, inline="always")
def _updated_multiplier(lam, factor):
    """lam * factor, kept at least 1e-12 (the multiplier stays positive)."""
    lam *= factor
    return 1e-12 if lam < 1e-12 else lam  # (a NaN stays NaN: NON_FINITE)


@njit(cache=True, nogil=True, inline="always")
def _store(state, scale, b, lam, t):
    """Write [scale, b, lam, t] into ``state``; NON_FINITE if one of them is NaN or
    infinite (the learning rate was too large), else OK."""
    state[0] = scale
    state[1] = b
    state[2] = lam
    state[3] = t
    if not (np.isfinite(b) and np.isfinite(lam) and np.isfinite(scale)):
        return NON_FINITE
    return OK


@njit(cache=True, nogil=True, inline="always")
def _flow_root(T):
    """The u with 2 u + 2 sinh(u) = T (odd and increasing: Newton from asinh(T / 2),
    on the side of the root where it converges monotonically)."""
    u = np.arcsinh(0.5 * T)
    for _ in range(100):
        step = (2.0 * u + 2.0 * np.sinh(u) - T) / (2.0 + 2.0 * np.cosh(u))
        u -= step
        if abs(step) <= 1e-13 * (1.0 + abs(u)):
            break
    return u


@njit(cache=True, nogil=True, inline="always")
def _flow_factor(loss, z, eta, h, kappa, dl):
    """What the linear step's coefficient is multiplied by so that the example's
    margin z moves as the gradient flow of its own loss does over the step.

    An example of weight a at step size gamma moves its margin (z = y f) by
    dz = -h l'(z) kappa with h = gamma a and kappa = ||x||^2 (+ the intercept's rate).
    Integrated over the step instead (the importance-weight-aware update of
    Karampatziakis & Langford 2011), a large h cannot throw the margin past where the
    loss is flat: there the gradient vanishes, the constraint's violation cannot fall
    and the multiplier would grow without bound. Ramp: the flow stops where the ramp
    ends (z = eta); below that it is the linear step, bit for bit. Sigmoid
    l = 1 / (1 + e^u), u = eta z: du / ds = eta^2 kappa l (1 - l), whose integral is
    2 u + 2 sinh(u) = const + eta^2 kappa s; taken where the linear step would move u
    by more than _LINEAR_DU."""
    if dl == 0.0 or kappa <= 0.0:
        return 1.0
    dz = -h * dl * kappa  # > 0: the linear step's move of the margin
    if loss == SIGMOID:
        du = eta * dz
        if not du > _LINEAR_DU:
            return 1.0
        u0 = eta * z
        u1 = _flow_root(2.0 * u0 + 2.0 * np.sinh(u0) + eta * eta * kappa * h)
        return (u1 - u0) / du
    room = eta - z  # ramp: dl != 0 only where -eta < z < eta
    if dz <= room:
        return 1.0
    return room / dz


@njit(cache=True, nogil=True, inline="always")
def _np_step(indptr, indices, data, i, yi, w_pos, w_neg, v, scale, b, lam, t,
             lambda_c, gamma0, nu, rho, eta, loss, intercept_rate):  # fmt: skip
    """One Alg. 4 step on row ``i`` of (indptr, indices, data), of label ``yi``,
    updating v in place; returns (f, l, scale, b, lam, t): the row's decision value and
    loss before the step, and the state after it."""
    dot, sq = row_dot_sq(indptr, indices, data, i, v)
    f = scale * dot + b
    z = yi * f
    l, dl = loss_and_derivative(loss, z, eta)
    gamma = gamma0 / (1.0 + lambda_c * t)
    a = w_pos if yi > 0 else lam * w_neg
    scale *= 1.0 - gamma * lambda_c
    g = gamma * a * dl * yi
    g *= _flow_factor(loss, z, eta, gamma * a, sq + intercept_rate, dl)
    if g != 0.0:
        row_axpy(indptr, indices, data, i, -g / scale, v)
        b -= intercept_rate * g
    if yi < 0:
        lam = _updated_multiplier(lam, 1.0 + nu * (l - rho))
    t += 1.0
    scale = _rescaled(v, scale)
    return f, l, scale, b, lam, t


@njit(cache=True, nogil=True, inline="always")
def _tally(yi, f, l, tally):
    """``tally`` (n_neg, sum l over negatives, false alarms, n_pos, sum l over
    positives, misses) with the step of label ``yi``, decision value ``f`` and loss
    ``l`` counted (scalars in the loop: array writes there would alias v and stay in
    memory)."""
    n_neg, s_neg, fa, n_pos, s_pos, miss = tally
    if yi > 0:
        return (
            n_neg,
            s_neg,
            fa,
            n_pos + 1.0,
            s_pos + l,
            miss + (1.0 if f <= 0.0 else 0.0),
        )
    return n_neg + 1.0, s_neg + l, fa + (1.0 if f >= 0.0 else 0.0), n_pos, s_pos, miss


@njit(cache=True, nogil=True, inline="always")
def _add_tally(stats, tally):
    for k in range(6):
        stats[k] += tally[k]


@njit(cache=True, nogil=True, inline="always")
def _block_of(starts, g, b):
    """The block of a row sequence that holds position ``g``: ``b`` when it does (runs
    of one block are the rule), else found by bisection of the block ``starts``."""
    if starts[b] <= g < starts[b + 1]:
        return b
    return np.searchsorted(starts, g, side="right") - 1


@njit(cache=True, nogil=True)
def np_sgd_steps(
    indptr,
    indices,
    data,
    y,
    order,
    w_pos,
    w_neg,
    v,
    state,
    lambda_c,
    gamma0,
    nu,
    rho,
    eta,
    loss,
    intercept_rate,
    stats,
):
    """Alg. 4 steps on rows ``order`` of a CSR matrix, in that order.

    Example weights a_t are ``w_pos`` for positives and ``lam * w_neg`` for negatives
    (balanced sampling: 1 and 1; uniform: n/n+ and n/n-). Per step, with f the current
    decision value and z = y f::

        gamma = gamma0 / (1 + lambda_c t)
        w <- (1 - gamma lambda_c) w - phi gamma a_t l'(z) y x
        b <- b - phi intercept_rate gamma a_t l'(z) y
        if y = -1: lam <- lam (1 + nu (l(z) - rho))        (l(z) = l(-f) for y = -1)
        t <- t + 1

    phi is 1 but where the step would throw the example's margin past where its loss
    is flat (:func:`_flow_factor`: the step along the loss's gradient flow).
    """
    scale, b, lam, t = state[0], state[1], state[2], state[3]
    tally = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    for j in range(order.shape[0]):
        i = order[j]
        yi = y[i]
        f, l, scale, b, lam, t = _np_step(indptr, indices, data, i, yi, w_pos, w_neg,
                                          v, scale, b, lam, t, lambda_c, gamma0, nu,
                                          rho, eta, loss, intercept_rate)  # fmt: skip
        tally = _tally(yi, f, l, tally)
    _add_tally(stats, tally)
    return _store(state, scale, b, lam, t)


@njit(cache=True, nogil=True)
def np_sgd_steps_seq(
    ptrs,
    inds,
    vals,
    starts,
    y,
    order,
    w_pos,
    w_neg,
    v,
    state,
    lambda_c,
    gamma0,
    nu,
    rho,
    eta,
    loss,
    intercept_rate,
    stats,
):
    """:func:`np_sgd_steps` on the rows of a sequence of CSR blocks where they lie,
    without copying them into one matrix first: ``order`` holds positions in the
    sequence, block k holding its positions ``starts[k]:starts[k + 1]`` (``ptrs[k]``,
    ``inds[k]``, ``vals[k]``: its indptr, indices and data), ``y`` the labels by
    position. The same steps, bit for bit, as on the gathered rows."""
    scale, b, lam, t = state[0], state[1], state[2], state[3]
    tally = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    k = 0
    ptr, ind, val = ptrs[0], inds[0], vals[0]
    for j in range(order.shape[0]):
        g = order[j]
        kk = _block_of(starts, g, k)
        if kk != k:
            k = kk
            ptr, ind, val = ptrs[k], inds[k], vals[k]
        yi = y[g]
        f, l, scale, b, lam, t = _np_step(ptr, ind, val, g - starts[k], yi, w_pos,
                                          w_neg, v, scale, b, lam, t, lambda_c, gamma0,
                                          nu, rho, eta, loss, intercept_rate)  # fmt: skip
        tally = _tally(yi, f, l, tally)
    _add_tally(stats, tally)
    return _store(state, scale, b, lam, t)


@njit(cache=True, nogil=True, internal=True)
def _pair_step(pp, pi, pv, ip, np_, ni, nv, ineg, v, scale, b, lam, t, lambda_c,
               gamma0, nu, q, eta, loss, intercept_rate, stats):  # fmt: skip
    """One section 4 step on positive row ``ip`` of (pp, pi, pv) and negative row
    ``ineg`` of (np_, ni, nv), updating v and ``stats`` in place; returns the state
    (scale, b, lam, t) after it."""
    dot, sqp = row_dot_sq(pp, pi, pv, ip, v)
    fp = scale * dot + b
    dot, sqn = row_dot_sq(np_, ni, nv, ineg, v)
    fn = scale * dot + b
    lp, dlp = loss_and_derivative(loss, fp, eta)
    ln, dln = loss_and_derivative(loss, -fn, eta)
    stats[3] += 1.0
    stats[4] += lp
    if fp <= 0.0:
        stats[5] += 1.0
    stats[0] += 1.0
    stats[1] += ln
    if fn >= 0.0:
        stats[2] += 1.0
    gamma = gamma0 / (1.0 + lambda_c * t)
    scale *= 1.0 - gamma * lambda_c
    hp = gamma * (1.0 + lam * q)
    gp = hp * dlp  # y = +1
    gp *= _flow_factor(loss, fp, eta, hp, sqp + intercept_rate, dlp)
    gn = -gamma * lam * dln  # y = -1
    gn *= _flow_factor(loss, -fn, eta, gamma * lam, sqn + intercept_rate, dln)
    if gp != 0.0:
        row_axpy(pp, pi, pv, ip, -gp / scale, v)
    if gn != 0.0:
        row_axpy(np_, ni, nv, ineg, -gn / scale, v)
    b -= intercept_rate * (gp + gn)
    lam = _updated_multiplier(lam, 1.0 + nu * (ln - q * (1.0 - lp)))
    t += 1.0
    scale = _rescaled(v, scale)
    return scale, b, lam, t


@njit(cache=True, nogil=True)
def qvalue_sgd_steps(
    indptr,
    indices,
    data,
    pos_order,
    neg_order,
    v,
    state,
    lambda_c,
    gamma0,
    nu,
    q,
    eta,
    loss,
    intercept_rate,
    stats,
):
    """Section 4 steps: each step takes one positive and one negative row.

    With the Lagrangian (13) divided by C: the positive's weight is (1 + lam q) and the
    negative's lam; then
    lam <- lam (1 + nu (l(-f(x-)) - q (1 - l(f(x+))))).
    Each row's step is taken along its loss's gradient flow where it is large
    (:func:`_flow_factor`).
    """
    scale, b, lam, t = state[0], state[1], state[2], state[3]
    for j in range(pos_order.shape[0]):
        scale, b, lam, t = _pair_step(indptr, indices, data, pos_order[j], indptr,
                                      indices, data, neg_order[j], v, scale, b, lam,
                                      t, lambda_c, gamma0, nu, q, eta, loss,
                                      intercept_rate, stats)  # fmt: skip
    return _store(state, scale, b, lam, t)


@njit(cache=True, nogil=True)
def qvalue_sgd_steps_seq(
    ptrs,
    inds,
    vals,
    starts,
    pos_order,
    neg_order,
    v,
    state,
    lambda_c,
    gamma0,
    nu,
    q,
    eta,
    loss,
    intercept_rate,
    stats,
):
    """:func:`qvalue_sgd_steps` on the rows of a sequence of CSR blocks where they lie
    (positions, blocks and ``starts`` as in :func:`np_sgd_steps_seq`)."""
    scale, b, lam, t = state[0], state[1], state[2], state[3]
    kp = kn = 0
    pp, pi, pv = ptrs[0], inds[0], vals[0]
    np_, ni, nv = ptrs[0], inds[0], vals[0]
    for j in range(pos_order.shape[0]):
        gp, gn = pos_order[j], neg_order[j]
        k = _block_of(starts, gp, kp)
        if k != kp:
            kp = k
            pp, pi, pv = ptrs[k], inds[k], vals[k]
        k = _block_of(starts, gn, kn)
        if k != kn:
            kn = k
            np_, ni, nv = ptrs[k], inds[k], vals[k]
        scale, b, lam, t = _pair_step(pp, pi, pv, gp - starts[kp], np_, ni, nv,
                                      gn - starts[kn], v, scale, b, lam, t, lambda_c,
                                      gamma0, nu, q, eta, loss, intercept_rate,
                                      stats)  # fmt: skip
    return _store(state, scale, b, lam, t)


@njit(cache=True, nogil=True)
def decision_csr(indptr, indices, data, w, b):
    """f(x_i) = <w, x_i> + b for every row of a CSR matrix."""
    n = indptr.shape[0] - 1
    out = np.empty(n, dtype=np.float64)
    for i in range(n):
        out[i] = row_dot(indptr, indices, data, i, w) + b
    return out


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def sq_norm_sum(indptr, data):
    """Sum over rows of ||x_i||^2."""
    s = 0.0
    for k in range(indptr[-1] - indptr[0]):
        d = data[indptr[0] + k]
        s += d * d
    return s
