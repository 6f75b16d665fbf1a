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

from bigrate._jit import njit

LINEAR = 0
RBF = 1
POLY = 2

OK = 0
MAX_ITER = 1
TAU = 1e-12

# rows of the row cache's bookkeeping arrays in ``kp`` (see :func:`_row`): per
# variable, per cache slot, the clock's ticks; and the kernel's parameters
VA_SLOT, VA_ACT, VA_BUF = 0, 1, 2
SL_ROW, SL_USED, SL_FULL, SL_TIME = 0, 1, 2, 3
TK_CLOCK, TK_REACT = 0, 1
P_KIND, P_SPARSE, P_GAMMA, P_COEF0, P_DEGREE = 0, 1, 2, 3, 4


@njit(cache=True, nogil=True, inline="always")
def _kval(kind, s, sqi, sqj, gamma, coef0, degree):
    """k(x, z) from the inner product s = <x, z> and the squared norms."""
    if kind == LINEAR:
        return s
    if kind == RBF:
        return np.exp(-gamma * max(sqi + sqj - 2.0 * s, 0.0))
    return (gamma * s + coef0) ** degree


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, internal=True)
def _dot_rows(X, i, j):
    """<X[i], X[j]>; reassociation lets the compiler vectorise the sum."""
    s = 0.0
    for k in range(X.shape[1]):
        s += X[i, k] * X[j, k]
    return s


@njit(cache=True, nogil=True, internal=True)
def _fill_cols(kp, i, cols, c0, c1, out):
    """out[j] = K(x_i, x_j) for j in cols[c0:c1]: the inner products first, then the
    kernel function in a second loop (exp pipelines better on its own)."""
    Xd, indptr, indices, data, sq, work = kp[:6]
    par = kp[10]
    kind, gamma, coef0, degree = (
        int(par[P_KIND]),
        par[P_GAMMA],
        par[P_COEF0],
        int(par[P_DEGREE]),
    )
    if par[P_SPARSE] != 0.0:
        for k in range(indptr[i], indptr[i + 1]):
            work[indices[k]] = data[k]
        for c in range(c0, c1):
            j = cols[c]
            s = 0.0
            for k in range(indptr[j], indptr[j + 1]):
                s += data[k] * work[indices[k]]
            out[j] = s
        for k in range(indptr[i], indptr[i + 1]):
            work[indices[k]] = 0.0
    else:
        for c in range(c0, c1):
            j = cols[c]
            out[j] = _dot_rows(Xd, i, j)
    sqi = sq[i]
    if kind == RBF:
        for c in range(c0, c1):
            j = cols[c]
            out[j] = np.exp(-gamma * max(sqi + sq[j] - 2.0 * out[j], 0.0))
    elif kind != LINEAR:
        for c in range(c0, c1):
            j = cols[c]
            out[j] = _kval(kind, out[j], sqi, sq[j], gamma, coef0, degree)


