"""Compiled kernels of BPSP (Gu et al. 2015): the bordered system of a partition (from
scratch, or updated across a facet from the neighbour's by rank-one changes), convex
polygons clipped by half-planes with labelled edges, the neighbour walk over critical
regions (Theorem 3) with a hashed set of the partitions seen, the invariant cells of a
validation fold, and the best point of the K-fold sum by branch-and-bound.

Polygons are (k, 2) float64 vertex arrays in counter-clockwise order; a polygon's edge
i runs from vertex i to vertex i + 1 (mod k) and its label is the inequality whose line
made it (-1: the domain's boundary). Inequalities are rows (a1, a2, c, row, kind) of
a1 p1 + a2 p2 <= c, as :func:`bigrate.model_selection.bpsp.partition.inequalities`
documents. Partitions are int8 vectors: 0 = R (alpha = 0), 1 = M (on the margin),
2 = E (alpha at its box). Nothing here allocates a Python object per region.
"""

from __future__ import annotations

import numpy as np

from bigrate._jit import borrowed, keep_alive, njit
from bigrate._lapack import lu_inverse, lu_solve

R_SET, M_SET, E_SET = 0, 1, 2
LOWER, UPPER, E_ROW, R_ROW = 0, 1, 2, 3

# walk status codes
WALK_DONE, WALK_MORE, WALK_GUARD, WALK_SINGULAR = 0, 1, 2, 3
# diagnostics of the walk (a float64 vector: counts, and the area of thin pieces)
D_REGIONS, D_SINGULAR, D_THIN, D_DEGENERATE, D_CORRECTIONS, D_THIN_AREA = range(6)
D_UPDATES = 6  # regions whose system came by an update from their parent's
D_POOL_MISSES = 7  # moves whose parent's system the ring had already overwritten
# ... of those, the ones whose lost entry was written since the ring last grew (at[1]):
# a ring too small now, not one that was
D_RING_SHORT = 8
# the oldest anchor an update read, as floats written since it (at[0] less its
# position), among those written since the ring last grew: how far back the walk
# reaches into its ring, which nears the ring's size before parents are lost
D_RING_AGE = 9
# ... and how many updates read an anchor further back than the walk's age_stop
# since the ring last grew (the walk stops at each, for its caller to judge them)
D_RING_FAR = 10
N_DIAG = 11
# the walk's order: a region's last queued neighbour next, while that has been so
# for at most CHAIN_RUN regions in a row, and otherwise the oldest queued (breadth
# first). Breadth-first alone read every parent's system a frontier of regions back
# in the ring, out of the caches; along such runs the parent was written just before
# and its anchor a few regions before (spambase 600, fold 0's rectangle, one core:
# 7.4-8.2 s -> 6.8-7.3 s, the same 181,899 regions; hill-valley 364: 4.25 -> 3.67 s).
# Unbounded runs (depth first) strand the other neighbours so long that their
# parents leave the ring (1,056 solves from scratch against 48-212 at 8-32)
CHAIN_RUN = 16
# generations of updates (:func:`update`) before a system is solved from scratch again
MAX_UPDATES = 1024
# the largest residual of an updated system, relative to its largest g~ coefficient
# (a solve from scratch leaves 1e-14 to 1e-12), beyond which it is solved from scratch
UPDATE_RESIDUAL = 1e-12

_EPS = np.finfo(np.float64).eps


@njit(cache=True, nogil=True)
def move_to(kind):
    """Where a row goes across its inequality (Theorem 3)."""
    if kind == LOWER:
        return R_SET
    if kind == UPPER:
        return E_SET
    return M_SET


# ------------------------------------------------------------------ the system
@njit(cache=True, nogil=True)
def inequalities(alpha, gt, state, box, rcoef, consistent):
    """Rows (a1, a2, c, row, kind) of the critical region (eq. 12-14): -a_M <= 0,
    a_M - box <= 0, g~_E - r <= 0, r - g~_R <= 0, each coef . (1, p1, p2) <= 0; an
    inconsistent system adds 0 <= -1 (an empty region)."""
    n = state.shape[0]
    return _inequalities_into(alpha, gt, state, box, rcoef, consistent,
                              np.empty((2 * n + 1, 5)))  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def _inequalities_into(alpha, gt, state, box, rcoef, consistent, buf):
    """:func:`inequalities` as the first rows of ``buf`` (2 n + 1 rows at least)."""
    n = state.shape[0]
    m = e = 0
    for i in range(n):
        if state[i] == M_SET:
            m += 1
        elif state[i] == E_SET:
            e += 1
    r = n - m - e
    out = buf[: 2 * m + e + r + (0 if consistent else 1)]
    k = 0
    for i in range(n):  # -a <= 0
        if state[i] == M_SET:
            out[k, 0], out[k, 1], out[k, 2] = -alpha[i, 1], -alpha[i, 2], alpha[i, 0]
            out[k, 3], out[k, 4] = i, LOWER
            k += 1
    for i in range(n):  # a - box <= 0
        if state[i] == M_SET:
            out[k, 0] = alpha[i, 1] - box[i, 1]
            out[k, 1] = alpha[i, 2] - box[i, 2]
            out[k, 2] = box[i, 0] - alpha[i, 0]
            out[k, 3], out[k, 4] = i, UPPER
            k += 1
    for i in range(n):  # g~ - r <= 0
        if state[i] == E_SET:
            out[k, 0], out[k, 1] = gt[i, 1] - rcoef[1], gt[i, 2] - rcoef[2]
            out[k, 2] = rcoef[0] - gt[i, 0]
            out[k, 3], out[k, 4] = i, E_ROW
            k += 1
    for i in range(n):  # r - g~ <= 0
        if state[i] == R_SET:
            out[k, 0], out[k, 1] = rcoef[1] - gt[i, 1], rcoef[2] - gt[i, 2]
            out[k, 2] = gt[i, 0] - rcoef[0]
            out[k, 3], out[k, 4] = i, R_ROW
            k += 1
    if not consistent:
        out[k, 0], out[k, 1], out[k, 2], out[k, 3], out[k, 4] = 0.0, 0.0, -1.0, -1, -1
    return out


@njit(cache=True, nogil=True, internal=True)
def _bordered(Q, y, box, rcoef, state):
    """The margin rows M (in order), the bordered matrix A = [[0, y_M^T], [y_M,
    Q_MM]], its right-hand side (n_M + 1, 3) but for the E rows' part of its margin
    rows (-Q_M,E box_E: :func:`_system` takes it from :func:`e_sums`) and alpha with
    the E rows at their box."""
    n = y.shape[0]
    m = 0
    for i in range(n):
        if state[i] == M_SET:
            m += 1
    M = np.empty(m, np.int64)
    k = 0
    for i in range(n):
        if state[i] == M_SET:
            M[k] = i
            k += 1
    alpha = np.zeros((n, 3))
    rhs = np.zeros((m + 1, 3))
    A = np.zeros((m + 1, m + 1))
    for j in range(n):
        if state[j] == E_SET:
            for t in range(3):
                alpha[j, t] = box[j, t]
                rhs[0, t] -= y[j] * box[j, t]
    for a in range(m):
        i = M[a]
        A[0, a + 1] = y[i]
        A[a + 1, 0] = y[i]
        for b in range(m):
            A[a + 1, b + 1] = Q[i, M[b]]
        for t in range(3):
            rhs[a + 1, t] = rcoef[t]
    return M, A, rhs, alpha


