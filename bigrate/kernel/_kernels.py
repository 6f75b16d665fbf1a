"""Numba kernels of the SMO solver: kernel rows with an LRU cache, WSS2, two-variable steps.

Problem (general form, so that the NP-SVM's shifted boxes fit):

    min_a  1/2 a^T Q a - p^T a     s.t.  y^T a = delta,   lo_i <= a_i <= hi_i,
    Q_ij = y_i y_j K(x_i, x_j).

Working-set selection is the second-order rule of Fan, Chen and Lin (2005, WSS 2) with the
index sets written for per-example boxes:

    I_up  = {t : y_t = +1, a_t < hi_t} u {t : y_t = -1, a_t > lo_t}
    I_low = {t : y_t = +1, a_t > lo_t} u {t : y_t = -1, a_t < hi_t}

i = argmax_{t in I_up} -y_t G_t, then j minimises -b_it^2 / a_it over t in I_low with
b_it = -y_i G_i + y_t G_t > 0 and a_it = K_ii + K_tt - 2 K_it (floored at TAU). Stop when
m(a) - M(a) = max_{I_up} -y G - min_{I_low} -y G <= eps.
"""

import numpy as np
from numba import njit

LINEAR = 0
RBF = 1
POLY = 2

OK = 0
MAX_ITER = 1
TAU = 1e-12


@njit(cache=True, nogil=True, inline="always")
def _kval(kind, s, sqi, sqj, gamma, coef0, degree):
    """k(x, z) from the inner product s = <x, z> and the squared norms."""
    if kind == LINEAR:
        return s
    if kind == RBF:
        return np.exp(-gamma * max(sqi + sqj - 2.0 * s, 0.0))
    return (gamma * s + coef0) ** degree


@njit(cache=True, nogil=True)
def _dense_row(X, sq, i, kind, gamma, coef0, degree, out):
    n, d = X.shape
    for j in range(n):
        s = 0.0
        for k in range(d):
            s += X[i, k] * X[j, k]
        out[j] = _kval(kind, s, sq[i], sq[j], gamma, coef0, degree)


@njit(cache=True, nogil=True)
def _csr_row(indptr, indices, data, sq, i, kind, gamma, coef0, degree, work, out):
    n = indptr.shape[0] - 1
    for k in range(indptr[i], indptr[i + 1]):
        work[indices[k]] = data[k]
    for j in range(n):
        s = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            s += data[k] * work[indices[k]]
        out[j] = _kval(kind, s, sq[i], sq[j], gamma, coef0, degree)
    for k in range(indptr[i], indptr[i + 1]):
        work[indices[k]] = 0.0


@njit(cache=True, nogil=True)
def _get_row(i, kp, stats):
    """Row i of K, from the cache or computed into the least recently used slot.

    ``kp`` bundles the inputs and the cache: (Xd, indptr, indices, data, sparse, sq, kind,
    gamma, coef0, degree, work, cache, slot_of, row_of, last_used, clock)."""
    (
        Xd,
        indptr,
        indices,
        data,
        sparse,
        sq,
        kind,
        gamma,
        coef0,
        degree,
        work,
        cache,
        slot_of,
        row_of,
        last_used,
        clock,
    ) = kp
    s = slot_of[i]
    clock[0] += 1
    if s >= 0:
        last_used[s] = clock[0]
        stats[0] += 1  # hit
        return cache[s]
    stats[1] += 1  # miss
    s = 0
    best = last_used[0]
    for k in range(1, last_used.shape[0]):
        if last_used[k] < best:
            best = last_used[k]
            s = k
    old = row_of[s]
    if old >= 0:
        slot_of[old] = -1
    row_of[s] = i
    slot_of[i] = s
    last_used[s] = clock[0]
    if sparse:
        _csr_row(
            indptr, indices, data, sq, i, kind, gamma, coef0, degree, work, cache[s]
        )
    else:
        _dense_row(Xd, sq, i, kind, gamma, coef0, degree, cache[s])
    return cache[s]


