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
from bigrate.losses._kernels import loss_and_derivative
from bigrate.solvers.sparse_rows import row_axpy, row_dot

OK = 0
NON_FINITE = 1  # w, b or lambda became NaN / inf (learning rate too large)

_RESCALE = 1e-9


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
        w <- (1 - gamma lambda_c) w - gamma a_t l'(z) y x
        b <- b - intercept_rate gamma a_t l'(z) y
        if y = -1: lam <- lam (1 + nu (l(z) - rho))        (l(z) = l(-f) for y = -1)
        t <- t + 1
    """
    scale = state[0]
    b = state[1]
    lam = state[2]
    t = state[3]
    # scalar accumulators (array writes in the loop would alias v and stay in memory)
    n_neg = 0.0
    s_neg = 0.0
    fa = 0.0
    n_pos = 0.0
    s_pos = 0.0
    miss = 0.0
    for j in range(order.shape[0]):
        i = order[j]
        f = scale * row_dot(indptr, indices, data, i, v) + b
        yi = y[i]
        z = yi * f
        l, dl = loss_and_derivative(loss, z, eta)
        gamma = gamma0 / (1.0 + lambda_c * t)
        if yi > 0:
            a = w_pos
            n_pos += 1.0
            s_pos += l
            if f <= 0.0:
                miss += 1.0
        else:
            a = lam * w_neg
            n_neg += 1.0
            s_neg += l
            if f >= 0.0:
                fa += 1.0
        scale *= 1.0 - gamma * lambda_c
        g = gamma * a * dl * yi
        if g != 0.0:
            row_axpy(indptr, indices, data, i, -g / scale, v)
            b -= intercept_rate * g
        if yi < 0:
            lam = _updated_multiplier(lam, 1.0 + nu * (l - rho))
        t += 1.0
        scale = _rescaled(v, scale)
    stats[0] += n_neg
    stats[1] += s_neg
    stats[2] += fa
    stats[3] += n_pos
    stats[4] += s_pos
    stats[5] += miss
    return _store(state, scale, b, lam, t)


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
    """
    scale = state[0]
    b = state[1]
    lam = state[2]
    t = state[3]
    for j in range(pos_order.shape[0]):
        ip = pos_order[j]
        ineg = neg_order[j]
        fp = scale * row_dot(indptr, indices, data, ip, v) + b
        fn = scale * row_dot(indptr, indices, data, ineg, v) + b
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
        gp = gamma * (1.0 + lam * q) * dlp  # y = +1
        gn = -gamma * lam * dln  # y = -1
        if gp != 0.0:
            row_axpy(indptr, indices, data, ip, -gp / scale, v)
        if gn != 0.0:
            row_axpy(indptr, indices, data, ineg, -gn / scale, v)
        b -= intercept_rate * (gp + gn)
        lam = _updated_multiplier(lam, 1.0 + nu * (ln - q * (1.0 - lp)))
        t += 1.0
        scale = _rescaled(v, scale)
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