@njit(cache=True, nogil=True)
def e_sums(X, C, state, cst, csum):
    """sum_{j in E} C[j, t] X[j] (3, m) for t = 0, 1, 2: the E rows' part of g~ (X =
    Q, C = box) or of the numerators (X = KvT, C = y box), rows at their box whose
    alpha does not depend on the partition but on E.

    A hill-valley partition has ~216 of its 291 rows in E and ~21 in M, and the
    partitions solved one after another (a walk's solves from scratch, the rounds of
    corrections) differ in a few: the sums are kept (``csum`` for the E rows
    ``cst[:n]``; ``cst[n]`` = 1 once set) and a partition's are the kept ones plus
    and minus the rows whose membership differs, each such sum a few rounding steps
    from its own (terms of the box's size; the kept sums never drift, as no
    partition's sums are kept from another's). Kept anew, from every E row in order,
    where more than a quarter of the E rows differ."""
    n = state.shape[0]
    m = X.shape[1]
    ne = nd = 0
    diff = np.empty(n, np.int64)
    for j in range(n):
        e = state[j] == E_SET
        if e:
            ne += 1
        if e != (cst[j] == 1):
            diff[nd] = j
            nd += 1
    if cst[n] != 1 or nd > max(4, ne // 4):
        rows = np.empty(ne, np.int64)
        k = 0
        for j in range(n):
            cst[j] = 1 if state[j] == E_SET else 0
            if state[j] == E_SET:
                rows[k] = j
                k += 1
        cst[n] = 1
        _rows_sum(X, C, rows, ne, csum, True)
        nd = 0
    out = csum.copy()
    g0, g1, g2 = out[0], out[1], out[2]
    for d in range(nd):
        j = diff[d]
        sg = 1.0 if state[j] == E_SET else -1.0
        c0, c1, c2 = sg * C[j, 0], sg * C[j, 1], sg * C[j, 2]
        xj = X[j]
        for i in range(m):
            x = xj[i]
            g0[i] += x * c0
            g1[i] += x * c1
            g2[i] += x * c2
    return out


@njit(cache=True, nogil=True, internal=True)
def _rows_sum(X, C, rows, nr, gT, fresh):
    """gT (3, m) += sum_k C[rows[k], t] X[rows[k]] over rows[:nr] in order (from 0
    where ``fresh``): four rows a pass (each sum's terms in the same order, gT loaded
    and stored once for four rows), the three coefficients in the same pass (each
    entry of X loaded once for them). X's rows are contiguous (Q is symmetric: row j
    is column j)."""
    m = X.shape[1]
    g0, g1, g2 = gT[0], gT[1], gT[2]
    if fresh:
        for i in range(m):
            g0[i] = g1[i] = g2[i] = 0.0
    k = 0
    while k + 4 <= nr:
        j0, j1, j2, j3 = rows[k], rows[k + 1], rows[k + 2], rows[k + 3]
        a00, a10, a20, a30 = C[j0, 0], C[j1, 0], C[j2, 0], C[j3, 0]
        a01, a11, a21, a31 = C[j0, 1], C[j1, 1], C[j2, 1], C[j3, 1]
        a02, a12, a22, a32 = C[j0, 2], C[j1, 2], C[j2, 2], C[j3, 2]
        q0, q1, q2, q3 = X[j0], X[j1], X[j2], X[j3]
        for i in range(m):
            x0, x1, x2, x3 = q0[i], q1[i], q2[i], q3[i]
            g = g0[i] + x0 * a00
            g = g + x1 * a10
            g = g + x2 * a20
            g0[i] = g + x3 * a30
            g = g1[i] + x0 * a01
            g = g + x1 * a11
            g = g + x2 * a21
            g1[i] = g + x3 * a31
            g = g2[i] + x0 * a02
            g = g + x1 * a12
            g = g + x2 * a22
            g2[i] = g + x3 * a32
        k += 4
    while k < nr:
        j = rows[k]
        a0, a1, a2 = C[j, 0], C[j, 1], C[j, 2]
        q = X[j]
        for i in range(m):
            g0[i] += q[i] * a0
            g1[i] += q[i] * a1
            g2[i] += q[i] * a2
        k += 1


@njit(cache=True, nogil=True, internal=True)
def _gt(Q, y, M, alpha, bprime, SE):
    """g~ = Q alpha + y b' (n, 3) as coefficients of (1, p1, p2): the E rows' part
    ``SE`` (:func:`e_sums`) plus the margin rows' (by coefficient, so the loop over
    rows runs over contiguous memory)."""
    n = y.shape[0]
    gT = SE.copy()
    _rows_sum(Q, alpha, M, M.shape[0], gT, False)
    gt = np.empty((n, 3))
    for i in range(n):
        for t in range(3):
            gt[i, t] = gT[t, i] + y[i] * bprime[t]
    return gt


@njit(cache=True, nogil=True, internal=True)
def _no_sums(n, m):
    """An empty keep for :func:`e_sums` (for a partition solved on its own)."""
    return np.zeros(n + 1, np.int8), np.empty((3, m))


@njit(cache=True, nogil=True)
def system(Q, y, box, rcoef, state):
    """The affine solution of a partition (algorithms.md sec. 5): alpha (n, 3), b'
    (3,) and g~ = Q alpha + y b' (n, 3) as coefficients of (1, p1, p2), whether the
    bordered system was singular (least-norm solution) and whether it is consistent,
    and the region's inequalities."""
    gst, gsum = _no_sums(y.shape[0], y.shape[0])
    return _system(Q, y, box, rcoef, state, gst, gsum)[:6]


@njit(cache=True, nogil=True, internal=True)
def _system(Q, y, box, rcoef, state, gst, gsum):
    """:func:`system`, and its margin rows M and the LU factors of its bordered
    matrix A (:func:`bigrate._lapack.lu_solve`: the walk keeps A's inverse,
    :func:`bordered_inverse` without building or factorising A again); the E rows'
    part of g~ from the sums kept in ``gst``, ``gsum`` (:func:`e_sums`)."""
    M, A, rhs, alpha = _bordered(Q, y, box, rcoef, state)
    m = M.shape[0]
    SE = e_sums(Q, box, state, gst, gsum)
    for a in range(m):
        for t in range(3):
            rhs[a + 1, t] -= SE[t, M[a]]
    big = 1.0
    for a in range(m + 1):
        for t in range(3):
            big = max(big, abs(rhs[a, t]))
    scale = 1e-8 * big
    singular, consistent = False, True
    # A's LU factors kept for its inverse where the walk keeps that (lu_inverse):
    # one factorisation, not one for the solve and another for the inverse
    ok, sol, lu, ipiv = lu_solve(A, rhs)
    if ok and _residual(A, sol, rhs) > scale:
        ok = False
    if not ok:
        # e.g. duplicate rows in M: the least-norm solution; with none consistent for
        # every parameter pair (M empty: y_E^T a_E(p) = 0 on a line only) the region
        # has no area
        singular = True
        sol = np.linalg.lstsq(A, rhs, _EPS * (m + 1))[0]
        consistent = _residual(A, sol, rhs) <= 1e3 * scale
    bprime = sol[0].copy()
    for a in range(m):
        for t in range(3):
            alpha[M[a], t] = sol[a + 1, t]
    gt = _gt(Q, y, M, alpha, bprime, SE)
    ineq = inequalities(alpha, gt, state, box, rcoef, consistent)
    return alpha, bprime, gt, ineq, singular, consistent, M, (lu, ipiv)


@njit(cache=True, nogil=True)
def bordered_inverse(Q, y, box, rcoef, state):
    """The margin rows M in order and the inverse of the (non-singular) bordered
    system of a partition, for updates across a facet (:func:`update`)."""
    M, A, rhs, alpha = _bordered(Q, y, box, rcoef, state)
    return M, np.ascontiguousarray(np.linalg.inv(A))


@njit(cache=True, nogil=True)
def numerators(KvT, y, state, alpha, bprime):
    """The validation rows' decision-value numerators h = Kv (alpha * y) + b' (n_val,
    3) as coefficients of (1, p1, p2); ``KvT`` (n, n_val): the validation rows' kernel
    columns, one training row's against every validation row contiguous."""
    n, nv = KvT.shape
    hT = np.empty((3, nv))
    for t in range(3):
        hT[t, :] = bprime[t]
    for j in range(n):
        if state[j] != R_SET:
            w0, w1, w2 = y[j] * alpha[j, 0], y[j] * alpha[j, 1], y[j] * alpha[j, 2]
            for v in range(nv):
                k = KvT[j, v]
                hT[0, v] += k * w0
                hT[1, v] += k * w1
                hT[2, v] += k * w2
    return np.ascontiguousarray(hT.T)


@njit(cache=True, nogil=True, internal=True)
def _numerators(KvT, y, yb, state, M, alpha, bprime, hst, hsum):
    """:func:`numerators` of a partition with margin rows ``M``: the E rows' part
    from the sums kept in ``hst``, ``hsum`` (:func:`e_sums`, ``yb`` = y box), then
    the margin rows' and b'."""
    n, nv = KvT.shape
    hT = e_sums(KvT, yb, state, hst, hsum)
    ya = np.empty((n, 3))
    for k in range(M.shape[0]):
        j = M[k]
        for t in range(3):
            ya[j, t] = y[j] * alpha[j, t]
    _rows_sum(KvT, ya, M, M.shape[0], hT, False)
    h = np.empty((nv, 3))
    for v in range(nv):
        for t in range(3):
            h[v, t] = hT[t, v] + bprime[t]
    return h


@njit(cache=True, nogil=True)
def update(Q, y, box, rcoef, KvT, state, row, kind, pool, v):
    """:func:`_update` in arrays of its own (:func:`update_space`)."""
    return _update(Q, y, box, rcoef, KvT, state, row, kind, pool, v,
                   update_space(y.shape[0], KvT.shape[1]))  # fmt: skip


@njit(cache=True, nogil=True)
def update_space(n, nv):
    """The arrays :func:`_update` works and answers in, for n training and nv
    validation rows: made once a walk, so that an update allocates nothing (it
    allocated ~25 arrays; with their frees, malloc and memset were ~8% of a
    spambase 600 (C+, C-) fold's profile)."""
    return (np.empty(n + 1, np.int64), np.empty((n, 3)), np.empty(3),
            np.empty(n + 1), np.empty(n + 1), np.empty(n + 1),
            np.empty(n + 1, np.int64), np.empty(n + 2), np.empty(n), np.empty((n, 3)),
            np.empty(nv), np.empty((nv, 3)), np.empty((2 * n + 1, 5)),
            np.empty(n + 1, np.int64), np.empty(n + 1), np.empty(n + 1), np.empty(n + 1),
            np.empty(3), np.empty(16, np.int64), np.empty(16, np.int64),
            np.empty(16))  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def _update(Q, y, box, rcoef, KvT, state, row, kind, pool, v, ws):
    """The system of the partition ``state``, which is the one of the ring entry at
    ``v`` of ``pool`` (:func:`pool_put`) with one ``row`` moved across its inequality
    of ``kind``, in O(n_M^2 + n n_M) instead of a solve from scratch (the rank-one
    updates of the paper's sec. 4, after Laskov et al.).

    The two solutions agree on the facet, so they differ by d l(p): l the facet's
    affine function, d a column of an inverse. A row joining M: l = r - g~_row and d
    = B' e_row, B' the parent's inverse B bordered by the row (Schur complement s =
    Q_rr - a^T B a, a = (y_r, Q_M,r)); a row leaving M for its bound t (0 or its
    box): l = t - alpha_row and d = B e_row / B_row,row. Either way B' = B + c w w^T
    on the child's margin rows: w = (B a, -1), c = 1 / s, or w = B e_row, c =
    -1 / B_row,row. So an entry of the ring keeps its term (c, w) and not its
    inverse: B is its anchor's explicit inverse (an ancestor's) plus the terms of the
    generations since (:func:`_chain`), and the update reads the anchor once (B a) or
    one column of it. Writing every region's inverse ((n_M + 1)^2 floats, 320 KB at
    n_M = 200) and reading its parent's back from memory was most of a region's cost
    at 450 CV rows; a term is n + 1 floats.

    Returns (ok, M, w, c, alpha, bprime, g~, h, inequalities); w over (b', rows)
    (index 0 for b', 1 + i for row i). Not ok where the new system is nearly
    singular (|s| or |B_row,row| under 1e-8 of its terms) or the update's residual is
    beyond UPDATE_RESIDUAL: the caller solves it from scratch.

    ``ws`` (:func:`update_space`): the arrays it works in; what it returns are views
    of them (or of ``pool``), good until its next call."""
    n = y.shape[0]
    (mp_buf, alpha_buf, ell, w, au, ba_buf, m_buf, d_buf, u_buf, gt_buf, hv_buf,
     h_buf, ineq_buf, ia_buf, aa_buf, aa_out, bau_buf, bp_buf, offs_buf, lens_buf,
     coefs_buf) = ws  # fmt: skip
    mb, _, _, _, Mp, alpha_m, bprime_p, gt_p, h_p = _pool_system_into(
        pool, v, n, KvT.shape[1], mp_buf
    )
    alpha_p = _parent_alpha_into(state, row, kind, box, Mp, alpha_m, alpha_buf)
    sa, offs, lens, coefs = _chain_into(pool, v, offs_buf, lens_buf, coefs_buf)
    for k in range(n + 1):
        w[k] = 0.0
    no_ineq = ineq_buf[:0]
    if kind == E_ROW or kind == R_ROW:  # the row joins M, last
        for k in range(n + 1):
            au[k] = 0.0
        au[0] = y[row]
        for k in range(mb - 1):
            au[1 + Mp[k]] = Q[Mp[k], row]
        Bau = _product_into(pool, sa, offs, lens, coefs, au, ia_buf, aa_buf, aa_out,
                            bau_buf)  # fmt: skip
        Ba = ba_buf[:mb]
        Ba[0] = Bau[0]
        for k in range(mb - 1):
            Ba[k + 1] = Bau[1 + Mp[k]]
        aBa = au[0] * Ba[0]
        for k in range(mb - 1):
            aBa += au[1 + Mp[k]] * Ba[k + 1]
        q = Q[row, row]
        s = q - aBa
        if not abs(s) > 1e-8 * (abs(q) + abs(aBa)):
            return False, Mp, w, 0.0, alpha_p, bprime_p, gt_p, h_p, no_ineq
        M = m_buf[:mb]
        for k in range(mb - 1):  # loops, not slice copies: see bigrate._jit
            M[k] = Mp[k]
        M[mb - 1] = row
        d = d_buf[: mb + 1]
        for i in range(mb):
            d[i] = -Ba[i] / s
        d[mb] = 1.0 / s
        w[0] = Ba[0]
        for k in range(mb - 1):
            w[1 + Mp[k]] = Ba[k + 1]
        w[1 + row] = -1.0
        c = 1.0 / s
        for t in range(3):
            ell[t] = rcoef[t] - gt_p[row, t]
        rows = M
        target = -1.0
    else:  # the row leaves M for its bound
        pi = -1
        for k in range(mb - 1):
            if Mp[k] == row:
                pi = k + 1
        if pi < 0:
            return False, Mp, w, 0.0, alpha_p, bprime_p, gt_p, h_p, no_ineq
        cu = _column_into(pool, sa, offs, lens, coefs, 1 + row, ia_buf, bau_buf)
        col = ba_buf[:mb]
        col[0] = cu[0]
        for k in range(mb - 1):
            col[k + 1] = cu[1 + Mp[k]]
        big = 0.0
        for k in range(mb):
            big = max(big, abs(col[k]))
        bpp = col[pi]
        if not abs(bpp) > 1e-8 * big:
            return False, Mp, w, 0.0, alpha_p, bprime_p, gt_p, h_p, no_ineq
        d = d_buf[:mb]
        for k in range(mb):
            d[k] = col[k] / bpp
        M = m_buf[: mb - 2]
        ii = 0
        for k in range(mb - 1):
            if k + 1 != pi:
                M[ii] = Mp[k]
                ii += 1
        w[0] = col[0]
        for k in range(mb - 1):
            w[1 + Mp[k]] = col[k + 1]
        c = -1.0 / bpp
        target = 1.0 if kind == UPPER else 0.0
        for t in range(3):
            ell[t] = target * box[row, t] - alpha_p[row, t]
        rows = Mp
    ok, alpha, bprime, gt, h, ineq = _moved(
        Q, y, box, rcoef, KvT, state, row, M, rows, d, ell, target, alpha_p, bprime_p,
        gt_p, h_p, (u_buf, gt_buf, hv_buf, h_buf, ineq_buf, bp_buf, ba_buf),
    )  # fmt: skip
    return ok, M, w, c, alpha, bprime, gt, h, ineq


@njit(cache=True, nogil=True, internal=True)
def _parent_alpha_into(state, row, kind, box, Mp, alpha_m, alpha):
    """The parent's alpha (n, 3), written into ``alpha``, whose entry keeps it on
    its margin rows ``Mp`` (``alpha_m``) only, from the child's partition ``state``
    (the parent's with ``row`` moved across its inequality of ``kind``): the box on
    E, 0 on R, exactly what the parent's solve or update left there."""
    n = state.shape[0]
    for j in range(n):
        if state[j] == E_SET:
            for t in range(3):
                alpha[j, t] = box[j, t]
        else:
            for t in range(3):
                alpha[j, t] = 0.0
    if kind == E_ROW:  # the row was in E (it is in M now, not in Mp)
        for t in range(3):
            alpha[row, t] = box[row, t]
    elif kind == R_ROW:
        for t in range(3):
            alpha[row, t] = 0.0
    for k in range(Mp.shape[0]):  # a row that left M is among them
        for t in range(3):
            alpha[Mp[k], t] = alpha_m[k, t]
    return alpha


@njit(cache=True, nogil=True, internal=True)
def _moved(Q, y, box, rcoef, KvT, state, row, M, rows, d, ell, target, alpha_p,
           bprime_p, gt_p, h_p, bufs):  # fmt: skip
    """The child's solution from its parent's moved by d l(p) (:func:`update`): (ok,
    alpha, b', g~, h, inequalities), not ok where the residual of the bordered
    system is beyond UPDATE_RESIDUAL; in the arrays ``bufs`` (u, g~, the
    numerators' move and h, the inequalities, b', and room for the numerators'
    coefficients, the update's B a, free once d is built from it:
    :func:`update_space`)."""
    n = y.shape[0]
    nv = KvT.shape[1]
    u, gt, hv, h, ineq_buf, bprime, wbuf = bufs
    alpha = alpha_p  # the parent's, rebuilt (:func:`_parent_alpha_into`)
    for t in range(3):
        bprime[t] = bprime_p[t] + d[0] * ell[t]
    for i in range(n):
        u[i] = y[i] * d[0]
    nr = rows.shape[0]
    for k in range(nr):
        j, dk = rows[k], d[k + 1]
        for t in range(3):
            alpha[j, t] += dk * ell[t]
    # u += d_k Q_k over the rows k in order (Q is symmetric: row j is column j)
    _add_rows(u, Q, rows, d[1:])
    if target >= 0.0:  # the row is at its bound exactly
        for t in range(3):
            alpha[row, t] = target * box[row, t]
    # g~ moved, and the update's own residual: g~ of the rows in M at r, y^T alpha
    # at 0 (g~ and alpha move together, so this is the residual of the bordered
    # system; updates of an inverse lose accuracy down a chain of them, by up to 1e4x
    # a step on ill-conditioned systems), each in one pass over the rows
    # the largest |g~| as three maxima, one per coefficient: the same value (a max
    # does not depend on the order), in three chains of vmaxsd instead of one
    big0 = big1 = big2 = 1.0
    for i in range(n):
        g0 = gt_p[i, 0] + u[i] * ell[0]
        g1 = gt_p[i, 1] + u[i] * ell[1]
        g2 = gt_p[i, 2] + u[i] * ell[2]
        gt[i, 0], gt[i, 1], gt[i, 2] = g0, g1, g2
        big0 = max(big0, abs(g0))
        big1 = max(big1, abs(g1))
        big2 = max(big2, abs(g2))
    big = max(max(big0, big1), big2)
    res = 0.0
    for k in range(M.shape[0]):
        j = M[k]
        for t in range(3):
            res = max(res, abs(gt[j, t] - rcoef[t]))
    ya0 = ya1 = ya2 = 0.0
    for i in range(n):
        if state[i] != R_SET:
            ya0 += y[i] * alpha[i, 0]
            ya1 += y[i] * alpha[i, 1]
            ya2 += y[i] * alpha[i, 2]
    res = max(res, abs(ya0), abs(ya1), abs(ya2))
    if res > UPDATE_RESIDUAL * big:
        return False, alpha, bprime, gt, h_p, ineq_buf[:0]
    for v in range(nv):
        hv[v] = d[0]
    # hv += y_j d_j KvT_j over the rows in order
    wv = wbuf[:nr]
    for k in range(nr):
        wv[k] = y[rows[k]] * d[k + 1]
    _add_rows(hv, KvT, rows, wv)
    for v in range(nv):
        for t in range(3):
            h[v, t] = h_p[v, t] + hv[v] * ell[t]
    ineq = _inequalities_into(alpha, gt, state, box, rcoef, True, ineq_buf)
    return True, alpha, bprime, gt, h, ineq


@njit(cache=True, nogil=True, internal=True)
def _add_rows(out, A, rows, coef):
    """out += coef[k] A[rows[k]] summed over k in order, four rows a pass: each
    out[i] takes the same sums in the same order as one row a pass would give it,
    loaded and stored once for four rows."""
    nr, m = rows.shape[0], out.shape[0]
    k = 0
    while k + 4 <= nr:
        j0, j1, j2, j3 = rows[k], rows[k + 1], rows[k + 2], rows[k + 3]
        c0, c1, c2, c3 = coef[k], coef[k + 1], coef[k + 2], coef[k + 3]
        for i in range(m):
            oi = out[i] + c0 * A[j0, i]
            oi = oi + c1 * A[j1, i]
            oi = oi + c2 * A[j2, i]
            out[i] = oi + c3 * A[j3, i]
        k += 4
    while k < nr:
        j, ck = rows[k], coef[k]
        for i in range(m):
            out[i] += ck * A[j, i]
        k += 1


@njit(cache=True, nogil=True, internal=True)
def _residual(A, sol, rhs):
    worst = 0.0
    for i in range(A.shape[0]):
        for t in range(rhs.shape[1]):
            s = -rhs[i, t]
            for j in range(A.shape[1]):
                s += A[i, j] * sol[j, t]
            worst = max(worst, abs(s))
    return worst


@njit(cache=True, nogil=True)
def correct(Q, y, box, rcoef, state, p1, p2, rounds):
    """Active-set corrections until the partition's affine solution meets its own
    conditions at (p1, p2): the worst violated row moves each round (with no
    consistent solution, the row nearest its margin joins M). Returns the partition
    and the number of corrections (:func:`corrected` says too whether it holds)."""
    gst, gsum = _no_sums(y.shape[0], y.shape[0])
    out = _corrected(Q, y, box, rcoef, state, p1, p2, rounds, gst, gsum)
    return out[0], out[1]


@njit(cache=True, nogil=True)
def corrected(Q, y, box, rcoef, state, p1, p2, rounds):
    """:func:`correct`, and whether the partition returned holds at (p1, p2) (its
    last round found no violation: no round of its own is needed to tell)."""
    gst, gsum = _no_sums(y.shape[0], y.shape[0])
    out = _corrected(Q, y, box, rcoef, state, p1, p2, rounds, gst, gsum)
    return out[0], out[1], out[2]


@njit(cache=True, nogil=True, internal=True)
def _corrected(Q, y, box, rcoef, state, p1, p2, rounds, gst, gsum):
    """:func:`corrected`, and where the partition holds, its system as
    :func:`_system` gave it (alpha, b', g~, inequalities, singular, consistent, M,
    A; the walk's solve of the partition it ends at); ``gst``, ``gsum``: the E rows'
    sums kept (:func:`e_sums`; a round moves one row).

    A partition met again ends them: at a point on a boundary, two partitions can
    send a row to each other, one violating its line by a rounding (1.5e-13 on
    hill-valley), the other by far more (4e-6), and the corrections went round that
    cycle to the end of their rounds (582 solves for a probe seed). The partition of
    the cycle's least violation is returned then."""
    state = state.copy()
    n = y.shape[0]
    moves = 0
    none = (np.empty((0, 3)), np.empty(3), np.empty((0, 3)), np.empty((0, 5)), False,
            False, np.empty(0, np.int64), (np.empty((0, 0)).T, np.empty(0, np.int32)))  # fmt: skip
    met = np.empty(rounds, np.uint64)  # the hashes of the partitions met
    worst_of = np.empty(rounds)  # and their worst violations
    undo, undo_set = np.empty(rounds, np.int64), np.empty(rounds, np.int8)  # moves
    h = _hash(state)
    for r in range(rounds):
        for q in range(r):
            if met[q] == h:  # back to partition q: the cycle's least violation
                b = q
                for c in range(q + 1, r):
                    if worst_of[c] < worst_of[b]:
                        b = c
                for c in range(r - 1, b - 1, -1):  # moves undone, latest first
                    row = int(undo[c])
                    state[row] = undo_set[c]
                return state, moves, False, none
        sys_ = _system(Q, y, box, rcoef, state, gst, gsum)
        ineq, gt = sys_[3], sys_[2]
        worst, k = 0.0, -1
        for j in range(ineq.shape[0]):
            v = ineq[j, 0] * p1 + ineq[j, 1] * p2 - ineq[j, 2]
            if v <= 1e-9:
                # a row all but tied to its margin over an area has a line of
                # coefficients ~1e-9 (hill-valley): a value under 1e-9 can still put
                # the point well outside it, as a distance (what clip keeps); above
                # 1e-13, far over the rounding of g~
                if v <= 1e-13:
                    continue
                a2 = ineq[j, 0] * ineq[j, 0] + ineq[j, 1] * ineq[j, 1]
                if v * v <= 1e-18 * a2:
                    continue
            if v > worst:
                worst, k = v, j
        if k < 0:
            return state, moves, True, sys_
        met[r], worst_of[r] = h, worst
        if ineq[k, 4] < 0:
            level = rcoef[0] + rcoef[1] * p1 + rcoef[2] * p2
            best, bi = np.inf, -1
            for i in range(n):
                if state[i] != M_SET:
                    g = abs(gt[i, 0] + gt[i, 1] * p1 + gt[i, 2] * p2 - level)
                    if g < best:
                        best, bi = g, i
            row, to = bi, M_SET
        else:
            row, to = int(ineq[k, 3]), move_to(int(ineq[k, 4]))
        undo[r], undo_set[r] = row, state[row]
        h = h ^ _mix(row, state[row]) ^ _mix(row, to)
        state[row] = to
        moves += 1
    return state, moves, False, none


# ------------------------------------------------------------------ polygons
@njit(cache=True, nogil=True)
def clip(V, lab, ineq, tol):
    """The convex polygon (V, lab) cut by every inequality a . p <= c + tol |a|
    (``tol`` a distance; Sutherland-Hodgman, one half-plane at a time); each new edge
    is labelled by the inequality that made it. Returns (vertices, labels); no
    vertex: empty."""
    return _clip_into(V, lab, ineq, tol, _clip_buffers(2 * V.shape[0] + 8))


@njit(cache=True, nogil=True, internal=True)
def _clip_buffers(cap):
    """Room for :func:`_clip_into` to cut polygons of up to (cap - 8) / 2 vertices
    without allocating: two vertex arrays, their labels and the vertices' distances."""
    return (np.empty((cap, 2)), np.empty(cap, np.int64), np.empty((cap, 2)),
            np.empty(cap, np.int64), np.empty(cap))  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def _clip_into(V, lab, ineq, tol, bufs):
    """:func:`clip` in the arrays ``bufs`` (:func:`_clip_buffers`; new ones where
    they are too small): its result is a view of them, good until their next use.
    The walk clips every region so (seven arrays a region allocated and freed)."""
    k = V.shape[0]
    X, L, Y, N, d = bufs
    if X.shape[0] < 2 * k + 8:
        X, L, Y, N, d = _clip_buffers(2 * k + 8)
    for i in range(k):  # loops, not slice copies: see bigrate._jit
        X[i, 0], X[i, 1] = V[i, 0], V[i, 1]
        L[i] = lab[i]
    x0, y0, x1, y1 = _box_of(X, k)
    for j in range(ineq.shape[0]):
        a, b = ineq[j, 0], ineq[j, 1]
        # the polygon's box inside the half-plane: so is every vertex (products and
        # sums round monotonically, so no vertex's d below can be > 0), and most of a
        # region's inequalities pass here without a look at its vertices, and
        # without the square root of their tolerance where inside with none (so
        # with it: a larger c can only make the sum smaller). max picks the same
        # product as a test of the sign of a (b), without a branch on it: those
        # signs are random from line to line, and the branches were mispredicted
        top = max(a * x0, a * x1) + max(b * y0, b * y1)
        c = ineq[j, 2]
        if top - c <= 0:
            continue
        if tol > 0:
            # |(a, b)| by sqrt: no overflow at these magnitudes, 3x cheaper than hypot
            c = c + tol * np.sqrt(a * a + b * b)
            if top - c <= 0:
                continue
        if Y.shape[0] < 2 * k + 2:
            # a cut adds one vertex to a convex polygon, but rounding on nearly
            # collinear vertices can make it cross the line more often: at most one
            # new vertex per old one
            cap = 4 * k + 8
            Y = np.empty((cap, 2))
            N = np.empty(cap, np.int64)
        if d.shape[0] < k:
            d = np.empty(2 * k)
        out = False
        inside = False
        for i in range(k):
            d[i] = a * X[i, 0] + b * X[i, 1] - c
            if d[i] > 0:
                out = True
            else:
                inside = True
        if not out:
            continue
        if not inside:
            return X[:0], L[:0]
        m = 0
        for i in range(k):
            i1 = i + 1 if i + 1 < k else 0
            if d[i] <= 0:
                Y[m, 0], Y[m, 1] = X[i, 0], X[i, 1]
                N[m] = L[i]
                m += 1
                if d[i1] > 0:
                    t = d[i] / (d[i] - d[i1])
                    Y[m, 0] = X[i, 0] + t * (X[i1, 0] - X[i, 0])
                    Y[m, 1] = X[i, 1] + t * (X[i1, 1] - X[i, 1])
                    N[m] = j
                    m += 1
            elif d[i1] <= 0:
                t = d[i] / (d[i] - d[i1])
                Y[m, 0] = X[i, 0] + t * (X[i1, 0] - X[i, 0])
                Y[m, 1] = X[i, 1] + t * (X[i1, 1] - X[i, 1])
                N[m] = L[i]
                m += 1
        X, Y = Y, X
        L, N = N, L
        k = m
        x0, y0, x1, y1 = _box_of(X, k)
    return X[:k], L[:k]


@njit(cache=True, nogil=True, internal=True, inline="always")
def _box_of(X, k):
    """The box (x0, y0, x1, y1) of the first k vertices of X."""
    x0, y0, x1, y1 = np.inf, np.inf, -np.inf, -np.inf
    for i in range(k):
        x0, x1 = min(x0, X[i, 0]), max(x1, X[i, 0])
        y0, y1 = min(y0, X[i, 1]), max(y1, X[i, 1])
    return x0, y0, x1, y1


@njit(cache=True, nogil=True)
def area(V):
    """Shoelace area of a counter-clockwise polygon."""
    k = V.shape[0]
    s = 0.0
    for i in range(k):
        i1 = i + 1 if i + 1 < k else 0
        s += V[i, 0] * V[i1, 1] - V[i1, 0] * V[i, 1]
    return 0.5 * s


@njit(cache=True, nogil=True)
def centroid(V):
    """The area centroid of a convex polygon (inside it)."""
    k = V.shape[0]
    s = cx = cy = 0.0
    for i in range(k):
        i1 = i + 1 if i + 1 < k else 0
        w = V[i, 0] * V[i1, 1] - V[i1, 0] * V[i, 1]
        s += w
        cx += (V[i, 0] + V[i1, 0]) * w
        cy += (V[i, 1] + V[i1, 1]) * w
    if s == 0.0:
        return V[:, 0].mean(), V[:, 1].mean()
    return cx / (3.0 * s), cy / (3.0 * s)


@njit(cache=True, nogil=True)
def _split(V, a, b, c):
    """The convex polygon V cut by the line a p1 + b p2 = c: (part with <= c, part
    with >= c)."""
    lab = np.full(V.shape[0], -1, np.int64)
    one = np.empty((1, 5))
    one[0, 0], one[0, 1], one[0, 2] = a, b, c
    lo = clip(V, lab, one, 0.0)[0]
    one[0, 0], one[0, 1], one[0, 2] = -a, -b, -c
    hi = clip(V, lab, one, 0.0)[0]
    return lo, hi


# ------------------------------------------------------------------ seen partitions
@njit(cache=True, nogil=True, internal=True, inline="always")
def _mix(i, v):
    """The hash of row i in set v (splitmix64 of 4 i + v): a partition's hash is the
    XOR of its rows', so a neighbour's is its parent's with one row's changed."""
    z = np.uint64(4 * i + v) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True, internal=True)