@njit(cache=True, nogil=True, internal=True)
def _row(i, kp, cols, m, full, stats):
    """Row i of K, valid at least on the active columns ``cols[:m]`` (on every column
    with ``full``), from the cache or computed into the least recently used slot.

    ``kp`` bundles the inputs and the cache (:meth:`KernelProblem._kp
    <bigrate.kernel.smo.KernelProblem>`): (Xd, indptr, indices, data, sq, work,
    cache, var, slot, tick, par), with the cache's bookkeeping in three int64 arrays:
    ``var`` per variable (its slot or -1, when it was last reactivated, and a column
    buffer), ``slot`` per cache slot (its row or -1, when it was last used, whether it
    holds the full row, since when it holds the then active columns) and ``tick``
    (the clock, the last reactivation), and the kernel's parameters in ``par``
    (``P_*``). A slot holds a full row, or a partial one: at time
    ``slot[SL_TIME]`` (a tick of the clock) it held every column then active. A
    column reactivated later (``var[VA_ACT]``, stamped by :func:`_unshrink`) is
    computed when the row is next used, so partial rows stay useful across
    reconstructions and across solves, as libsvm's rows keep their computed prefix.
    (Few arrays in ``kp``: a cold process's compile of every kernel taking it grows
    with its members.)"""
    cache, var, slot, tick = kp[6:10]
    n = cols.shape[0]
    tick[TK_CLOCK] += 1
    now = tick[TK_CLOCK]
    s = var[VA_SLOT, i]
    if s >= 0:
        slot[SL_USED, s] = now
        row = cache[s]
        if slot[SL_FULL, s] or (not full and slot[SL_TIME, s] > tick[TK_REACT]):
            stats[0] += 1
            return row
        stats[1] += 1
        # active columns reactivated since the row was last completed
        t0 = slot[SL_TIME, s]
        if t0 < tick[TK_REACT]:
            colbuf = var[VA_BUF]
            k = 0
            for c in range(m):
                if var[VA_ACT, cols[c]] > t0:
                    colbuf[k] = cols[c]
                    k += 1
            _fill_cols(kp, i, colbuf, 0, k, row)
        if full or m == n:
            _fill_cols(kp, i, cols, m, n, row)
            slot[SL_FULL, s] = 1
        slot[SL_TIME, s] = now
        return row
    s = 0
    best = slot[SL_USED, 0]
    for k in range(1, slot.shape[1]):
        if slot[SL_USED, k] < best:
            best = slot[SL_USED, k]
            s = k
    old = slot[SL_ROW, s]
    if old >= 0:
        var[VA_SLOT, old] = -1
    slot[SL_ROW, s] = i
    var[VA_SLOT, i] = s
    slot[SL_USED, s] = now
    stats[1] += 1
    row = cache[s]
    if full or m == n:
        _fill_cols(kp, i, cols, 0, n, row)
        slot[SL_FULL, s] = 1
    else:
        _fill_cols(kp, i, cols, 0, m, row)
        slot[SL_FULL, s] = 0
    slot[SL_TIME, s] = now
    return row


@njit(cache=True, nogil=True, internal=True)
def _flags(y, a, lo, hi, t, up, low):
    """Membership of t in I_up and I_low."""
    if y[t] > 0:
        up[t] = a[t] < hi[t]
        low[t] = a[t] > lo[t]
    else:
        up[t] = a[t] > lo[t]
        low[t] = a[t] < hi[t]


@njit(cache=True, nogil=True, internal=True)
def _bounded_part(a, lo, hi, t):
    """a_t if it sits at a bound (its share of G_bar), else 0; the complement of the
    free test lo < a < hi, so a value an ulp outside its box still counts once."""
    if a[t] <= lo[t] or a[t] >= hi[t]:
        return a[t]
    return 0.0


@njit(cache=True, nogil=True, internal=True)
def _update_bar(kp, y, a, lo, hi, i, ai_old, j, aj_old, mgbar, perm, m, stats):
    """Keep G_bar (as -y G_bar) when the variables i and j of a step moved onto, off
    or between bounds (``ai_old``, ``aj_old``: their values before it), i first."""
    for k in range(2):
        u, old = (i, ai_old) if k == 0 else (j, aj_old)
        bo = old if (old <= lo[u] or old >= hi[u]) else 0.0
        dbar = _bounded_part(a, lo, hi, u) - bo
        if dbar != 0.0:
            Ku = _row(u, kp, perm, m, True, stats)
            cu = y[u] * dbar
            for t in range(y.shape[0]):
                mgbar[t] -= cu * Ku[t]