@njit(cache=True, nogil=True)
def smo_solve(kp, y, p, lo, hi, a, G, diag, eps, max_iter, stats):
    """Minimise in place from a feasible ``a`` with gradient ``G = Q a - p`` already set.

    Returns (status, iterations, gap). ``stats`` accumulates [cache hits, misses].
    """
    n = y.shape[0]
    it = 0
    gap = np.inf
    while it < max_iter:
        # select i
        gmax = -np.inf
        i = -1
        for t in range(n):
            if (y[t] > 0 and a[t] < hi[t]) or (y[t] < 0 and a[t] > lo[t]):
                v = -y[t] * G[t]
                if v > gmax:
                    gmax = v
                    i = t
        gmin = np.inf
        for t in range(n):
            if (y[t] > 0 and a[t] > lo[t]) or (y[t] < 0 and a[t] < hi[t]):
                v = -y[t] * G[t]
                if v < gmin:
                    gmin = v
        gap = gmax - gmin
        if i < 0 or gap <= eps:
            return OK, it, gap
        Ki = _get_row(i, kp, stats)
        # select j (second order)
        j = -1
        best = np.inf
        for t in range(n):
            if (y[t] > 0 and a[t] > lo[t]) or (y[t] < 0 and a[t] < hi[t]):
                b = gmax + y[t] * G[t]
                if b > 0.0:
                    aa = diag[i] + diag[t] - 2.0 * Ki[t]
                    if aa <= 0.0:
                        aa = TAU
                    v = -(b * b) / aa
                    if v <= best:
                        best = v
                        j = t
        if j < 0:
            return OK, it, gap
        Kj = _get_row(j, kp, stats)
        # two-variable update along the feasible direction, clipped to the boxes
        yi = y[i]
        yj = y[j]
        quad = diag[i] + diag[j] - 2.0 * Ki[j]
        if quad <= 0.0:
            quad = TAU
        # move a_i by +yi*s, a_j by -yj*s (keeps y^T a), s >= 0 increases -yi G_i - (-yj G_j)
        s = (-yi * G[i] + yj * G[j]) / quad
        # bounds on s from the boxes
        if yi > 0:
            s = min(s, hi[i] - a[i])
        else:
            s = min(s, a[i] - lo[i])
        if yj > 0:
            s = min(s, a[j] - lo[j])
        else:
            s = min(s, hi[j] - a[j])
        if s <= 0.0:
            return OK, it, gap
        dai = yi * s
        daj = -yj * s
        a[i] += dai
        a[j] += daj
        # clean tiny drift onto the bounds
        if abs(a[i] - hi[i]) < 1e-15 * max(1.0, abs(hi[i])):
            a[i] = hi[i]
        if abs(a[i] - lo[i]) < 1e-15 * max(1.0, abs(lo[i])):
            a[i] = lo[i]
        if abs(a[j] - hi[j]) < 1e-15 * max(1.0, abs(hi[j])):
            a[j] = hi[j]
        if abs(a[j] - lo[j]) < 1e-15 * max(1.0, abs(lo[j])):
            a[j] = lo[j]
        for t in range(n):
            G[t] += y[t] * (yi * Ki[t] * dai + yj * Kj[t] * daj)
        it += 1
    return MAX_ITER, it, gap


@njit(cache=True, nogil=True)
def gradient(kp, y, p, a, stats):
    """G = Q a - p, computed from the kernel rows of the non-zero a_i."""
    n = y.shape[0]
    G = -p.copy()
    for i in range(n):
        if a[i] != 0.0:
            Ki = _get_row(i, kp, stats)
            c = y[i] * a[i]
            for t in range(n):
                G[t] += y[t] * Ki[t] * c
    return G


@njit(cache=True, nogil=True)
def diag_kernel(sq, kind, gamma, coef0, degree):
    n = sq.shape[0]
    out = np.empty(n)
    for i in range(n):
        out[i] = _kval(kind, sq[i], sq[i], sq[i], gamma, coef0, degree)
    return out


@njit(cache=True, nogil=True)
def cross_kernel_dense(A, sqa, B, sqb, kind, gamma, coef0, degree):
    """K(A_i, B_j) for dense A (m x d) and B (n x d)."""
    m, d = A.shape
    n = B.shape[0]
    out = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            s = 0.0
            for k in range(d):
                s += A[i, k] * B[j, k]
            out[i, j] = _kval(kind, s, sqa[i], sqb[j], gamma, coef0, degree)
    return out