def _hash(st):
    h = np.uint64(0)
    for i in range(st.shape[0]):
        h ^= _mix(i, st[i])
    return h


@njit(cache=True, nogil=True, internal=True, inline="always")
def _rehashed(h, st, nxt, row):
    """The hash of ``nxt``, which is ``st`` (hash ``h``) but for ``row``."""
    return h ^ _mix(row, st[row]) ^ _mix(row, nxt[row])


@njit(cache=True, nogil=True, internal=True)
def _slot(table, store, st, h):
    """(index of ``st`` (hash ``h``) in ``store`` or -1, the table slot where it is or
    goes). ``table`` (T, 2): per slot the store index (-1: free) and the hash, which
    is compared before the partition (a collision's partition is a cache miss)."""
    mask = np.uint64(table.shape[0] - 1)
    s = np.int64(h & mask)
    key = np.int64(h)
    while True:
        k = table[s, 0]
        if k < 0:
            return -1, s
        if table[s, 1] == key:
            same = True
            for i in range(st.shape[0]):
                if store[k, i] != st[i]:
                    same = False
                    break
            if same:
                return k, s
        s = np.int64((np.uint64(s) + np.uint64(1)) & mask)


@njit(cache=True, nogil=True)
def seen_contains(table, store, st):
    return _slot(table, store, st, _hash(st))[0] >= 0


@njit(cache=True, nogil=True, internal=True)
def _seen_add(table, store, count, st, slot, h):
    """Add ``st`` (hash ``h``) at ``slot``; the table doubles past half full, the
    store when full. Returns (table, store, count)."""
    if count == store.shape[0]:
        grown = np.empty((2 * store.shape[0], store.shape[1]), np.int8)
        for i in range(count):  # loops, not slice copies: see bigrate._jit
            for j in range(store.shape[1]):
                grown[i, j] = store[i, j]
        store = grown
    for j in range(st.shape[0]):
        store[count, j] = st[j]
    table[slot, 0], table[slot, 1] = count, np.int64(h)
    count += 1
    if 2 * count > table.shape[0]:
        old = table
        table = np.full((2 * old.shape[0], 2), -1, np.int64)
        mask = np.uint64(table.shape[0] - 1)
        for t in range(old.shape[0]):  # by the kept hashes: no partition read
            if old[t, 0] >= 0:
                s = np.int64(np.uint64(old[t, 1]) & mask)
                while table[s, 0] >= 0:
                    s = np.int64((np.uint64(s) + np.uint64(1)) & mask)
                table[s, 0], table[s, 1] = old[t, 0], old[t, 1]
    return table, store, count


# ------------------------------------------------------------------ the walk
# an entry of the walk's ring: mb (= n_M + 1), generations of updates since a solve
# from scratch, explicit (1: its inverse; 0: a rank-one term on its parent's), the
# ring positions of its anchor (the explicit inverse its terms sit on) and of its
# parent, the count of terms since the anchor, the term's coefficient, the count k
# of the term's nonzeros; then M, the inverse (its upper triangle: :func:`_packed`)
# or the term's w as k indices over (b', rows), ascending, and their k values (w is
# nonzero on the margin rows of the parent or the child only: ~17 of 361 floats at
# breast cancer 450's triangle),
# alpha on M (the rest is the box on E and 0 on R: :func:`_parent_alpha_into`), b', g~
# and h
_HEAD = 8


@njit(cache=True, nogil=True)
def pool_put(pool, at, M, B, w, coef, parent, alpha, bprime, gt, h, depth):
    """Write a region's system into the ring ``pool`` at ``at[0]`` (an entry never
    wraps: it starts over at 0 where it would): with its bordered inverse ``B`` (its
    packed upper triangle: :func:`packed_symmetric`, :func:`explicit_inverse`) if it
    has entries (an anchor), or else as the term ``coef`` w w^T on the inverse of the
    entry at ``parent`` (:func:`update`). Returns where it went (-1: no system, or
    larger than the pool)."""
    return _pool_put(pool, at, M, B, w, coef, parent, alpha, bprime, gt, h, depth,
                     False)  # fmt: skip


@njit(cache=True, nogil=True, internal=True, inline="always")
def _entry_size(mb, body, n, nv):
    """Floats of a ring entry (:data:`_HEAD`) of mb - 1 margin rows whose inverse or
    term takes ``body`` floats, for n training and nv validation rows."""
    return _HEAD + (mb - 1) + body + 3 * (mb - 1) + 3 * n + 3 + 3 * nv


@njit(cache=True, nogil=True, internal=True, inline="always")
def _entry_place(pool, at, size):
    """Where :func:`pool_put` writes the next entry of ``size`` floats: its ring
    position v (``at[0]``, or the ring's next start where the entry would wrap) and
    its slot v % len(pool)."""
    P = pool.shape[0]
    v = at[0]
    s = v % P
    if s + size > P:
        v += P - s
        s = 0
    return v, s