@njit(cache=True, nogil=True, internal=True)
def _unshrink(kp, y, p, a, lo, hi, mg, aux, a_ref, use_bar, perm, m, stats):
    """-y G on the inactive variables perm[m:], then every variable active again
    (each reactivated one stamped: its entries in partial cached rows are missing,
    see :func:`_row`); returns the new active size. One kernel for what was three:
    in a cold process each kernel taking ``kp`` compiled with a cost of its own
    (0.3-0.4 s).

    With ``use_bar``, the gradients from G_bar (``aux`` = -y G_bar: the share of the
    variables at a bound, kept up to date) and the free variables, which are all
    active (a shrunk variable sits at a bound or cannot move): libsvm's
    reconstruction.

    Else from their value when every gradient was last exact (``aux`` = -y G at the
    duals ``a_ref``: the solve's start or the previous reconstruction) and the duals
    that moved since: a shrunk variable's gradient missed exactly those updates. A
    warm start that moves few duals pays for few rows (libsvm's G_bar instead needs a
    row of every variable at a non-zero bound). Afterwards the reference is this
    point (also with every variable active)."""
    n = y.shape[0]
    if use_bar:
        n_free = 0
        if m < n:
            for c in range(m, n):
                t = perm[c]
                mg[t] = y[t] * p[t] + aux[t]
            for c in range(m):
                t = perm[c]
                if lo[t] < a[t] < hi[t]:
                    n_free += 1
        if n_free > 0 and n_free * n > 2 * m * (n - m):
            # rows of the inactive variables over the active columns
            for c in range(m, n):
                t = perm[c]
                Kt = _row(t, kp, perm, m, False, stats)
                acc = 0.0
                for d in range(m):
                    u = perm[d]
                    if lo[u] < a[u] < hi[u]:
                        acc += y[u] * a[u] * Kt[u]
                mg[t] -= acc
        elif n_free > 0:
            # full rows of the free variables
            for c in range(m):
                u = perm[c]
                if lo[u] < a[u] < hi[u]:
                    Ku = _row(u, kp, perm, m, True, stats)
                    cu = y[u] * a[u]
                    for d in range(m, n):
                        t = perm[d]
                        mg[t] -= cu * Ku[t]
    else:
        for c in range(m, n):
            t = perm[c]
            mg[t] = aux[t]
        if m < n:
            for u in range(n):
                du = a[u] - a_ref[u]
                if du != 0.0:
                    Ku = _row(u, kp, perm, m, True, stats)
                    cu = y[u] * du
                    for c in range(m, n):
                        t = perm[c]
                        mg[t] -= cu * Ku[t]
        for t in range(n):
            aux[t] = mg[t]
            a_ref[t] = a[t]
    if m == n:
        return m
    stats[3] += 1
    var, tick = kp[7], kp[9]
    tick[TK_CLOCK] += 1
    for c in range(m, n):
        var[VA_ACT, perm[c]] = tick[TK_CLOCK]
    tick[TK_REACT] = tick[TK_CLOCK]
    for c in range(n):
        perm[c] = c
    return n


@njit(cache=True, nogil=True, internal=True)
def _extremes(mg, up, low, perm, m):
    """(max of -y G over I_up, min over I_low) on the active variables perm[:m]."""
    gmax = -np.inf
    gmin = np.inf
    for c in range(m):
        t = perm[c]
        if up[t] and mg[t] > gmax:
            gmax = mg[t]
        if low[t] and mg[t] < gmin:
            gmin = mg[t]
    return gmax, gmin


@njit(cache=True, nogil=True, internal=True)
def _shrink(y, a, lo, hi, mg, up, low, perm, m, shrunk, scratch):
    """Move the variables that cannot enter the next working sets to the inactive part
    (libsvm's rule, per-example boxes): in I_up only with -y G below min_{I_low}, in
    I_low only with -y G above max_{I_up}, or in neither. The active part stays in
    index order. Returns the new active size."""
    gmax, gmin = _extremes(mg, up, low, perm, m)
    k = 0
    r = 0
    for c in range(m):
        t = perm[c]
        if up[t]:
            drop = (not low[t]) and mg[t] < gmin
        else:
            drop = (not low[t]) or mg[t] > gmax
        if drop:
            scratch[r] = t
            r += 1
            shrunk[t] = 1
        else:
            perm[k] = t
            k += 1
    for c in range(r):
        perm[k + c] = scratch[c]
    return k