@njit(cache=True, nogil=True, internal=True)
def _pool_put(pool, at, M, B, w, coef, parent, alpha, bprime, gt, h, depth, placed):
    """:func:`pool_put`; ``placed``: ``B`` is already where the entry's inverse goes
    (:func:`_anchor_slot`), not copied again."""
    mb = M.shape[0] + 1
    n, nv = alpha.shape[0], h.shape[0]
    explicit = B.shape[0] > 0
    nz = 0
    if not explicit:
        for k in range(w.shape[0]):
            if w[k] != 0.0:
                nz += 1
    body = _packed(mb) if explicit else 2 * nz
    size = _entry_size(mb, body, n, nv)
    P = pool.shape[0]
    if size > P or (explicit and B.shape[0] != body) or (not explicit and parent < 0):
        return -1
    anchor, chain = -1, 0
    if not explicit:  # read before the entry is written (it may overwrite them)
        sp = parent % P
        anchor, chain = int(pool[sp + 3]), int(pool[sp + 5]) + 1
    v, s = _entry_place(pool, at, size)
    at[0] = v + size
    pool[s] = mb
    pool[s + 1] = depth
    pool[s + 2] = 1.0 if explicit else 0.0
    pool[s + 3] = v if explicit else anchor
    pool[s + 4] = parent if not explicit else -1
    pool[s + 5] = chain
    pool[s + 6] = 0.0 if explicit else coef
    pool[s + 7] = nz
    s += _HEAD
    for k in range(mb - 1):
        pool[s + k] = M[k]
    s += mb - 1
    if explicit:
        if not placed:
            for k in range(body):
                pool[s + k] = B[k]
    else:
        i = 0
        for k in range(w.shape[0]):
            if w[k] != 0.0:
                pool[s + i] = k
                pool[s + nz + i] = w[k]
                i += 1
    s += body
    for k in range(mb - 1):  # alpha on M only: a quarter of an entry at 450 CV rows
        for t in range(3):
            pool[s + 3 * k + t] = alpha[M[k], t]
    s += 3 * (mb - 1)
    for t in range(3):
        pool[s + t] = bprime[t]
    s += 3
    for i in range(n):
        for t in range(3):
            pool[s + 3 * i + t] = gt[i, t]
    s += 3 * n
    for i in range(nv):
        for t in range(3):
            pool[s + 3 * i + t] = h[i, t]
    return v


@njit(cache=True, nogil=True)
def packed_symmetric(B):
    """A (nearly) symmetric matrix as the packed upper triangle an anchor keeps
    (:func:`_packed`): each entry the mean of its two mirrored ones."""
    m = B.shape[0]
    out = np.empty(_packed(m))
    p = 0
    for i in range(m):
        out[p] = B[i, i]
        for j in range(i + 1, m):
            out[p + j - i] = 0.5 * (B[i, j] + B[j, i])
        p += m - i
    return out


@njit(cache=True, nogil=True)
def pool_intact(pool, at, v):
    """Whether the entry at ``v`` and every entry its inverse is made of (its anchor
    and the terms since, all written after the anchor) are still in the ring."""
    P = pool.shape[0]
    if v < 0 or P == 0 or at[0] > v + P:
        return False
    return at[0] <= int(pool[v % P + 3]) + P


@njit(cache=True, nogil=True, internal=True)
def _pool_system_into(pool, v, n, nv, mbuf):
    """The entry :func:`pool_put` wrote at ``v``: (mb, depth, chain, anchor, M,
    alpha on M (mb - 1, 3), b', g~, h), M written into ``mbuf`` (a view of it
    returned), alpha and the rest as views of the pool."""
    s = v % pool.shape[0]
    mb = int(pool[s])
    depth, chain, anchor = int(pool[s + 1]), int(pool[s + 5]), int(pool[s + 3])
    body = _packed(mb) if pool[s + 2] == 1.0 else 2 * int(pool[s + 7])
    s += _HEAD
    M = mbuf[: mb - 1]
    for k in range(mb - 1):
        M[k] = np.int64(pool[s + k])
    s += mb - 1 + body
    alpha = pool[s : s + 3 * (mb - 1)].reshape((mb - 1, 3))
    s += 3 * (mb - 1)
    bprime = pool[s : s + 3]
    s += 3
    gt = pool[s : s + 3 * n].reshape((n, 3))
    s += 3 * n
    h = pool[s : s + 3 * nv].reshape((nv, 3))
    return mb, depth, chain, anchor, M, alpha, bprime, gt, h


@njit(cache=True, nogil=True, internal=True)
def _chain(pool, v):
    """The inverse of the entry at ``v`` as its anchor's slot and the terms of the
    generations since: the pool offsets of their w (k indices, then k values), their
    k and their coefficients."""
    e = np.empty(0, np.int64)
    return _chain_into(pool, v, e, e.copy(), np.empty(0))


@njit(cache=True, nogil=True, internal=True)
def _chain_into(pool, v, offs, lens, coefs):
    """:func:`_chain` in the arrays ``offs``, ``lens``, ``coefs`` (new ones where too
    short; views of them returned)."""
    P = pool.shape[0]
    count, u = 0, v
    while pool[u % P + 2] == 0.0:
        count += 1
        u = int(pool[u % P + 4])
    if offs.shape[0] < count:
        offs = np.empty(count, np.int64)
        lens = np.empty(count, np.int64)
        coefs = np.empty(count)
    offs, lens, coefs = offs[:count], lens[:count], coefs[:count]
    u = v
    for k in range(count):
        s = u % P
        offs[k] = s + _HEAD + int(pool[s]) - 1
        lens[k] = int(pool[s + 7])
        coefs[k] = pool[s + 6]
        u = int(pool[s + 4])
    return u % P, offs, lens, coefs


@njit(cache=True, nogil=True, internal=True, inline="always")
def _packed(m):
    """Floats of a symmetric m x m matrix kept as its upper triangle, row by row
    (row i: its entries i..m-1, from ``_row_at(i, m)``): an anchor's bordered
    inverse, whose reads were most of an update's memory traffic (the whole of it
    for a row joining M, an entry written a frontier of regions before)."""
    return m * (m + 1) // 2


@njit(cache=True, nogil=True, internal=True, inline="always")
def _row_at(i, m):
    """Where row i of a packed upper triangle (:func:`_packed`) starts."""
    return i * m - i * (i - 1) // 2


@njit(cache=True, nogil=True, internal=True)
def _anchor_rows(pool, sa):
    """The anchor's (b', rows) as indices 0 and 1 + i, and its inverse (a view of
    its packed upper triangle: :func:`_packed`)."""
    return _anchor_rows_into(pool, sa, np.empty(int(pool[sa]), np.int64))


@njit(cache=True, nogil=True, internal=True)
def _anchor_rows_into(pool, sa, ibuf):
    """:func:`_anchor_rows` with the indices in ``ibuf`` (a view of it returned)."""
    mba = int(pool[sa])
    ia = ibuf[:mba]
    ia[0] = 0
    for k in range(mba - 1):
        ia[k + 1] = 1 + int(pool[sa + _HEAD + k])
    s = sa + _HEAD + mba - 1
    return ia, pool[s : s + _packed(mba)]


@njit(cache=True, nogil=True, internal=True, fastmath={"reassoc", "contract"})
def _symv(A, x, out):
    """A x into ``out`` (returned), A symmetric as its packed upper triangle
    (:func:`_packed`): each stored entry read once, for its row's sum and its
    column's (reassociated so the sums vectorise)."""
    m = x.shape[0]
    for i in range(m):
        out[i] = 0.0
    p = 0
    for i in range(m):
        xi = x[i]
        acc = A[p] * xi
        for j in range(i + 1, m):
            b = A[p + j - i]
            acc += b * x[j]
            out[j] += b * xi
        out[i] += acc
        p += m - i
    return out


@njit(cache=True, nogil=True, internal=True)
def _product_into(pool, sa, offs, lens, coefs, au, ibuf, abuf, aabuf, out):
    """B a for a over (b', rows) (zero off the entry's margin rows), B the inverse
    of the chain (``sa``, ``offs``, ``lens``, ``coefs``): right on the entry's margin
    rows. A term's nonzeros in ascending order: the sums of the dense w's. Written
    into ``out`` (returned); ``ibuf``, ``abuf``, ``aabuf``: room for the anchor's
    rows, a on them and their product."""
    n1 = au.shape[0]
    ia, A = _anchor_rows_into(pool, sa, ibuf)
    aa = abuf[: ia.shape[0]]
    for j in range(ia.shape[0]):
        aa[j] = au[ia[j]]
    Aa = _symv(A, aa, aabuf[: ia.shape[0]])
    for i in range(n1):
        out[i] = 0.0
    for i in range(ia.shape[0]):
        out[ia[i]] = Aa[i]
    for t in range(offs.shape[0]):
        o, k, dot = offs[t], lens[t], 0.0
        for q in range(k):
            dot += pool[o + k + q] * au[int(pool[o + q])]
        if dot != 0.0:
            f = coefs[t] * dot
            for q in range(k):
                out[int(pool[o + q])] += f * pool[o + k + q]
    return out


@njit(cache=True, nogil=True, internal=True)
def _column_into(pool, sa, offs, lens, coefs, ur, ibuf, out):
    """Column ``ur`` of the chain's inverse over (b', rows), into ``out`` (n + 1,
    returned; ``ibuf``: room for the anchor's rows): right on the entry's margin
    rows."""
    ia, A = _anchor_rows_into(pool, sa, ibuf)
    m = ia.shape[0]
    for i in range(out.shape[0]):
        out[i] = 0.0
    for j in range(m):
        if ia[j] == ur:  # column j is row j: above the diagonal, then along row j
            for i in range(j):
                out[ia[i]] = A[_row_at(i, m) + j - i]
            p = _row_at(j, m)
            for i in range(j, m):
                out[ia[i]] = A[p + i - j]
    for t in range(offs.shape[0]):
        o, k = offs[t], lens[t]
        wr = 0.0
        for q in range(k):
            if int(pool[o + q]) == ur:
                wr = pool[o + k + q]
                break
        if wr != 0.0:
            f = coefs[t] * wr
            for q in range(k):
                out[int(pool[o + q])] += f * pool[o + k + q]
    return out


@njit(cache=True, nogil=True, internal=True)
def _anchor_slot(pool, at, v, mb, n, nv):
    """Where the inverse of an anchor of mb - 1 margin rows will lie in the ring
    (an offset of ``pool``), for :func:`_explicit_inverse_into` to write it there
    from the entry at ``v``'s inverse, which :func:`_pool_put` then leaves in place;
    -1 where that would overwrite what the inverse is read from (the entries from
    v's anchor on, the oldest of them) or the entry would not fit."""
    body = _packed(mb)
    size = _entry_size(mb, body, n, nv)
    P = pool.shape[0]
    if size > P:
        return -1
    u, s = _entry_place(pool, at, size)
    if u + size > int(pool[v % P + 3]) + P:
        return -1
    return s + _HEAD + mb - 1


@njit(cache=True, nogil=True)
def explicit_inverse(pool, v, M, w, coef):
    """The bordered inverse on the margin rows ``M`` of the entry at ``v``'s inverse
    plus the term ``coef`` w w^T (:func:`_explicit_inverse_into`), a new array."""
    return _explicit_inverse_into(pool, v, M, w, coef,
                                  np.empty(_packed(M.shape[0] + 1)))  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def _explicit_inverse_into(pool, v, M, w, coef, out):
    """The bordered inverse on the margin rows ``M`` of the entry at ``v``'s inverse
    plus the term ``coef`` w w^T, as the symmetric packed upper triangle an anchor
    keeps (:func:`_packed`; each entry the mean of the two mirrored sums): a child's
    inverse written out (the anchor of the next terms) from its parent's entry and
    its own term (:func:`update`), written into ``out`` (returned): the ring's own
    slot for it in the walk (:func:`_anchor_slot`): its copy from a new array was
    about a third of :func:`pool_put`'s time (by the floats moved).

    The anchor's entries plus the chain's terms W diag(c) W^T, written straight
    into the triangle: the full matrix it was built in (zeroed, filled, summed with
    the product, then packed by the ring) took three more passes over (n_M + 1)^2
    floats an anchor."""
    sa, offs, lens, coefs = _chain(pool, v)
    ia, A = _anchor_rows(pool, sa)
    n1 = w.shape[0]
    mb = M.shape[0] + 1
    idx = np.empty(mb, np.int64)
    idx[0] = 0
    for k in range(mb - 1):
        idx[k + 1] = 1 + M[k]
    pa = np.full(n1, -1, np.int64)
    for k in range(ia.shape[0]):
        pa[ia[k]] = k
    ma = ia.shape[0]
    c = offs.shape[0] + 1
    W = np.empty((mb, c))
    Wc = np.empty((c, mb))
    dense = np.zeros(n1)
    for t in range(c):
        if t < c - 1:  # the term's w, dense
            for q in range(n1):  # loops, not slice copies: see bigrate._jit
                dense[q] = 0.0
            for q in range(lens[t]):
                dense[int(pool[offs[t] + q])] = pool[offs[t] + lens[t] + q]
        for i in range(mb):
            x = w[idx[i]] if t == c - 1 else dense[idx[i]]
            W[i, t] = x
            Wc[t, i] = x * (coef if t == c - 1 else coefs[t])
    G = W @ Wc  # the terms' sum, (i, j) and (j, i) each rounded their own way
    p = 0
    for i in range(mb):
        # the anchor's entries, row by row of its triangle: the rows both share keep
        # their order down a chain (a row joins M last), so for j > i the anchor's
        # row ai holds (ai, aj) at ai's row start + aj - ai, read in order
        ai = pa[idx[i]]
        if ai < 0:
            out[p] = G[i, i]
            for j in range(i + 1, mb):
                out[p + j - i] = 0.5 * (G[i, j] + G[j, i])
            p += mb - i
            continue
        base = _row_at(ai, ma) - ai
        out[p] = A[base + ai] + G[i, i]
        for j in range(i + 1, mb):
            aj = pa[idx[j]]
            x = 0.0
            if aj > ai:
                x = A[base + aj]
            elif aj >= 0:  # out of order: not from a walk's chain, but right anyway
                x = A[_row_at(aj, ma) + ai - aj]
            out[p + j - i] = 0.5 * ((x + G[i, j]) + (x + G[j, i]))
        p += mb - i
    return out


@njit(cache=True, nogil=True, inline="always")
def _record_region(r_state, r_off, r_vert, r_area, r_h, nreg, st, P, A):
    """Region ``nreg``'s partition, polygon and area into the walk's growing
    records (doubled when full); returns the records (new arrays where grown)."""
    if nreg == r_state.shape[0]:
        cap = 2 * r_state.shape[0]
        r_state = _grow2(r_state, cap)
        r_area = _grow1(r_area, cap)
        r_h = _grow3(r_h, cap)
        off = np.zeros(cap + 1, np.int64)
        for k in range(nreg + 1):  # loops, not slice copies: see bigrate._jit
            off[k] = r_off[k]
        r_off = off
    for j in range(st.shape[0]):
        r_state[nreg, j] = st[j]
    r_area[nreg] = A
    r_vert = _put_polygon(r_vert, r_off, nreg, P)
    return r_state, r_off, r_vert, r_area, r_h


@njit(cache=True, nogil=True, inline="always")
def _put_polygon(vert, off, k, P):
    """Polygon ``P`` as record k of (vertices ``vert``, offsets ``off``, which has
    room for k + 2): returns ``vert``, a new array where grown."""
    start = off[k]
    while start + P.shape[0] > vert.shape[0]:
        vert = _grow2(vert, 2 * vert.shape[0])
    for i in range(P.shape[0]):  # loops, not slice copies: see bigrate._jit
        vert[start + i, 0], vert[start + i, 1] = P[i, 0], P[i, 1]
    off[k + 1] = start + P.shape[0]
    return vert


@njit(cache=True, nogil=True, inline="always")
def _facet_probe(P, lab, ineq, i, probe):
    """The point just across the middle of edge i of polygon P where it is a facet
    with a move, no farther than a thousandth of the edge (small regions have small
    neighbours): (whether, x, y)."""
    f = lab[i]
    if probe <= 0 or f < 0 or ineq[f, 4] < 0:
        return False, 0.0, 0.0
    i1 = i + 1 if i + 1 < P.shape[0] else 0
    length = np.hypot(P[i1, 0] - P[i, 0], P[i1, 1] - P[i, 1])
    if length <= 1e-15:
        return False, 0.0, 0.0
    nrm = max(np.hypot(ineq[f, 0], ineq[f, 1]), 1e-300)
    dist = min(probe, 1e-3 * length)
    qx = 0.5 * (P[i, 0] + P[i1, 0]) + dist * ineq[f, 0] / nrm
    qy = 0.5 * (P[i, 1] + P[i1, 1]) + dist * ineq[f, 1] / nrm
    return True, qx, qy


@njit(cache=True, nogil=True, inline="always")
def _across_facet(st, P, lab, ineq, i, probe, diag, nxt):
    """The neighbour across the facet on edge i of the region's polygon P (Theorem
    3): the partition with the facet's row moved. With ``probe`` > 0 the move is
    checked at a point just across the edge's middle (no farther than a thousandth of
    the edge: small regions have small neighbours); where the region's solution,
    carried there, breaks more rows than the facet's (a degenerate crossing) they all
    move (the move is then -1). The partition is written into ``nxt``. Returns
    (whether the edge is a facet with a move, the move as row * 4 + kind, the probe
    point, whether probed)."""
    f = lab[i]
    npts = P.shape[0]
    if f < 0 or ineq[f, 4] < 0:
        return False, -1, 0.0, 0.0, False
    i1 = i + 1 if i + 1 < npts else 0
    length = np.hypot(P[i1, 0] - P[i, 0], P[i1, 1] - P[i, 1])
    if length <= 1e-15:
        return False, -1, 0.0, 0.0, False
    for j in range(st.shape[0]):
        nxt[j] = st[j]
    mv = int(ineq[f, 3]) * 4 + int(ineq[f, 4])
    qx = qy = 0.0
    hp = probe > 0
    if hp:
        _, qx, qy = _facet_probe(P, lab, ineq, i, probe)
        broken = 0
        for j in range(ineq.shape[0]):
            if ineq[j, 0] * qx + ineq[j, 1] * qy - ineq[j, 2] > 0:
                broken += 1
        if broken > 1:
            diag[D_DEGENERATE] += 1
            mv = -1
            for j in range(ineq.shape[0]):
                if ineq[j, 0] * qx + ineq[j, 1] * qy - ineq[j, 2] > 0:
                    nxt[int(ineq[j, 3])] = move_to(int(ineq[j, 4]))
            return True, mv, qx, qy, hp
    nxt[int(ineq[f, 3])] = move_to(int(ineq[f, 4]))
    return True, mv, qx, qy, hp