@njit(cache=True, nogil=True)
def smo_solve(kp, y, p, lo, hi, a, G, da, less_p, diag, eps, max_iter, stats,
              shrinking, ws):  # fmt: skip
    """Minimise in place from a feasible ``a`` whose gradient ``G = Q a - p`` is set but
    for the duals ``da`` moved since (added first, from their full kernel rows: a warm
    start that moved few of them pays for few rows), and for ``- p`` where ``less_p``
    (subtracted after them); on return G is the gradient at the returned ``a`` on
    every variable. ``ws``: the caller's work arrays
    (:meth:`~bigrate.kernel.smo.KernelProblem.solve`; no array is allocated here, so
    that a cold process compiles none of numpy's allocation routines for this).

    With ``shrinking`` (libsvm's heuristic, Chang and Lin 2011, sec. 5.1): every
    min(n, 1000) iterations the variables that cannot be selected soon are set aside,
    selection and gradient updates run over the active ones only and kernel rows are
    computed on the active columns; the inactive gradients are reconstructed (G_bar
    after a cold start, else from the duals moved since they were last exact). The first time
    the gap falls below 10 eps every variable is reactivated once, and before stopping
    the whole gradient is reconstructed and the stopping rule re-checked on all
    variables.

    Returns (status, iterations, gap). ``stats`` accumulates [cache hits, misses,
    variables shrunk, gradient reconstructions, shrunk variables that moved again] and
    sets stats[5] to 1 when G_bar is kept.
    """
    n = y.shape[0]
    perm, mg, up, low, shrunk, scratch, aux, a_ref = ws  # mg: -y G
    for i in range(n):
        perm[i] = i  # every variable is active between solves
    for i in range(n):
        if da[i] != 0.0:
            Ki = _row(i, kp, perm, n, True, stats)
            c = y[i] * da[i]
            for t in range(n):
                G[t] += y[t] * Ki[t] * c
    if less_p:
        for t in range(n):
            G[t] -= p[t]
    m = n
    for t in range(n):
        mg[t] = -y[t] * G[t]
        _flags(y, a, lo, hi, t, up, low)
        shrunk[t] = False
    # How set-aside gradients are rebuilt: a start with no dual at a non-zero bound (a
    # cold start) keeps libsvm's G_bar, which then costs nothing up front and leaves
    # only the free variables to reconstruct; a warm start would pay a full kernel row
    # for every variable at a non-zero bound (at small C nearly all of them, each solve
    # of the NP-SVM), so it rebuilds from the duals moved since the last exact point.
    use_bar = shrinking
    for t in range(n):
        if _bounded_part(a, lo, hi, t) != 0.0:
            use_bar = False
            break
    for t in range(n):
        aux[t] = 0.0 if use_bar else mg[t]
        a_ref[t] = a[t]
    stats[5] = 1 if use_bar else 0
    period = min(n, 1000)
    counter = period
    unshrunk = False
    it = 0
    gap = np.inf
    status = MAX_ITER
    have_i = False
    gmax = -np.inf
    i = -1
    while it < max_iter:
        if shrinking:
            counter -= 1
            if counter == 0:
                counter = period
                if not unshrunk:
                    gmx, gmn = _extremes(mg, up, low, perm, m)
                    if gmx - gmn <= 10.0 * eps:
                        unshrunk = True
                        m = _unshrink(
                            kp, y, p, a, lo, hi, mg, aux, a_ref, use_bar, perm, m, stats
                        )
                m0 = m
                m = _shrink(y, a, lo, hi, mg, up, low, perm, m, shrunk, scratch)
                stats[2] += m0 - m
                have_i = False
        if not have_i:
            gmax = -np.inf
            i = -1
            for c in range(m):
                t = perm[c]
                if up[t] and mg[t] > gmax:
                    gmax = mg[t]
                    i = t
        have_i = False
        # gmin and the second-order choice of j, on the active set
        gmin = np.inf
        j = -1
        best = np.inf
        di = 0.0
        Ki = mg  # placeholder of the row's type; replaced when i exists
        if i >= 0:
            Ki = _row(i, kp, perm, m, False, stats)
            di = diag[i]
            for c in range(m):
                t = perm[c]
                if low[t]:
                    v = mg[t]
                    if v < gmin:
                        gmin = v
                    b = gmax - v
                    if b > 0.0:
                        aa = di + diag[t] - 2.0 * Ki[t]
                        if aa <= 0.0:
                            aa = TAU
                        q = -(b * b) / aa
                        if q <= best:
                            best = q
                            j = t
        gap = gmax - gmin
        if i < 0 or j < 0 or gap <= eps:
            if m < n:
                # reactivate everything and re-check on all variables
                m = _unshrink(
                    kp, y, p, a, lo, hi, mg, aux, a_ref, use_bar, perm, m, stats
                )
                counter = 2  # re-check on all variables first, then shrink again
                continue
            status = OK
            break
        Kj = _row(j, kp, perm, m, False, stats)
        # Ki may have been evicted by Kj's fetch only if the cache held one row; the
        # cache always holds two, and i was used last
        yi = y[i]
        yj = y[j]
        quad = di + diag[j] - 2.0 * Ki[j]
        if quad <= 0.0:
            quad = TAU
        # move a_i by +yi*s, a_j by -yj*s (keeps y^T a); s >= 0 lowers the objective
        s = (mg[i] - mg[j]) / quad
        if yi > 0:
            s = min(s, hi[i] - a[i])
        else:
            s = min(s, a[i] - lo[i])
        if yj > 0:
            s = min(s, a[j] - lo[j])
        else:
            s = min(s, hi[j] - a[j])
        if s <= 0.0:
            status = OK
            break
        ai_old = a[i]
        aj_old = a[j]
        a[i] += yi * s
        a[j] -= yj * s
        # clean tiny drift onto the bounds
        if abs(a[i] - hi[i]) < 1e-15 * max(1.0, abs(hi[i])):
            a[i] = hi[i]
        if abs(a[i] - lo[i]) < 1e-15 * max(1.0, abs(lo[i])):
            a[i] = lo[i]
        if abs(a[j] - hi[j]) < 1e-15 * max(1.0, abs(hi[j])):
            a[j] = hi[j]
        if abs(a[j] - lo[j]) < 1e-15 * max(1.0, abs(lo[j])):
            a[j] = lo[j]
        _flags(y, a, lo, hi, i, up, low)
        _flags(y, a, lo, hi, j, up, low)
        if shrunk[i]:
            shrunk[i] = False
            stats[4] += 1
        if shrunk[j]:
            shrunk[j] = False
            stats[4] += 1
        if use_bar:
            _update_bar(kp, y, a, lo, hi, i, ai_old, j, aj_old, aux, perm, m, stats)
        ci = yi * (a[i] - ai_old)
        cj = yj * (a[j] - aj_old)
        # gradient update on the active set, fused with the next choice of i
        gmax = -np.inf
        i_next = -1
        for c in range(m):
            t = perm[c]
            v = mg[t] - (ci * Ki[t] + cj * Kj[t])
            mg[t] = v
            if up[t] and v > gmax:
                gmax = v
                i_next = t
        i = i_next
        have_i = True
        it += 1
    if m < n:
        m = _unshrink(kp, y, p, a, lo, hi, mg, aux, a_ref, use_bar, perm, m, stats)
    for t in range(n):
        G[t] = -y[t] * mg[t]
    return status, it, gap


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