@njit(cache=True, nogil=True)
def walk(Q, y, box, rcoef, dom, KvT, y_val, cell_tol, keep_h,
         table, store, n_seen,
         qst, qpt, qhas, qlink, head, tail,
         pool, at, diag, tol, area_tol, probe, correcting, budget,
         dpt, dst, n_drop, chain_max, miss_stop, age_stop):  # fmt: skip
    """Walk over critical regions (Theorem 3) from the queued partitions
    (qst[head:tail], with the probe point each came through, if any; breadth first
    but for runs of up to ``CHAIN_RUN`` regions, each the last neighbour its
    predecessor queued),
    until the queue is empty (WALK_DONE), ``budget`` new regions were recorded
    (WALK_MORE: call again to go on), or a singular bordered system with solutions
    is met (WALK_SINGULAR: non-unique duals, for the caller's exact slow path; one
    without any solution is a partition of no area, skipped).

    Each region is recorded once, whole: its partition, its polygon in ``dom`` and its
    invariant cells on the validation rows (``KvT`` (n, n_val): their kernel columns,
    ``y_val`` their labels; :func:`cells` with ``cell_tol``), from the numerators h =
    Kv (alpha * y) + b' of their decision values as coefficients of (1, p1, p2), which
    are kept too only with ``keep_h`` (R x n_val x 3 floats: 2.9 KB a region at 120
    validation rows, written, copied and gathered, where the cells are ~0.2 KB). A
    move is first checked at a point just across its facet (``probe`` > 0); where the
    region's solution carried there breaks several rows (a degenerate crossing) they
    all move; a move that does not hold there is dropped (``correcting``: corrected
    there instead). A region too thin to keep (area <= ``area_tol``) is not walked
    across; its partition and polygon are returned apart (the last three outputs),
    for the caller's coverage.

    A partition one row away from its parent's (``qlink``: the parent's entry in
    ``pool`` and the row's move, -1 where none) takes its system by :func:`update`
    from the parent's; the rest, an evicted parent, a nearly singular update and every
    ``MAX_UPDATES``-th generation, from scratch. ``pool`` is a ring of the recorded
    regions' systems, ``at[0]`` its write position (grows without wrapping: an entry
    at v is intact while at[0] <= v + len(pool)), ``at[1]`` where it was when the
    ring last grew, ``at[2]`` the length of the walk's run so far (kept from call to
    call, so that where the calls stop does not change the order). An updated
    region's entry holds its rank-one term on its parent's inverse, not its own
    inverse (:func:`update`), but where that would make more than ``chain_max``
    terms since the last inverse written out: then its inverse is written
    (:func:`explicit_inverse`).

    The call also returns (WALK_MORE) once ``miss_stop`` moves have found their
    parent's entry overwritten since the ring last grew (``D_RING_SHORT``), or once
    an update has read an anchor more than ``age_stop`` floats back (counted in
    ``D_RING_FAR``), so the caller can grow the ring before the rest of its budget
    runs on one too small.

    ``dpt[:n_drop]`` (grown as needed, returned after the queue): the probe points of
    the moves dropped because they did not hold just across their facet, where a gap
    in the regions walked may start (the caller seeds those no region covers), and in
    ``dst[:n_drop]`` the partition met at each, from which the seed's corrections
    start."""
    # the arrays passed from kernel to kernel region after region, without their
    # reference counts (:func:`bigrate._jit.borrowed`; ~480 atomic counts a region
    # were 8% of a spambase 600 task): the caller's arguments, which it keeps for
    # the call, and the walk's own work arrays, kept alive to its end
    Q, y, box, rcoef = borrowed(Q), borrowed(y), borrowed(box), borrowed(rcoef)
    dom, KvT, y_val = borrowed(dom), borrowed(KvT), borrowed(y_val)
    pool, at, diag = borrowed(pool), borrowed(at), borrowed(diag)
    n = y.shape[0]
    nv = KvT.shape[1]
    cap = 64
    r_state = np.empty((cap, n), np.int8)
    r_off = np.zeros(cap + 1, np.int64)
    r_vert = np.empty((cap * 8, 2))
    r_area = np.empty(cap)
    r_h = np.empty((cap, nv if keep_h else 0, 3))
    cout = _cells_out(cap * 8)
    nreg = 0
    # the regions too thin to keep, as partitions and polygons (no numerators): what
    # they cover is not a gap for the caller
    t_state = np.empty((cap, n), np.int8)
    t_off = np.zeros(cap + 1, np.int64)
    t_vert = np.empty((cap * 8, 2))
    t_area = np.empty(cap)
    t_h = np.empty((cap, 0, 3))
    nthin = 0
    dom_lab = np.full(dom.shape[0], -1, np.int64)
    status = WALK_DONE
    short0, far0 = diag[D_RING_SHORT], diag[D_RING_FAR]
    # a solve's margin rows and LU factors, for its inverse where it is kept
    Mf, LUf = np.empty(0, np.int64), (np.empty((0, 0)).T, np.empty(0, np.int32))
    # the E rows' sums of g~ and of the numerators last kept (:func:`e_sums`)
    g_kept, g_sums = _no_sums(n, n)
    h_kept, h_sums = _no_sums(n, nv)
    yb_own = np.empty((n, 3))
    yb = borrowed(yb_own)
    for j in range(n):
        for t in range(3):
            yb[j, t] = y[j] * box[j, t]
    if at.shape[0] != 3:
        raise ValueError("at must hold the ring's two positions and the run's length")
    hot = at[2]
    # what every region used to allocate anew: its partition popped from the queue,
    # the clip's arrays, and the empty term and inverse of a region without them
    st_own = np.empty(n, np.int8)
    cbufs_own = _clip_buffers(2 * dom.shape[0] + 136)
    no_w, no_M = np.empty(0), np.empty(0, np.int64)
    ws_own = update_space(n, nv)  # and the update's arrays
    st_buf, cbufs, ws = borrowed(st_own), borrowed(cbufs_own), borrowed(ws_own)
    while head < tail:
        if diag[D_RING_SHORT] - short0 >= miss_stop or diag[D_RING_FAR] > far0:
            status = WALK_MORE
            break
        if hot > 0 and hot <= CHAIN_RUN and tail - 1 > head:
            q = tail - 1
            tail -= 1
        else:
            q = head
            head += 1
            hot = at[2] = 0
        st = st_buf  # a copy: the queue's rows move as it is compacted
        for j in range(n):
            st[j] = qst[q, j]
        px, py, has = qpt[q, 0], qpt[q, 1], qhas[q]
        parent, move = qlink[q, 0], qlink[q, 1]
        hst = _hash(st)
        k, slot = _slot(table, store, st, hst)
        if k >= 0:
            continue
        ok = False
        depth = chain = 0
        wc, cc = no_w, 0.0  # the region's term on its parent's inverse
        intact = move >= 0 and pool_intact(pool, at, parent)
        if move >= 0 and pool.shape[0] > 0 and not intact:
            # gone from the ring (or its anchor is), or never fitted in it
            diag[D_POOL_MISSES] += 1
            lost = parent
            if parent >= 0 and at[0] <= parent + pool.shape[0]:
                lost = int(pool[parent % pool.shape[0] + 3])  # its anchor
            if lost < 0 or lost >= at[1]:  # -1: larger than the ring
                diag[D_RING_SHORT] += 1
        if intact:
            s = parent % pool.shape[0]
            depth, chain = int(pool[s + 1]), int(pool[s + 5])
            if pool[s + 3] >= at[1]:
                diag[D_RING_AGE] = max(diag[D_RING_AGE], at[0] - pool[s + 3])
                if at[0] - pool[s + 3] > age_stop:
                    diag[D_RING_FAR] += 1
            if depth < MAX_UPDATES:
                ok, Mc, wc, cc, alpha, bprime, gt, h, ineq = _update(
                    Q, y, box, rcoef, KvT, st, move // 4, move % 4, pool, parent, ws
                )
                depth += 1
                chain += 1
        fresh = not ok  # solved from scratch: its numerators and inverse only once
        placed = False  # its inverse written in the ring already (_anchor_slot)
        if ok:  # it is recorded (most pops of seeds and failed probes are not)
            singular, consistent = False, True
            diag[D_UPDATES] += 1
        else:
            alpha, bprime, gt, ineq, singular, consistent, Mf, LUf = _system(
                Q, y, box, rcoef, st, g_kept, g_sums
            )
        miss = _miss(ineq, px, py) if has else -np.inf
        if correcting and miss > 0:
            # the walk has broken into islands that seeding reconnects only slowly:
            # the partition that holds just across the facet
            st, moves, held, sys_ = _corrected(Q, y, box, rcoef, st, px, py, 10,
                                               g_kept, g_sums)  # fmt: skip
            diag[D_CORRECTIONS] += moves
            hst = _hash(st)
            k, slot = _slot(table, store, st, hst)
            if k >= 0:
                # a partition seen already, e.g. the parent itself, on whose boundary
                # the point lies within a rounding (corrections that went round a
                # cycle of the two): the point just across is a gap seed if no
                # region covers it
                dpt, dst, n_drop = _drop(dpt, dst, n_drop, px, py, st)
                continue
            if not held:  # else its last round solved it
                sys_ = _system(Q, y, box, rcoef, st, g_kept, g_sums)
            alpha, bprime, gt, ineq, singular, consistent, Mf, LUf = sys_
            fresh = True
            miss = _miss(ineq, px, py)
        if miss > 1e-9:
            # does not hold just across the facet it came through (a degenerate
            # crossing): its region is empty or lies elsewhere, where another
            # neighbour or a gap seed finds it; not marked seen
            diag[D_DEGENERATE] += 1
            if has:  # the point just across: a gap seed if no region covers it
                dpt, dst, n_drop = _drop(dpt, dst, n_drop, px, py, st)
            continue
        table, store, n_seen = _seen_add(table, store, n_seen, st, slot, hst)
        if singular and not consistent:
            # no solution for any area of parameters: a partition that holds on a
            # line at most (e.g. M empty: y^T alpha = 0 on n+ C+ = n- C- only), met by a
            # seed on that line; its neighbours on either side are walked from theirs.
            # A partition of no area, not a non-unique dual: the walk goes on
            diag[D_THIN] += 1
            continue
        if singular:
            diag[D_SINGULAR] += 1
            status = WALK_SINGULAR
            break
        P, lab = _clip_into(dom, dom_lab, ineq, tol, cbufs)
        A = area(P) if P.shape[0] >= 3 else 0.0
        if A <= area_tol:
            diag[D_THIN] += 1
            diag[D_THIN_AREA] += max(A, 0.0)
            if A > 0.0:
                t_state, t_off, t_vert, t_area, t_h = _record_region(
                    t_state, t_off, t_vert, t_area, t_h, nthin, st, P, A
                )
                nthin += 1
            # not walked across: the points just across its facets, where a gap
            # behind it may start (the caller seeds those no region covers)
            for i in range(P.shape[0]):
                ok, qx, qy = _facet_probe(P, lab, ineq, i, probe)
                if ok:
                    dpt, dst, n_drop = _drop(dpt, dst, n_drop, qx, qy, st)
            continue
        # record the region
        r_state, r_off, r_vert, r_area, r_h = _record_region(
            r_state, r_off, r_vert, r_area, r_h, nreg, st, P, A
        )
        if fresh:
            h = _numerators(KvT, y, yb, st, Mf, alpha, bprime, h_kept, h_sums)
            Mc, Bc, depth = no_M, no_w, 0
            if pool.shape[0] > 0:
                # the inverse of the bordered matrix of its solve (as
                # bordered_inverse, which would build it again)
                Mc, Bc = Mf, packed_symmetric(lu_inverse(LUf[0], LUf[1]))
        elif chain > chain_max:  # its inverse written out: the next terms' anchor
            # straight into its entry's place in the ring where that overwrites
            # nothing it is read from
            b0 = _anchor_slot(pool, at, parent, Mc.shape[0] + 1, n, nv)
            placed = b0 >= 0
            if placed:
                Bc = _explicit_inverse_into(
                    pool, parent, Mc, wc, cc, pool[b0 : b0 + _packed(Mc.shape[0] + 1)]
                )
            else:
                Bc = explicit_inverse(pool, parent, Mc, wc, cc)
        else:
            Bc = no_w
        if keep_h:
            for v in range(h.shape[0]):  # loops, not slice copies: see bigrate._jit
                for t in range(3):
                    r_h[nreg, v, t] = h[v, t]
        if nv > 0:
            cout = _piece_cells(cout, P, h, nreg, y_val, cell_tol)
        nreg += 1
        diag[D_REGIONS] += 1
        me = -1
        if Bc.shape[0] > 0 or not fresh:
            me = _pool_put(pool, at, Mc, Bc, wc, cc, parent, alpha, bprime, gt, h,
                           depth, placed)  # fmt: skip
        # the neighbour across every facet (Theorem 3), into a queue with room for
        # them all made first: arrays reassigned in the loop over the facets took
        # and dropped a reference each a facet
        qst, qpt, qhas, qlink, head, tail = _queue_room(
            qst, qpt, qhas, qlink, head, tail, P.shape[0]
        )
        tail0 = tail
        for i in range(P.shape[0]):
            nxt = qst[tail]  # written there: queued unless seen already
            ok, mv, qx, qy, hp = _across_facet(st, P, lab, ineq, i, probe, diag, nxt)
            if not ok:
                continue
            hn = _hash(nxt) if mv < 0 else _rehashed(hst, st, nxt, mv // 4)
            if _slot(table, store, nxt, hn)[0] >= 0:
                continue
            qlink[tail, 0], qlink[tail, 1] = me, mv
            qpt[tail, 0], qpt[tail, 1] = qx, qy
            qhas[tail] = hp
            tail += 1
        hot = hot + 1 if tail > tail0 else 0
        at[2] = hot
        if nreg >= budget:
            status = WALK_MORE
            break
    if status == WALK_DONE and head < tail:
        status = WALK_MORE
    keep_alive(yb_own)  # the owners of the borrowed work arrays, to here
    keep_alive(st_own)
    keep_alive(cbufs_own)
    keep_alive(ws_own)
    nvtx, tvtx = r_off[nreg], t_off[nthin]
    cv, co, creg, cfn, cfp = _cells_done(cout)
    return (status, table, store, n_seen, qst, qpt, qhas, qlink, head, tail, dpt,
            dst, n_drop, r_state[:nreg].copy(), r_vert[:nvtx].copy(), r_off[: nreg + 1].copy(),
            r_area[:nreg].copy(), r_h[:nreg].copy(), cv, co, cfn, cfp, creg,
            t_state[:nthin].copy(), t_vert[:tvtx].copy(), t_off[: nthin + 1].copy())  # fmt: skip


@njit(cache=True, nogil=True, internal=True, inline="always")
def _drop(dpt, dst, n_drop, px, py, st):
    """``dpt[:n_drop]`` and ``dst[:n_drop]`` (grown as needed) with the probe point
    (px, py) and the partition ``st`` met there appended."""
    if n_drop == dpt.shape[0]:
        dpt = _grow2(dpt, 2 * n_drop + 8)
        dst = _grow2(dst, 2 * n_drop + 8)
    dpt[n_drop, 0], dpt[n_drop, 1] = px, py
    for j in range(st.shape[0]):
        dst[n_drop, j] = st[j]
    return dpt, dst, n_drop + 1


@njit(cache=True, nogil=True, internal=True)
def _miss(ineq, px, py):
    """How far the point (px, py) breaks the worst of the inequalities."""
    worst = -np.inf
    for j in range(ineq.shape[0]):
        worst = max(worst, ineq[j, 0] * px + ineq[j, 1] * py - ineq[j, 2])
    return worst


@njit(cache=True, nogil=True, internal=True)
def _queue_room(qst, qpt, qhas, qlink, head, tail, need):
    """The walk's queue (qst, qpt, qhas, qlink; live from head to tail) with room for
    ``need`` more at its tail: where it has not, its live part moved to the front if
    half of it was popped (the queue holds a frontier, not every partition ever
    pushed), and grown 2x if that is not room enough. Returns the arrays (new ones
    where grown), head and tail."""
    if tail + need <= qst.shape[0]:
        return qst, qpt, qhas, qlink, head, tail
    if 2 * head >= tail:
        for q in range(head, tail):  # loops, not slice copies: see bigrate._jit
            for j in range(qst.shape[1]):
                qst[q - head, j] = qst[q, j]
            qpt[q - head, 0], qpt[q - head, 1] = qpt[q, 0], qpt[q, 1]
            qhas[q - head] = qhas[q]
            qlink[q - head, 0], qlink[q - head, 1] = qlink[q, 0], qlink[q, 1]
        head, tail = 0, tail - head
    if tail + need > qst.shape[0]:
        cap = max(2 * qst.shape[0], tail + need)
        qst = _grow2(qst, cap)
        qpt = _grow2(qpt, cap)
        qhas = _grow1(qhas, cap)
        qlink = _grow2(qlink, cap)
    return qst, qpt, qhas, qlink, head, tail


@njit(cache=True, nogil=True, internal=True)
def _grow1(a, cap):
    out = np.empty(cap, a.dtype)
    for i in range(a.shape[0]):  # loops, not slice copies: see bigrate._jit
        out[i] = a[i]
    return out


@njit(cache=True, nogil=True, internal=True)
def _grow2(a, cap):
    out = np.empty((cap, a.shape[1]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            out[i, j] = a[i, j]
    return out


@njit(cache=True, nogil=True, internal=True)
def _grow3(a, cap):
    out = np.empty((cap, a.shape[1], a.shape[2]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            for k in range(a.shape[2]):
                out[i, j, k] = a[i, j, k]
    return out


# ------------------------------------------------------------------ gaps from edges
@njit(cache=True, nogil=True, internal=True)
def _boxes(vert, off):
    """Each polygon's bounding box (x0, x1, y0, y1) and orientation (+1: ccw), shared
    by the searches over polygons bucketed on a grid."""
    n = off.shape[0] - 1
    bb, sgn = np.empty((n, 4)), np.empty(n)
    for r in range(n):
        a, b = off[r], off[r + 1]
        if b <= a:  # no vertices: an empty box
            bb[r, 0], bb[r, 1], bb[r, 2], bb[r, 3], sgn[r] = (
                np.inf,
                -np.inf,
                np.inf,
                -np.inf,
                1.0,
            )
            continue
        bx0 = bx1 = vert[a, 0]
        by0 = by1 = vert[a, 1]
        twice = 0.0
        for k in range(a, b):
            k1 = k + 1 if k + 1 < b else a
            bx0, bx1 = min(bx0, vert[k, 0]), max(bx1, vert[k, 0])
            by0, by1 = min(by0, vert[k, 1]), max(by1, vert[k, 1])
            twice += vert[k, 0] * vert[k1, 1] - vert[k1, 0] * vert[k, 1]
        bb[r, 0], bb[r, 1], bb[r, 2], bb[r, 3] = bx0, bx1, by0, by1
        sgn[r] = 1.0 if twice >= 0.0 else -1.0
    return bb, sgn


@njit(cache=True, nogil=True, internal=True, inline="always")
def _cell_range(lo, hi, origin, step, g):
    return (min(max(int((lo - origin) / step), 0), g - 1),
            min(max(int((hi - origin) / step), 0), g - 1))  # fmt: skip


@njit(cache=True, nogil=True, internal=True, inline="always")
def _window(seg, y0, sy, g, tol):
    """The box (x0, x1, y0, y1) of the segment seg[0] -> seg[1] and the range of
    grid rows it meets within ``tol`` (cy0, cy1)."""
    wx0, wx1 = min(seg[0, 0], seg[1, 0]), max(seg[0, 0], seg[1, 0])
    wy0, wy1 = min(seg[0, 1], seg[1, 1]), max(seg[0, 1], seg[1, 1])
    cy0, cy1 = _cell_range(wy0 - tol, wy1 + tol, y0, sy, g)
    return wx0, wx1, wy0, wy1, cy0, cy1


@njit(cache=True, nogil=True, internal=True, inline="always")
def _strip(cy, y0, sy, g, tol):
    """The y-range of grid row cy widened by ``tol`` (the first and last rows
    open-ended: what lies past the grid is bucketed into them)."""
    ya = -np.inf if cy == 0 else y0 + cy * sy - tol
    yb = np.inf if cy == g - 1 else y0 + (cy + 1) * sy + tol
    return ya, yb


@njit(cache=True, nogil=True, internal=True, inline="always")
def _strip_x(vert, a, b, ya, yb):
    """The x-range of the convex polygon vert[a:b] (or the segment of its two
    vertices) within the strip ya <= y <= yb; lo > hi where it misses it."""
    lo, hi = np.inf, -np.inf
    for k in range(a, b):
        k1 = k + 1 if k + 1 < b else a
        xk, yk, x1, y1 = vert[k, 0], vert[k, 1], vert[k1, 0], vert[k1, 1]
        if ya <= yk <= yb:
            lo, hi = min(lo, xk), max(hi, xk)
        for yc in (ya, yb):
            if (yk - yc) * (y1 - yc) < 0.0:
                x = xk + (yc - yk) * (x1 - xk) / (y1 - yk)
                lo, hi = min(lo, x), max(hi, x)
    return lo, hi


@njit(cache=True, nogil=True, internal=True, inline="always")
def _row_cells(vert, a, b, cy, x0, y0, sx, sy, g, tol):
    """The cells (cx0, cx1) of grid row cy that the convex polygon vert[a:b] (or the
    segment of its two vertices) meets within ``tol``; cx0 > cx1 where none."""
    ya, yb = _strip(cy, y0, sy, g, tol)
    lo, hi = _strip_x(vert, a, b, ya, yb)
    if lo > hi:
        return 1, 0
    return _cell_range(lo - tol, hi + tol, x0, sx, g)


@njit(cache=True, nogil=True, internal=True)
def _bucket(vert, off, bb, x0, y0, sx, sy, g, tol):
    """The polygons listed by the grid cells they meet, row by row (a long thin
    polygon across the grid meets a few cells a row, not every cell of its box:
    hill-valley's (C+, C-) triangle is a fan of them), within ``tol`` (CSR: count,
    members)."""
    count = np.zeros(g * g + 1, np.int64)
    for _pass in range(2):
        if _pass == 1:
            for c in range(g * g):
                count[c + 1] += count[c]
            members = np.empty(count[g * g], np.int64)
            fill = count[:-1].copy()
        for r in range(bb.shape[0]):
            cy0, cy1 = _cell_range(bb[r, 2] - tol, bb[r, 3] + tol, y0, sy, g)
            for cy in range(cy0, cy1 + 1):
                cx0, cx1 = _row_cells(
                    vert, off[r], off[r + 1], cy, x0, y0, sx, sy, g, tol
                )
                for cx in range(cx0, cx1 + 1):
                    c = cy * g + cx
                    if _pass == 0:
                        count[c + 1] += 1
                    else:
                        members[fill[c]] = r
                        fill[c] += 1
    return count, members


@njit(cache=True, nogil=True, internal=True)
def _edges(vert, off, sgn):
    """Each polygon edge as (x, y) of its first vertex, its outward normal as long
    as the edge, and that length (V, 5): computed once for the many segments tested
    against it, in one array (each array a call takes has its references counted)."""
    ev = np.empty((vert.shape[0], 5))
    for r in range(off.shape[0] - 1):
        a, b = off[r], off[r + 1]
        for e in range(a, b):
            e1 = e + 1 if e + 1 < b else a
            ex, ey = vert[e1, 0] - vert[e, 0], vert[e1, 1] - vert[e, 1]
            mx, my = sgn[r] * ey, -sgn[r] * ex
            ev[e, 0], ev[e, 1] = vert[e, 0], vert[e, 1]
            ev[e, 2], ev[e, 3], ev[e, 4] = mx, my, np.hypot(mx, my)
    return ev


@njit(cache=True, nogil=True, internal=True)
def _segment_in(ev, a, b, ox, oy, dx, dy, t0, t1, tol):
    """The part [t0, t1] of the segment (ox, oy) + t (dx, dy) within ``tol`` (a
    distance) of the convex polygon of edges ev[a:b] (:func:`_edges`; Cyrus-Beck);
    empty where t0 >= t1."""
    for e in range(a, b):
        mx, my = ev[e, 2], ev[e, 3]
        f0 = (ox - ev[e, 0]) * mx + (oy - ev[e, 1]) * my - tol * ev[e, 4]
        fd = dx * mx + dy * my
        if fd == 0.0:
            if f0 > 0.0:
                return 1.0, 0.0
        elif fd > 0.0:
            t1 = min(t1, -f0 / fd)
        else:
            t0 = max(t0, -f0 / fd)
        if t0 >= t1:
            break
    return t0, t1


@njit(cache=True, nogil=True)
def edge_gaps(vert, off, x0, y0, x1, y1, eps, min_len, tol, start, min_prod=0.0):
    """Points in the gaps between convex polygons vert[off[r]:off[r + 1]] (either
    orientation) in the box [x0, x1] x [y0, y1]: a gap is bounded by polygon edges,
    so it lies just outside the parts of some edges no other polygon covers. For
    every edge, the segment ``eps`` outside it is clipped against the polygons whose
    boxes meet it (within ``tol``). Each uncovered stretch longer than ``min_len``
    gives: how far the uncovered strip reaches along the edge's normal from its
    middle (up to the stretch's length: where the next polygon or the box's side
    begins), the point half way across there, and the polygon whose edge it is. A
    stretch times its reach is about its gap's area: the slits neighbours leave
    between edges that agree only to a rounding (~1e-9 wide on hill-valley) have
    products of 1e-12, a gap of area_tol 1e-9. Returns (points (m, 2), stretch times
    reach (m,), polygon (m,)). Only the edges of polygons ``start`` on are scanned
    (against every polygon): a later search's, where the gaps beside earlier edges
    are known. With ``min_prod`` > 0 only the points whose product exceeds it are
    returned, and a stretch whose square does not (a reach is at most its stretch)
    is not followed across: hill-valley's rectangle, fold 0, has 123,026 stretches
    (the slits), of which 3,092 pass a tenth of area_tol."""
    n = off.shape[0] - 1
    bb, sgn = _boxes(vert, off)
    ev = _edges(vert, off, sgn)
    g = min(max(int(np.sqrt(n)), 1), 512)
    sx, sy = (x1 - x0) / g, (y1 - y0) / g
    count, members = _bucket(vert, off, bb, x0, y0, sx, sy, g, tol)
    stamp = np.full(n, -1, np.int64)  # the edge a polygon was last tested against
    seg = np.empty((2, 2))  # an edge's offset segment
    # the covered parts of an edge's segment: one at most per polygon (an array
    # grown in the loop over them had its references counted at every polygon)
    iv = np.empty((max(n, 1), 2))
    pts, prod, owner = np.empty((64, 2)), np.empty(64), np.empty(64, np.int64)
    m = 0
    for r in range(start, n):
        a, b = off[r], off[r + 1]
        if b - a < 3:
            continue
        for k in range(a, b):
            k1 = k + 1 if k + 1 < b else a
            dx, dy = vert[k1, 0] - vert[k, 0], vert[k1, 1] - vert[k, 1]
            L = np.hypot(dx, dy)
            if L <= min_len:
                continue
            nx, ny = sgn[r] * dy / L, -sgn[r] * dx / L
            ox, oy = vert[k, 0] + eps * nx, vert[k, 1] + eps * ny
            # the offset segment inside the box (Liang-Barsky): none on its sides
            tl, th = 0.0, 1.0
            for pp, qq in (
                (-dx, ox - x0),
                (dx, x1 - ox),
                (-dy, oy - y0),
                (dy, y1 - oy),
            ):
                if pp == 0.0:
                    if qq <= 0.0:
                        tl = 1.0
                elif pp < 0.0:
                    tl = max(tl, qq / pp)
                else:
                    th = min(th, qq / pp)
            if (th - tl) * L <= min_len:
                continue
            ni = 0
            seg[0, 0], seg[0, 1] = ox + tl * dx, oy + tl * dy
            seg[1, 0], seg[1, 1] = ox + th * dx, oy + th * dy
            wx0, wx1, wy0, wy1, cy0, cy1 = _window(seg, y0, sy, g, tol)
            for cy in range(cy0, cy1 + 1):
                cx0, cx1 = _row_cells(seg, 0, 2, cy, x0, y0, sx, sy, g, tol)
                for cx in range(cx0, cx1 + 1):
                    c = cy * g + cx
                    for q in range(count[c], count[c + 1]):
                        o = members[q]
                        if o == r or stamp[o] == k:
                            continue
                        stamp[o] = k
                        if (bb[o, 0] > wx1 + tol or bb[o, 1] < wx0 - tol
                                or bb[o, 2] > wy1 + tol or bb[o, 3] < wy0 - tol):  # fmt: skip
                            continue
                        t0, t1 = _segment_in(ev, off[o], off[o + 1], ox, oy, dx, dy,
                                             tl, th, tol)  # fmt: skip
                        if t0 < t1:
                            iv[ni, 0], iv[ni, 1] = t0, t1
                            ni += 1
            iv[:ni] = iv[:ni][np.argsort(iv[:ni, 0])]
            cur = tl
            for i in range(ni + 1):
                s = iv[i, 0] if i < ni else th
                stretch = (s - cur) * L
                if stretch > min_len and not stretch * stretch <= min_prod:
                    u = 0.5 * (cur + s)
                    px, py = ox + u * dx, oy + u * dy
                    reach = stretch * _reach(ev, off, bb, count, members, r, px,
                                             py, stretch * nx, stretch * ny, x0, y0, x1,
                                             y1, sx, sy, g, stretch, min_prod)  # fmt: skip
                    if m == pts.shape[0]:
                        pts, prod = _grow2(pts, 2 * m), _grow1(prod, 2 * m)
                        owner = _grow1(owner, 2 * m)
                    # half way across: as far from the edge as the gap lets a seed be
                    # (the region's own partition holds within 1e-9 of it, as
                    # :func:`correct` judges)
                    pts[m, 0], pts[m, 1] = px + 0.5 * reach * nx, py + 0.5 * reach * ny
                    prod[m], owner[m] = stretch * reach, r
                    if not (min_prod > 0.0 and prod[m] <= min_prod):
                        m += 1
                if i < ni:
                    cur = max(cur, iv[i, 1])
    return pts[:m].copy(), prod[:m].copy(), owner[:m].copy()


@njit(cache=True, nogil=True, internal=True)
def _reach(ev, off, bb, count, members, r, px, py, rdx, rdy, x0, y0, x1, y1,
           sx, sy, g, stretch, min_prod):  # fmt: skip
    """The share t in [0, 1] of the ray (px, py) + t (rdx, rdy) before it enters a
    polygon other than r or leaves the box; or, with ``min_prod`` > 0, the first
    share found that makes stretch * (stretch * t) at most ``min_prod`` (the least
    share can only make it smaller: :func:`edge_gaps` drops the point either way)."""
    tmin = 1.0
    for pp, qq in ((-rdx, px - x0), (rdx, x1 - px), (-rdy, py - y0), (rdy, y1 - py)):
        if pp > 0.0:
            tmin = min(tmin, qq / pp)
    if min_prod > 0.0 and stretch * (stretch * max(tmin, 0.0)) <= min_prod:
        return max(tmin, 0.0)
    seg = np.empty((2, 2))
    seg[0, 0], seg[0, 1], seg[1, 0], seg[1, 1] = px, py, px + rdx, py + rdy
    wx0, wx1, wy0, wy1, cy0, cy1 = _window(seg, y0, sy, g, 0.0)
    for cy in range(cy0, cy1 + 1):
        cx0, cx1 = _row_cells(seg, 0, 2, cy, x0, y0, sx, sy, g, 0.0)
        for cx in range(cx0, cx1 + 1):
            c = cy * g + cx
            for q in range(count[c], count[c + 1]):
                o = members[q]
                if (o == r or bb[o, 0] > wx1 or bb[o, 1] < wx0 or bb[o, 2] > wy1
                        or bb[o, 3] < wy0):  # fmt: skip
                    continue
                t0, t1 = _segment_in(ev, off[o], off[o + 1], px, py, rdx, rdy,
                                     0.0, tmin, 0.0)  # fmt: skip
                if t0 < t1:
                    tmin = t0
                    if (min_prod > 0.0
                            and stretch * (stretch * max(tmin, 0.0)) <= min_prod):  # fmt: skip
                        return max(tmin, 0.0)
    return max(tmin, 0.0)


@njit(cache=True, nogil=True)
def overlaps(vert, off, area_tol):
    """The pairs (i, j), j < i, of the counter-clockwise convex polygons
    vert[off[r]:off[r + 1]] that share more than ``area_tol`` of area, and that
    area: candidates are the polygons bucketed (row by row) into a cell the other
    meets, whose boxes overlap. Hill-valley's (C+, C-) triangle, fold 2: 7,770
    regions in 895,029 pairs that touch (up to 1,362 through one point), 21 that
    overlap; GEOS's tree query and intersections of every touching pair took 17 s.
    Returns (i, j, area)."""
    n = off.shape[0] - 1
    oi, oj, oa = np.empty(16, np.int64), np.empty(16, np.int64), np.empty(16)
    m = 0
    if n < 2:
        return oi[:0], oj[:0], oa[:0]
    bb, _ = _boxes(vert, off)
    x0, x1 = bb[:, 0].min(), bb[:, 1].max()
    y0, y1 = bb[:, 2].min(), bb[:, 3].max()
    g = min(max(int(np.sqrt(n)), 1), 512)
    sx = (x1 - x0) / g if x1 > x0 else 1.0
    sy = (y1 - y0) / g if y1 > y0 else 1.0
    count, members = _bucket(vert, off, bb, x0, y0, sx, sy, g, 0.0)
    stamp = np.full(n, -1, np.int64)
    for i in range(n):
        a, b = off[i], off[i + 1]
        cy0, cy1 = _cell_range(bb[i, 2], bb[i, 3], y0, sy, g)
        for cy in range(cy0, cy1 + 1):
            cx0, cx1 = _row_cells(vert, a, b, cy, x0, y0, sx, sy, g, 0.0)
            for cx in range(cx0, cx1 + 1):
                c = cy * g + cx
                for q in range(count[c], count[c + 1]):
                    o = members[q]
                    if o >= i or stamp[o] == i:
                        continue
                    stamp[o] = i
                    w = min(bb[i, 1], bb[o, 1]) - max(bb[i, 0], bb[o, 0])
                    h = min(bb[i, 3], bb[o, 3]) - max(bb[i, 2], bb[o, 2])
                    if w <= 0.0 or h <= 0.0 or w * h <= area_tol:
                        continue
                    if _apart(vert[a:b], vert[off[o] : off[o + 1]]):
                        continue
                    inter = _intersect(vert[a:b], vert[off[o] : off[o + 1]])
                    if inter.shape[0] < 3:
                        continue
                    shared = area(inter)
                    if shared > area_tol:
                        if m == oi.shape[0]:
                            oi, oj = _grow1(oi, 2 * m), _grow1(oj, 2 * m)
                            oa = _grow1(oa, 2 * m)
                        oi[m], oj[m], oa[m] = i, o, shared
                        m += 1
    return oi[:m].copy(), oj[:m].copy(), oa[:m].copy()


# ------------------------------------------------------------------ invariant cells
@njit(cache=True, nogil=True)
def cover_points(px, py, vert, off, hit):
    """Set hit[i] where the point (px[i], py[i]) lies in or on one of the convex
    polygons vert[off[r]:off[r + 1]] (either orientation): the points bucketed on a
    grid of about one point a cell, each polygon tested against the points of the
    cells its bounding box meets. What the walk's probe points need (are they covered
    by a region already?), without building a GEOS polygon per region and a tree of
    them every round (0.7 s of 4.5 s on breast cancer 450's triangle, fold 0)."""
    m = px.shape[0]
    if m == 0 or off.shape[0] < 2:
        return
    x0, x1, y0, y1 = px.min(), px.max(), py.min(), py.max()
    g = max(1, int(np.sqrt(m)))
    sx = (x1 - x0) / g if x1 > x0 else 1.0
    sy = (y1 - y0) / g if y1 > y0 else 1.0
    count = np.zeros(g * g + 1, np.int64)
    where = np.empty(m, np.int64)
    for i in range(m):
        cx = min(int((px[i] - x0) / sx), g - 1)
        cy = min(int((py[i] - y0) / sy), g - 1)
        where[i] = cy * g + cx
        count[where[i] + 1] += 1
    for c in range(g * g):
        count[c + 1] += count[c]
    order = np.empty(m, np.int64)
    fill = count[:-1].copy()
    for i in range(m):
        order[fill[where[i]]] = i
        fill[where[i]] += 1
    bb, sgn = _boxes(vert, off)  # boxes and orientations
    for r in range(off.shape[0] - 1):
        a, b = off[r], off[r + 1]
        if b - a < 3:
            continue
        bx0, bx1, by0, by1, sign = bb[r, 0], bb[r, 1], bb[r, 2], bb[r, 3], sgn[r]
        if bx1 < x0 or bx0 > x1 or by1 < y0 or by0 > y1:
            continue
        cx0, cx1 = _cell_range(bx0, bx1, x0, sx, g)
        cy0, cy1 = _cell_range(by0, by1, y0, sy, g)
        for cy in range(cy0, cy1 + 1):
            for cx in range(cx0, cx1 + 1):
                c = cy * g + cx
                for q in range(count[c], count[c + 1]):
                    i = order[q]
                    if hit[i]:
                        continue
                    x, y = px[i], py[i]
                    if x < bx0 or x > bx1 or y < by0 or y > by1:
                        continue
                    inside = True
                    for k in range(a, b):
                        k1 = k + 1 if k + 1 < b else a
                        cross = (vert[k1, 0] - vert[k, 0]) * (y - vert[k, 1]) - (
                            vert[k1, 1] - vert[k, 1]
                        ) * (x - vert[k, 0])
                        if sign * cross < 0.0:
                            inside = False
                            break
                    if inside:
                        hit[i] = True


@njit(cache=True, nogil=True)
def cells(vert, off, piece_region, H, y_val, tol):
    """Every convex piece (vert[off[p]:off[p+1]]) of a region split by the sign of
    each validation row's decision numerator h = H[region, v] . (1, p1, p2) (eq.
    15-18): one line per row. Returns the cells' vertices and offsets, their region
    and their counts of false negatives and false positives (a row is predicted
    positive where h > 0)."""
    out = _cells_out(vert.shape[0])
    for p in range(off.shape[0] - 1):
        r = piece_region[p]
        out = _piece_cells(out, vert[off[p] : off[p + 1]], H[r], r, y_val, tol)
    return _cells_done(out)


@njit(cache=True, nogil=True, internal=True)
def _cells_out(n_vert):
    """Empty growing records of cells: (vertices, offsets, region, fn, fp, count)."""
    return (np.empty((max(16, 4 * n_vert), 2)), np.zeros(64 + 1, np.int64),
            np.empty(64, np.int64), np.empty(64, np.int32), np.empty(64, np.int32), 0)  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def _cells_done(out):
    """The records of :func:`_cells_out` cut to their count (copies)."""
    c_vert, c_off, c_reg, c_fn, c_fp, nc = out
    return (c_vert[: c_off[nc]].copy(), c_off[: nc + 1].copy(), c_reg[:nc].copy(),
            c_fn[:nc].copy(), c_fp[:nc].copy())  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def _piece_cells(out, V, Hr, r, y_val, tol):
    """The cells of one convex piece ``V`` of region ``r`` (its validation rows'
    numerators ``Hr`` (n_val, 3)) appended to the records ``out`` (:func:`cells`);
    returns them (new arrays where grown).

    The pieces cut so far are kept as one array of vertices and their offsets, not
    as a list of arrays, and the rows whose lines miss them all are passed over by
    :func:`_next_crossing`."""
    c_vert, c_off, c_reg, c_fn, c_fp, nc = out
    nv = y_val.shape[0]
    pv = np.empty((max(16, 2 * V.shape[0]), 2))
    po = np.zeros(2, np.int64)
    pv = _put_polygon(pv, po, 0, V)
    npc = 1
    v = -1
    while True:
        # most rows' lines miss every piece: nothing new for them
        v = _next_crossing(pv, po, npc, Hr, v + 1, nv, tol)
        if v == nv:
            break
        h0, h1, h2 = Hr[v, 0], Hr[v, 1], Hr[v, 2]
        sc = tol * (max(abs(h0), abs(h1), abs(h2)) + 1e-300)
        nx = np.empty((2 * po[npc] + 4 * npc + 8, 2))  # a cut adds <= 2 vertices
        no = np.zeros(2 * npc + 2, np.int64)
        m = 0
        for q in range(npc):
            a, b = po[q], po[q + 1]
            if not _crossed(pv, a, b, h0, h1, h2, sc):
                nx = _put_polygon(nx, no, m, pv[a:b])
                m += 1
                continue
            lo, hi = _split(pv[a:b], h1, h2, -h0)
            if lo.shape[0] >= 3 and area(lo) > 0:
                nx = _put_polygon(nx, no, m, lo)
                m += 1
            if hi.shape[0] >= 3 and area(hi) > 0:
                nx = _put_polygon(nx, no, m, hi)
                m += 1
        pv, po, npc = nx, no, m
    for q in range(npc):
        W = pv[po[q] : po[q + 1]]
        cx, cy = centroid(W)
        fn = fp = 0
        for v in range(nv):
            f = Hr[v, 0] + Hr[v, 1] * cx + Hr[v, 2] * cy
            if y_val[v] > 0 and not f > 0:
                fn += 1
            elif y_val[v] < 0 and f > 0:
                fp += 1
        if nc == c_reg.shape[0]:
            c_reg = _grow1(c_reg, 2 * nc)
            c_fn = _grow1(c_fn, 2 * nc)
            c_fp = _grow1(c_fp, 2 * nc)
            o = np.zeros(2 * nc + 1, np.int64)
            for k in range(nc + 1):  # loops, not slice copies: see bigrate._jit
                o[k] = c_off[k]
            c_off = o
        c_vert = _put_polygon(c_vert, c_off, nc, W)
        c_reg[nc], c_fn[nc], c_fp[nc] = r, fn, fp
        nc += 1
    return c_vert, c_off, c_reg, c_fn, c_fp, nc


@njit(cache=True, nogil=True, internal=True)
def _next_crossing(pv, po, npc, Hr, v0, nv, tol):
    """The first validation row from ``v0`` to ``nv`` whose line splits one of the
    pieces (pv, po[:npc + 1]) (:func:`_crossed`), or ``nv``: a loop of its own, as the
    caller's loop over the rows took and dropped a reference on each of its arrays
    reassigned in it, a pair of atomic operations a row (~3% of a walk's time)."""
    for v in range(v0, nv):
        h0, h1, h2 = Hr[v, 0], Hr[v, 1], Hr[v, 2]
        sc = tol * (max(abs(h0), abs(h1), abs(h2)) + 1e-300)
        for q in range(npc):
            if _crossed(pv, po[q], po[q + 1], h0, h1, h2, sc):
                return v
    return nv


@njit(cache=True, nogil=True, internal=True, inline="always")
def _crossed(pv, a, b, h0, h1, h2, sc):
    """Whether the line h0 + h1 p1 + h2 p2 = 0 splits the polygon pv[a:b]: vertices
    beyond ``sc`` on both sides."""
    pos = neg = False
    for i in range(a, b):
        hv = h0 + h1 * pv[i, 0] + h2 * pv[i, 1]
        if hv > sc:
            pos = True
        elif hv < -sc:
            neg = True
    return pos and neg


# ------------------------------------------------------------------ folds' best point
@njit(cache=True, nogil=True, internal=True)
def _bbox(V):
    return V[:, 0].min(), V[:, 1].min(), V[:, 0].max(), V[:, 1].max()


@njit(cache=True, nogil=True, internal=True)
def _apart(P, C):
    """Whether the line of an edge of C or of P (both counter-clockwise convex) has
    every vertex of the other on its outer side or on it, and every vertex of its own
    polygon on its inner side or on it: then P n C lies on that line (no area), and
    :func:`_intersect` would return no polygon, or one whose vertices lie within a
    rounding of it. Without allocating, where the cells of a fan all meeting at one
    point (hill-valley's (C+, C-) triangle) overlap in their boxes but not in their
    polygons (they touch at the fan's apex): most of the intersections tried there.
    An edge's own polygon is checked only once the other lies outside its line: a
    repeated vertex (no line) or an edge a rounding long (a line in any direction)
    separates nothing."""
    for Y, Z in ((C, P), (P, C)):
        k = Y.shape[0]
        for i in range(k):
            i1 = i + 1 if i + 1 < k else 0
            a1 = Y[i1, 1] - Y[i, 1]
            a2 = -(Y[i1, 0] - Y[i, 0])
            c = a1 * Y[i, 0] + a2 * Y[i, 1]  # as _intersect's inequalities
            out = True
            for j in range(Z.shape[0]):
                if a1 * Z[j, 0] + a2 * Z[j, 1] - c < 0:
                    out = False
                    break
            if not out:
                continue
            for j in range(k):
                if a1 * Y[j, 0] + a2 * Y[j, 1] - c > 0:
                    out = False
                    break
            if out and (a1 != 0.0 or a2 != 0.0):
                return True
    return False


@njit(cache=True, nogil=True, internal=True)
def _intersect(P, C):
    """Convex P n convex C (both counter-clockwise): P clipped by C's edges."""
    k = C.shape[0]
    ineq = np.empty((k, 5))
    for i in range(k):
        i1 = i + 1 if i + 1 < k else 0
        a1 = C[i1, 1] - C[i, 1]
        a2 = -(C[i1, 0] - C[i, 0])
        ineq[i, 0], ineq[i, 1], ineq[i, 2] = a1, a2, a1 * C[i, 0] + a2 * C[i, 1]
    return clip(P, np.full(P.shape[0], -1, np.int64), ineq, 0.0)[0]


@njit(cache=True, nogil=True)
def best_point(vert, off, fold_start, fn, fp, cost_fn, cost_fp, bounds, piece_tol):
    """The least K-fold sum of cost_fn * FN + cost_fp * FP over the parameter domain
    (each fold's cells, fold k = cells fold_start[k]:fold_start[k+1], partition it),
    by branch-and-bound: depth k intersects a cell of fold k with the piece built so
    far, the cells of each fold taken in increasing error, a branch dropped once its
    error plus a lower bound on every later fold's error exceeds the best found (the
    least error of its cells whose boxes meet blocks of buckets around the piece's
    box: on hill-valley's 364 CV rows, costs (1, 1), the rectangle's search 6.4 ->
    0.4 s). Among the pieces (intersections of one cell per fold, convex, area >
    ``piece_tol``) with the least error, the largest. Returns (error, FN, FP,
    vertices of the piece, number of intersections tried)."""
    K = fold_start.shape[0] - 1
    ncell = off.shape[0] - 1
    err = np.empty(ncell)
    for c in range(ncell):
        err[c] = cost_fn * fn[c] + cost_fp * fp[c]
    lb = np.zeros(K + 1)  # least error of folds k.. K-1
    for k in range(K - 1, -1, -1):
        lo = np.inf
        for c in range(fold_start[k], fold_start[k + 1]):
            lo = min(lo, err[c])
        lb[k] = lb[k + 1] + lo
    # a G x G grid of buckets per fold over the domain's bounds, each holding the
    # cells whose bounding box meets it
    G = 64
    x0, y0, x1, y1 = bounds[0], bounds[1], bounds[2], bounds[3]
    sx, sy = G / max(x1 - x0, 1e-300), G / max(y1 - y0, 1e-300)
    bb = np.empty((ncell, 4))
    for c in range(ncell):
        bb[c, 0], bb[c, 1], bb[c, 2], bb[c, 3] = _bbox(vert[off[c] : off[c + 1]])
    # the cells with a vertex at the domain's corner (x0, y0) (hill-valley's (C+, C-)
    # triangle: a fan of ~1,300 a fold meeting at the origin, whose boxes all meet
    # the corner's bucket) are listed by their angle about it instead
    th, apex = _angles(vert, off, x0, y0, max(x1 - x0, y1 - y0))
    ast = np.zeros(K + 1, np.int64)
    for k in range(K):
        ast[k + 1] = ast[k]
        for c in range(fold_start[k], fold_start[k + 1]):
            ast[k + 1] += apex[c]
    acell = np.empty(ast[K], np.int64)
    for k in range(K):
        m = ast[k]
        for c in range(fold_start[k], fold_start[k + 1]):
            if apex[c]:
                acell[m] = c
                m += 1
        seg = acell[ast[k] : ast[k + 1]]
        o = np.argsort(th[seg, 0], kind="mergesort")
        srt = seg[o]
        for i in range(srt.shape[0]):  # a loop, not a slice copy: see bigrate._jit
            acell[ast[k] + i] = srt[i]
    # by the least angle, with the largest greatest angle so far (a scan down from
    # the last cell starting before a piece's greatest angle stops there)
    amax = np.empty(ast[K])
    for k in range(K):
        hi = -np.inf
        for i in range(ast[k], ast[k + 1]):
            hi = max(hi, th[acell[i], 1])
            amax[i] = hi
    cnt = np.zeros(K * G * G + 1, np.int64)
    for k in range(K):
        for c in range(fold_start[k], fold_start[k + 1]):
            if apex[c]:
                continue
            i0, j0, i1, j1 = _cells_of(bb[c], x0, y0, sx, sy, G)
            for i in range(i0, i1 + 1):
                for j in range(j0, j1 + 1):
                    cnt[k * G * G + i * G + j + 1] += 1
    bstart = np.cumsum(cnt)
    fill = bstart[:-1].copy()
    bucket = np.empty(bstart[-1], np.int64)
    for k in range(K):
        for c in range(fold_start[k], fold_start[k + 1]):
            if apex[c]:
                continue
            i0, j0, i1, j1 = _cells_of(bb[c], x0, y0, sx, sy, G)
            for i in range(i0, i1 + 1):
                for j in range(j0, j1 + 1):
                    b = k * G * G + i * G + j
                    bucket[fill[b]] = c
                    fill[b] += 1
    # per fold, the least error of the cells in each bucket, and in each block of
    # 2^l x 2^l buckets (levels l = 0, 1, ..., L): a lower bound on a later fold's
    # error within a piece, from at most 2 x 2 blocks of the level its box spans
    L = 0
    while (1 << L) < G:
        L += 1
    mins = np.full((K, L + 1, G, G), np.inf)
    for k in range(K):
        for c in range(fold_start[k], fold_start[k + 1]):
            i0, j0, i1, j1 = _cells_of(bb[c], x0, y0, sx, sy, G)
            for i in range(i0, i1 + 1):
                for j in range(j0, j1 + 1):
                    mins[k, 0, i, j] = min(mins[k, 0, i, j], err[c])
        for lv in range(1, L + 1):
            for i in range(G >> lv):
                for j in range(G >> lv):
                    b = mins[k, lv - 1]
                    mins[k, lv, i, j] = min(
                        min(b[2 * i, 2 * j], b[2 * i + 1, 2 * j]),
                        min(b[2 * i, 2 * j + 1], b[2 * i + 1, 2 * j + 1]),
                    )
    loc = lb.copy()  # lb's local counterpart below the piece of each depth
    stamp = np.full(ncell, -1, np.int64)
    nquery = 0
    # depth-first search with explicit stacks
    cand = np.empty((K, ncell), np.int64)
    ncand = np.zeros(K, np.int64)
    pos = np.zeros(K, np.int64)
    psum = np.zeros(K + 1)
    sfn = np.zeros(K + 1, np.int64)
    sfp = np.zeros(K + 1, np.int64)
    pieces = [vert[0:0].copy() for _ in range(K + 1)]
    order0 = np.argsort(err[fold_start[0] : fold_start[1]], kind="mergesort")
    for i in range(order0.shape[0]):
        cand[0, i] = fold_start[0] + order0[i]
    ncand[0] = order0.shape[0]
    best, best_area = np.inf, -1.0
    best_fn = best_fp = 0
    best_piece = vert[0:0].copy()
    tried = 0
    k = 0
    while k >= 0:
        if pos[k] >= ncand[k]:
            k -= 1
            continue
        c = cand[k, pos[k]]
        pos[k] += 1
        total = psum[k] + err[c]
        eps = 1e-9 * max(1.0, abs(best)) if best < np.inf else 0.0
        if total + loc[k + 1] > best + eps:
            pos[k] = ncand[k]  # the rest of this level is no better
            continue
        C = vert[off[c] : off[c + 1]]
        tried += 1
        if k > 0 and _apart(pieces[k], C):
            continue
        P = C.copy() if k == 0 else _intersect(pieces[k], C)
        if P.shape[0] < 3:
            continue
        A = area(P)
        if A <= piece_tol:
            continue
        if k == K - 1:
            if total < best - eps or A > best_area:
                if total < best - eps:
                    best = total
                best_area, best_piece = A, P
                best_fn, best_fp = sfn[k] + fn[c], sfp[k] + fp[c]
            continue
        pieces[k + 1] = P
        psum[k + 1] = total
        sfn[k + 1], sfp[k + 1] = sfn[k] + fn[c], sfp[k] + fp[c]
        k += 1
        # the cells of fold k whose bounding boxes meet the piece's, by error
        nquery += 1
        px0, py0, px1, py1 = _bbox(P)
        i0, j0, i1, j1 = _cells_of(np.array([px0, py0, px1, py1]), x0, y0, sx, sy, G)
        lv = 0
        while (i1 >> lv) - (i0 >> lv) > 1 or (j1 >> lv) - (j0 >> lv) > 1:
            lv += 1
        loc[K] = 0.0
        for f in range(K - 1, k, -1):
            lo = np.inf
            for i in range(i0 >> lv, (i1 >> lv) + 1):
                for j in range(j0 >> lv, (j1 >> lv) + 1):
                    lo = min(lo, mins[f, lv, i, j])
            loc[f] = loc[f + 1] + max(lo, lb[f] - lb[f + 1])
        m = 0
        for i in range(i0, i1 + 1):
            for j in range(j0, j1 + 1):
                b = k * G * G + i * G + j
                for t in range(bstart[b], bstart[b + 1]):
                    q = bucket[t]
                    if stamp[q] == nquery:
                        continue
                    stamp[q] = nquery
                    if (bb[q, 0] > px1 or bb[q, 2] < px0 or bb[q, 1] > py1
                            or bb[q, 3] < py0):  # fmt: skip
                        continue
                    if psum[k] + err[q] + loc[k + 1] > best + eps:
                        continue
                    cand[k, m] = q
                    m += 1
        # the corner's cells whose angles overlap the piece's (a cell the piece
        # shares area with has a point at an angle of both)
        f0, f1 = _angle_range(P, x0, y0, max(x1 - x0, y1 - y0))
        lo, hi = ast[k], ast[k + 1]
        while lo < hi:  # the first starting beyond the piece's greatest angle
            mid = (lo + hi) // 2
            if th[acell[mid], 0] > f1 + ANGLE_PAD:
                hi = mid
            else:
                lo = mid + 1
        for t in range(lo - 1, ast[k] - 1, -1):
            if amax[t] < f0 - ANGLE_PAD:
                break
            q = acell[t]
            if th[q, 1] < f0 - ANGLE_PAD:
                continue
            if (bb[q, 0] > px1 or bb[q, 2] < px0 or bb[q, 1] > py1
                    or bb[q, 3] < py0):  # fmt: skip
                continue
            if psum[k] + err[q] + loc[k + 1] > best + eps:
                continue
            cand[k, m] = q
            m += 1
        if m > 1:
            o = np.argsort(err[cand[k, :m]], kind="mergesort")
            srt = cand[k, :m][o]
            for i in range(m):  # a loop, not a slice copy: see bigrate._jit
                cand[k, i] = srt[i]
        ncand[k] = m
        pos[k] = 0
    return best, best_fn, best_fp, best_piece, tried


# radians added on either side of a cell's angles about the domain's corner
# (best_point): what the rounding of vertices (~1e-16 of the domain) can move the
# angle of a point a piece of area PIECE_TOL must have beyond ~1e-6 of the corner
ANGLE_PAD = 1e-9


@njit(cache=True, nogil=True, internal=True)
def _angle_range(V, ax, ay, side):
    """The least and greatest angle about (ax, ay) of the convex polygon V, which
    lies in the quadrant x >= ax, y >= ay (a vertex a rounding outside is taken on
    its side): those of its vertices, but one at the corner (within 1e-12 of
    ``side``: no angle). Returns (0, pi / 2) where every vertex is there."""
    lo, hi = np.inf, -np.inf
    for i in range(V.shape[0]):
        dx, dy = max(V[i, 0] - ax, 0.0), max(V[i, 1] - ay, 0.0)
        if dx <= 1e-12 * side and dy <= 1e-12 * side:
            continue
        t = np.arctan2(dy, dx)
        lo, hi = min(lo, t), max(hi, t)
    if lo > hi:
        return 0.0, 0.5 * np.pi
    return lo, hi


@njit(cache=True, nogil=True, internal=True)
def _angles(vert, off, ax, ay, side):
    """Each cell's angles about the corner (ax, ay) (:func:`_angle_range`), and
    whether it has a vertex there."""
    n = off.shape[0] - 1
    th = np.empty((n, 2))
    apex = np.zeros(n, np.int64)
    for c in range(n):
        V = vert[off[c] : off[c + 1]]
        th[c, 0], th[c, 1] = _angle_range(V, ax, ay, side)
        for i in range(V.shape[0]):
            if (abs(V[i, 0] - ax) <= 1e-12 * side
                    and abs(V[i, 1] - ay) <= 1e-12 * side):  # fmt: skip
                apex[c] = 1
    return th, apex


@njit(cache=True, nogil=True, internal=True)
def _cells_of(b, x0, y0, sx, sy, G):
    i0 = min(max(int((b[0] - x0) * sx), 0), G - 1)
    i1 = min(max(int((b[2] - x0) * sx), 0), G - 1)
    j0 = min(max(int((b[1] - y0) * sy), 0), G - 1)
    j1 = min(max(int((b[3] - y0) * sy), 0), G - 1)
    return i0, j0, i1, j1
