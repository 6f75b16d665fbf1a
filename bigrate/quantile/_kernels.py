"""Numba kernels of the quantile-SVM dual path (Yu et al. 2009, Alg. 1 "DPF").

Scaled dual: with beta = alpha * n / 2 the boxes are 0 <= beta_i <= ub_i(tau), where
ub_i = 1 - tau for y_i = +1 and tau for y_i = -1 (so d ub_i / d tau = -y_i), and with
kappa = 2 / (n lambda):

    D(beta) = kappa/2 beta^T Q beta - sum(beta),   w = kappa sum_i beta_i y_i x_i,
    g_i = dD/dbeta_i = y_i x_i^T w - 1.

Sets: R (beta = 0, g > 0), M (g = 0), L (beta = ub, g < 0). Within a segment the
direction solves Q_MM dbeta_M = y_M * (X_M s_L) with s_L = sum_{j in L} x_j (conjugate
gradients on Q v = Y X (X^T Y v), Q never formed), and dw/dtau = kappa (X_M^T (y dbeta)
- s_L), so dg_i/dtau = y_i x_i^T dw/dtau for every i outside M.

The data tuple is ``X = (indptr, indices, data, y)``; the mutable path state and the
growable output buffers are tuples described at :func:`dpf_run`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from bigrate.solvers.cg import cg_solve, gram_matvec
from bigrate.solvers.cholesky import (
    chol_append,
    chol_finish_row,
    chol_remove,
    chol_solve,
)
from bigrate.solvers.dual_cd import box_cd
from bigrate.solvers.least_squares import (
    factor_lsq,
    min_norm_lsq,
    nnls,
    row_space,
)
from bigrate.solvers.sparse_rows import row_axpy, row_dot

# set codes
R_SET, M_SET, L_SET = 0, 1, 2

# the primal route's unbounded columns count as independent (a Cholesky factor of
# their Gram matrix instead of an eigendecomposition of A_U A_U^T) while every
# pivot is above this share of its diagonal: each column at least 1e-4 of its norm
# away from the span of the others
PRIMAL_REL_PIVOT = 1e-8

# status codes of dpf_run
DONE = 0  # tau reached 1
CHUNK = 1  # max_kinks recorded in this call; call again
BUFFER_FULL = 2  # grow the output buffers and call again
STALLED = 3  # too many zero-length steps at one tau (a degenerate cycle)
NOT_FINITE = 4  # a non-finite value appeared in the state
PLATEAU = 5  # dw/dtau is ~0: check whether w stays optimal up to tau = 1


@njit(cache=True, nogil=True)
def upper_bound(y_i, s_i, tau):
    """Box of a (merged) example of weight s_i: s_i (1 - tau) if positive, s_i tau if
    negative; its derivative in tau is -y_i s_i."""
    return s_i * (1.0 - tau) if y_i > 0 else s_i * tau


@njit(cache=True, nogil=True)
def dcd_solve(X, sqn, kappa, tau, beta, w, tol, max_epochs, seed):
    """The dual at ``tau`` over every coordinate (in place on beta and w, where w must
    equal kappa sum beta y x on entry). Returns (status, epochs, violation)."""
    y, sw = X[3], X[4]
    n = len(y)
    lo = np.zeros(n)
    hi = np.empty(n)
    for i in range(n):
        hi[i] = upper_bound(y[i], sw[i], tau)
    return box_cd(
        X, np.arange(n), n, np.ones(n), lo, hi, beta, w, sqn, kappa, tol,
        max_epochs, seed,
    )  # fmt: skip


@njit(cache=True, nogil=True)
def primal_from_sets(X, state, beta, tau, kappa, w, s_l):
    """w = kappa (sum_M beta y x + sum_L ub(tau) y x) and s_L = sum_L x, from scratch."""
    indptr, indices, data, y, sw = X
    w[:] = 0.0
    s_l[:] = 0.0
    for i in range(len(y)):
        if state[i] == M_SET:
            row_axpy(indptr, indices, data, i, kappa * beta[i] * y[i], w)
        elif state[i] == L_SET:
            row_axpy(
                indptr,
                indices,
                data,
                i,
                kappa * upper_bound(y[i], sw[i], tau) * y[i],
                w,
            )
            row_axpy(indptr, indices, data, i, sw[i], s_l)


@njit(cache=True, nogil=True, inline="always")
def _lsum_row(X, lsum, i, sign):
    """Add sign sw_i x_i to the error set's running sum of its class (lsum rows 0-1:
    positives, 2-3: negatives, each a sum and its rounding error, Neumaier's
    compensated summation): the sums stay within a rounding unit of a sum from
    scratch however many rows enter and leave L."""
    indptr, indices, data, y, sw = X
    r = 0 if y[i] > 0 else 2
    a = sign * sw[i]
    for p in range(indptr[i], indptr[i + 1]):
        j = indices[p]
        v = a * data[p]
        h = lsum[r, j]
        t = h + v
        if abs(h) >= abs(v):
            lsum[r + 1, j] += (h - t) + v
        else:
            lsum[r + 1, j] += (v - t) + h
        lsum[r, j] = t


@njit(cache=True, nogil=True)
def primal_from_lsum(X, S, tau, kappa):
    """w = kappa (sum_M beta y x + (1 - tau) P - tau N) and s_L = P + N, with P and N
    the error set's running sums of sw x by class (S[11], :func:`_lsum_row`): since
    ub(tau) y x is sw (1 - tau) x for a positive and -sw tau x for a negative, only
    the margin rows are read, O(nnz(M)) where a sum over L from scratch reads most of
    X (a9a: 2.3 ns a non-zero over all rows, 9% of the path)."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    lsum = S[11]
    for j in range(len(w)):
        pj = lsum[0, j] + lsum[1, j]
        nj = lsum[2, j] + lsum[3, j]
        w[j] = kappa * ((1.0 - tau) * pj - tau * nj)
        s_l[j] = pj + nj
    for k in range(int(scal[1])):
        i = mlist[k]
        row_axpy(indptr, indices, data, i, kappa * beta[i] * y[i], w)


@njit(cache=True, nogil=True)
def lsum_from_sets(X, state, lsum):
    """The error set's sums by class (see :func:`_lsum_row`) from scratch."""
    lsum[:] = 0.0
    for i in range(len(state)):
        if state[i] == L_SET:
            _lsum_row(X, lsum, i, 1.0)


@njit(cache=True, nogil=True)
def gradient_all(X, w, g):
    indptr, indices, data, y, sw = X
    for i in range(len(y)):
        g[i] = y[i] * row_dot(indptr, indices, data, i, w) - 1.0


@njit(cache=True, nogil=True)
def resolve_margin(
    X, sqn, state, beta, tau, kappa, w, s_l, g, mlist, m, z, lo, hi, tol, max_epochs
):
    """The KKT drift recovery: re-solve the dual over the margin multipliers beta_M
    (L and R held at their bounds) by coordinate descent, then rebuild w and every
    gradient exactly. Returns the epochs used."""
    y, sw = X[3], X[4]
    primal_from_sets(X, state, beta, tau, kappa, w, s_l)
    for k in range(m):
        i = mlist[k]
        z[k] = beta[i]
        lo[k] = 0.0
        hi[k] = upper_bound(y[i], sw[i], tau)
    _, epochs, _ = box_cd(
        X, mlist, m, np.ones(m), lo, hi, z, w, sqn, kappa, tol, max_epochs, 1
    )
    for k in range(m):
        beta[mlist[k]] = z[k]
    primal_from_sets(X, state, beta, tau, kappa, w, s_l)
    gradient_all(X, w, g)
    return epochs


@njit(cache=True, nogil=True)
def _record_beta(msorted, m, beta, out, start):
    """beta_M by increasing index (msorted: M's indices in that order)."""
    for k in range(m):
        out[start + k] = beta[msorted[k]]


@njit(cache=True, nogil=True)
def _merge_sorted(msorted, m_old, ev, ne, state):
    """M's indices in increasing order after a kink's events: those of msorted[:m_old]
    still in M, merged with the events' indices that joined M (ev[:ne], increasing;
    compacted in place) from the back. O(m + events), where sorting M at every kink
    was 4% of the a9a path (and shifting at every event, O(m) each, far more: rows
    leave a margin set of up to 19,000 by the hundred at one tau)."""
    mk = 0
    for k in range(m_old):
        i = msorted[k]
        if state[i] == M_SET:
            msorted[mk] = i
            mk += 1
    nj = 0
    for e in range(ne):
        if state[ev[e]] == M_SET:
            ev[nj] = ev[e]
            nj += 1
    a, b = mk - 1, nj - 1
    for t in range(mk + nj - 1, -1, -1):
        if b < 0:
            break
        if a >= 0 and msorted[a] > ev[b]:
            msorted[t] = msorted[a]
            a -= 1
        else:
            msorted[t] = ev[b]
            b -= 1


@njit(cache=True, nogil=True)
def _unbounded_factor(X, ML, m, kind, KU, gen, max_calls, d, ucol):
    """The Cholesky factor of the Gram matrix of the unbounded margin columns y x
    (kind 0), kept between primal directions in KU = (L[d, d], slots int64[d], meta
    int64[3], spos int64[n]) like the Gram route's (:func:`_kept_free_factor`):
    columns that left U are removed (Givens rotations) and new ones appended, each
    O(nl nnz + nl^2), where forming it anew costs nl^2 nnz / 2 + nl^3 / 6 (~0.18 ms
    at a9a's ~100 unbounded columns). Its rows are keyed by the entries of ML (the
    margin rows' copy's slots); meta = (lines, calls since formed, the copy's
    generation it was formed in): it is formed anew every max_calls calls (0: at
    every call) and whenever the copy was formed anew. ucol receives the
    positions of its lines' columns. Returns the number of columns, or -1 where
    they are numerically dependent (a pivot below PRIMAL_REL_PIVOT of its
    diagonal) or more than d."""
    indptr, indices, data, y, sw = X
    L, rows, meta, spos = KU
    nl = int(meta[0])
    if meta[2] != gen or meta[1] >= max_calls:
        nl = 0
        meta[1] = 0
        meta[2] = gen
    meta[1] += 1
    for k in range(m):
        spos[ML[k]] = k
    have = np.zeros(m, np.bool_)
    nl = _kept_lines(L, rows, nl, spos, ML, m, kind, ucol, have)
    tmp = np.zeros(d)
    for k in range(m):
        if kind[k] != 0 or have[k]:
            continue
        if nl >= d:
            meta[0] = 0
            return -1
        i = ML[k]
        sq = 0.0
        for p1 in range(indptr[i], indptr[i + 1]):
            tmp[indices[p1]] = data[p1]
            sq += data[p1] * data[p1]
        for j in range(nl):
            r = rows[j]
            L[nl, j] = y[i] * y[r] * row_dot(indptr, indices, data, r, tmp)
        for p1 in range(indptr[i], indptr[i + 1]):
            tmp[indices[p1]] = 0.0
        if not chol_finish_row(L, nl, sq, PRIMAL_REL_PIVOT):
            meta[0] = 0
            return -1
        rows[nl] = i
        ucol[nl] = k
        nl += 1
    meta[0] = nl
    return nl


@njit(cache=True, nogil=True)
def _direction_dense(
    X, mlist, m, kind, s_l, d, W, F, rank_rtol, xnorm, hscale, aa, KU, gen, kept
):  # fmt: skip
    """The direction's box QP in the d-dimensional primal, for a margin set larger
    than the features can hold apart.

    With A = [y_i x_i]_{i in M} (d x |M|) the QP of :func:`_direction` is the bounded
    least-squares problem  min ||A a - s_L||  (a = d beta_M / d tau; a_k >= 0 where
    kind_k = 1, beta_k = 0; a_k <= h_k = -y_k s_k where kind_k = 2, beta_k = ub_k).
    Its residual, hence dw/dtau = kappa (A a - s_L), is unique even when a is not.
    The unbounded columns U are projected out (through the Cholesky factor of their
    Gram matrix where they are independent, :func:`_unbounded_factor`: KU, kept
    between calls whose mlist entries are the margin rows' copy's slots of copy
    generation gen and formed anew every kept calls, else the eigenvectors of A_U
    A_U^T, :func:`row_space`), the bounded ones solved as a non-negative least
    squares on what remains (Lawson-Hanson), then a_U is the minimum-norm
    least-squares fit of the rest. No
    iteration count depends on the conditioning of Q_MM, which is singular as soon
    as |M| > rank. xnorm holds the rows' 2-norms. Returns the active-set steps: NNLS
    iterations + 1 when any multiplier sits at a bound, 0 otherwise, and whether the
    unbounded columns were dependent (the eigendecomposition). hscale scales
    the upper bounds' rates h (1 here; 0 for a repair of beta, where a multiplier at
    its upper bound may only move down: :func:`_lsq_repair`). aa receives A a, as
    s_L minus the least-squares residual of the unbounded columns' fit (with the
    target t = s_L - sum_(kind 2) h y x, A a = A_U a_U + C z + (s_L - t)): O(|U|
    nnz) where summing A a over M reads every margin row (~5,000 at a9a's primal
    kinks)."""
    indptr, indices, data, y, sw = X
    x = W[5]
    pin = F[1]
    nu, nb = 0, 0
    for k in range(m):
        if kind[k] == 0:
            nu += 1
        else:
            nb += 1
    ucol = np.zeros(nu, np.int64)
    bcol = np.zeros(nb, np.int64)
    ib = 0
    for k in range(m):
        if kind[k] != 0:
            bcol[ib] = k
            ib += 1
    # bounded columns as z >= 0: a = z (kind 1, column y x) or a = h - z (kind 2,
    # column -y x, and h y x moves to the target)
    t = s_l.copy()
    brow = np.zeros(nb, np.int64)
    bsgn = np.zeros(nb)
    scale = 0.0
    for q in range(nb):
        i = mlist[bcol[q]]
        brow[q] = i
        bsgn[q] = y[i] if kind[bcol[q]] == 1 else -y[i]
        scale = max(scale, xnorm[i])
        if kind[bcol[q]] == 2 and hscale != 0.0:
            # t -= h y x, h = -hscale y sw
            row_axpy(indptr, indices, data, i, hscale * sw[i], t)
    # the unbounded columns' span: a Cholesky factor of their Gram matrix where they
    # are independent (every primal direction of the whole a9a path), else the
    # eigendecomposition of A_U A_U^T with its rank cut
    chol = nu > 0 and _unbounded_factor(X, mlist, m, kind, KU, gen, kept, d, ucol) >= 0
    L = KU[0]
    if nu > 0 and not chol:
        iu = 0
        for k in range(m):
            if kind[k] == 0:
                ucol[iu] = k
                iu += 1
    urow = np.zeros(nu, np.int64)
    usgn = np.zeros(nu)
    for q in range(nu):
        urow[q] = mlist[ucol[q]]
        usgn[q] = y[urow[q]]
    first, V, lam = d, np.zeros((d, d)), np.zeros(0)
    if nu > 0 and not chol:
        first, V, lam = row_space(X, mlist, ucol, nu, d, rank_rtol)
    none = np.zeros((0, 0))
    if chol:
        first = d - nu  # dimension of the complement of range(A_U)
        R = (none, L, urow, usgn)
    elif nu > 0:
        R = (np.ascontiguousarray(V[:, :first]), L, urow[:0], usgn[:0])
    else:
        R = (none, L, urow, usgn)  # no unbounded columns: nothing to project out
    z = np.zeros(nb)
    it = 0
    if nb > 0 and first > 0:
        tol = 1e-12 * max(scale, 1.0) * max(np.sqrt(np.sum(t**2)), 1e-300)
        z, it = nnls(X, brow, bsgn, nb, R, t, tol, 10 * nb + 50)
    # the unbounded multipliers: the minimum-norm fit of what the bounded ones leave
    rest = t.copy()
    for q in range(nb):
        if z[q] != 0.0:
            row_axpy(indptr, indices, data, brow[q], -bsgn[q] * z[q], rest)
    if nu > 0:
        au = np.empty(nu)
        if chol:
            factor_lsq(X, R, rest, au)
        else:
            min_norm_lsq(X, mlist, ucol, nu, rest, V, first, lam, au)
        for q in range(nu):
            x[ucol[q]] = au[q]
            row_axpy(indptr, indices, data, urow[q], -usgn[q] * au[q], rest)
    for j in range(d):
        aa[j] = s_l[j] - rest[j]
    for q in range(nb):
        k = bcol[q]
        i = mlist[k]
        x[k] = z[q] if kind[k] == 1 else -hscale * y[i] * sw[i] - z[q]
    for k in range(m):
        pin[k] = 0
    for q in range(nb):
        if z[q] == 0.0:
            pin[bcol[q]] = kind[bcol[q]]
    return (it + 1 if nb > 0 else 0), nu > 0 and not chol


@njit(cache=True, nogil=True)
def _gram(X, mlist, m, s_l, tmp, G, gm, b):
    """G[:m, :m] = Q_MM (dense, from the sparse rows) and b = y_M (X_M s_L); tmp is a
    zeroed d-vector, left zeroed. G is kept between calls: gm[k] is the row whose
    entries position k holds, and only the positions whose row changed since (an
    event moves one or two rows in or out of M) are recomputed, O(m nnz) each, where
    rebuilding all of Q_MM costs m^2 nnz / 2. Positions at or past m are marked
    stale on the way out, so two positions both marked current were always paired."""
    indptr, indices, data, y, sw = X
    for k in range(m):
        if gm[k] == mlist[k]:
            continue
        i = mlist[k]
        for q in range(indptr[i], indptr[i + 1]):
            tmp[indices[q]] = data[q]
        for j in range(m):
            if j == k or gm[j] == mlist[j]:
                # stale positions after this one get their entry when recomputed
                v = y[i] * y[mlist[j]] * row_dot(indptr, indices, data, mlist[j], tmp)
                G[k, j] = v
                G[j, k] = v
        for q in range(indptr[i], indptr[i + 1]):
            tmp[indices[q]] = 0.0
        gm[k] = i
    # positions past M were not paired with the ones just recomputed: stale
    for k in range(m, len(gm)):
        gm[k] = -1
    for k in range(m):
        i = mlist[k]
        b[k] = y[i] * row_dot(indptr, indices, data, i, s_l)


@njit(cache=True, nogil=True, inline="always")
def _kept_lines(L, rows, nl, pos, keys, m, kind, out, have):
    """The lines of a kept Cholesky factor (L, with each line's key in rows[:nl])
    whose key is no longer at a kind-0 position of M leave it (from the last: the
    lines after one removed have been looked at already); pos maps a key to its
    position, keys a position to its key. The positions of the lines left go to
    out and are marked in have. Returns how many lines are left."""
    j = nl - 1
    while j >= 0:
        key = rows[j]
        p = pos[key]
        if p < 0 or p >= m or keys[p] != key or kind[p] != 0:
            chol_remove(L, nl, j)
            for q in range(j + 1, nl):
                rows[q - 1] = rows[q]
            nl -= 1
        j -= 1
    for j in range(nl):
        p = pos[rows[j]]
        out[j] = p
        have[p] = True
    return nl


@njit(cache=True, nogil=True)
def _kept_free_factor(G, mlist, m, mpos, kind, KF, free, rel_pivot, max_calls):
    """Bring the Cholesky factor kept between kinks, KF = (L, rows, meta), to the
    margin multipliers inside their boxes (kind 0) at this kink, and their positions
    in G into free. The factor is of the Gram matrix of rows (not of positions in M,
    which an event reshuffles), so a kink that moves one row in or out of M or onto
    a bound costs one removal (Givens rotations, O(nf^2)) or one appended row
    (O(nf^2)) instead of a factorisation (nf^3 / 6: ~290 us at nf = 124). meta =
    (rows in the factor, calls since it was formed); it is formed anew every
    max_calls calls (0: at every call), which bounds the rounding the updates
    accumulate. Returns the number of free multipliers, or -1 if their Gram matrix
    is numerically singular."""
    Lf, rows, meta = KF
    nl = int(meta[0])
    if meta[1] >= max_calls:
        nl = 0
        meta[1] = 0
    meta[1] += 1
    have = np.zeros(m, np.bool_)
    nl = _kept_lines(Lf, rows, nl, mpos, mlist, m, kind, free, have)
    for k in range(m):
        if kind[k] == 0 and not have[k]:
            if not chol_append(G, free, nl, k, Lf, rel_pivot):
                meta[0] = nl
                return -1
            free[nl] = k
            rows[nl] = mlist[k]
            nl += 1
    meta[0] = nl
    return nl


@njit(cache=True, nogil=True)
def _box_qp_from(G, b, m, kind, h, x, pin, rel_pivot, L, free, nf):
    """min 1/2 a^T G a - b^T a with a_k >= 0 (kind 1), a_k <= h_k (kind 2), free
    (kind 0), for a positive definite G: a primal active set (Lawson-Hanson's, with
    two kinds of bound) whose every step is a solve with the Cholesky factor of the
    free part. L (m x m, lower) is the factor of G[free[:nf], free[:nf]], the kind-0
    positions in any order; free is worked on, and so are L's rows from nf on:
    its first nf rows are left as they were, since only bounded variables are
    released (appended below them) and pinned again (removed: the rotations touch
    the rows after the one removed). So the path passes its kept factor itself
    (copying it at every direction was 5% of the a9a path). The bounded variables start pinned
    at their bound; the most violated pinned one is released, and a released one
    that would cross its bound is stepped back to it and pinned again. The factor
    is updated: a release appends a row, a pin removes one (O(nf^2) each, where
    refactorising costs nf^3 / 6: 35 us at nf = 64, 290 us at 124, and an a9a path
    takes ~3.6 steps per kink). Returns (ok, steps); ok = False if G is numerically
    singular on a free part (the caller then solves in the primal)."""
    rhs = np.empty(m)
    sol = np.empty(m)
    for k in range(m):
        pin[k] = kind[k]
        x[k] = 0.0 if kind[k] != 2 else h[k]
    scale = 0.0
    for k in range(m):
        scale = max(scale, abs(b[k]))
    gtol = 1e-12 * max(scale, 1e-300)
    steps = 0
    while steps <= 3 * m + 20:
        for j in range(nf):
            v = b[free[j]]
            for k in range(m):
                if pin[k] != 0:
                    v -= G[free[j], k] * x[k]
            rhs[j] = v
        if nf > 0:
            chol_solve(L, nf, rhs, sol)
        step, jmin = 1.0, -1
        for j in range(nf):
            k = free[j]
            if kind[k] == 1 and sol[j] < 0.0:
                a = x[k] / (x[k] - sol[j])
            elif kind[k] == 2 and sol[j] > h[k]:
                a = (h[k] - x[k]) / (sol[j] - x[k])
            else:
                continue
            if a < step:
                step, jmin = a, j
        for j in range(nf):
            k = free[j]
            x[k] += step * (sol[j] - x[k])
        if jmin >= 0:
            k = free[jmin]
            pin[k] = kind[k]
            x[k] = 0.0 if kind[k] == 1 else h[k]
            chol_remove(L, nf, jmin)
            for j in range(jmin + 1, nf):
                free[j - 1] = free[j]
            nf -= 1
            steps += 1
            continue
        # optimal on the free part: release the pinned bound pulling hardest inside
        worst, kw = gtol, -1
        for k in range(m):
            if pin[k] != 0:
                gk = -b[k]
                for j in range(m):
                    gk += G[k, j] * x[j]
                v = -gk if pin[k] == 1 else gk
                if v > worst:
                    worst, kw = v, k
        if kw < 0:
            for k in range(m):
                if kind[k] != 0:  # bounds were in play: the caller checks the pins
                    return True, steps + 1
            return True, steps
        if not chol_append(G, free, nf, kw, L, rel_pivot):
            return False, steps
        pin[kw] = 0
        free[nf] = kw
        nf += 1
        steps += 1
    return False, steps


@njit(cache=True, nogil=True)
def _direction_cg(X, mlist, m, kind, s_l, dbeta, W, F, cg_rtol, cg_factor):
    """Conjugate gradients on Q_MM dbeta = rhs = y_M (X_M s_L) first (the paper's
    step). If that sends a multiplier sitting at a bound out of its box (a degenerate
    vertex: an index that just joined M, ties, |M| above the rank), the direction
    solves the directional QP  min 1/2 dbeta^T Q_MM dbeta - rhs^T dbeta  with
    dbeta >= 0 where beta = 0 and dbeta <= -y where beta = ub, by an active set over
    those bounds (each step a CG solve on the free part): the paper's zero-length
    pivots done inside one direction, so ties cannot cycle. Returns (CG iterations,
    active-set steps)."""
    indptr, indices, data, y, sw = X
    tmp, r, p, q, b, x, u, dg, cand, sortbuf, _, lo, hi, crate = W
    fl, pin, rhs, xf = F[0], F[1], F[2], F[3]
    cgmax = int(cg_factor * m) + 50
    for k in range(m):
        i = mlist[k]
        b[k] = y[i] * row_dot(indptr, indices, data, i, s_l)
        x[k] = dbeta[i]
        lo[k] = 0.0 if kind[k] & 1 else -np.inf
        hi[k] = -y[i] * sw[i] if kind[k] & 2 else np.inf
        pin[k] = 0
    it = 0
    if m > 0:
        it, _ = cg_solve(X, mlist, m, b, x, tmp, r, p, q, cg_rtol, cgmax)
    steps = 0
    while True:
        # the worst box violation among free multipliers at a bound
        worst, kw = 1e-9, -1
        for k in range(m):
            if pin[k] == 0:
                v = max(lo[k] - x[k], x[k] - hi[k])
                if v > worst:
                    worst, kw = v, k
        if kw < 0:
            # free part feasible: release a pinned bound whose gradient pulls inside
            gram_matvec(X, mlist, m, x, tmp, q)
            worst, kw = 1e-9 * max(1.0, np.abs(b[:m]).max() if m > 0 else 1.0), -1
            for k in range(m):
                if pin[k] != 0:
                    gk = q[k] - b[k]
                    v = -gk if pin[k] == 1 else gk
                    if v > worst:
                        worst, kw = v, k
            if kw < 0:
                break
            pin[kw] = 0
        else:
            pin[kw] = 1 if x[kw] < lo[kw] else 2
            x[kw] = lo[kw] if pin[kw] == 1 else hi[kw]
        steps += 1
        if steps > 4 * m + 20:
            break
        # CG on the free multipliers with the pinned ones held at their bounds
        nf = 0
        for k in range(m):
            if pin[k] == 0:
                fl[nf] = mlist[k]
                sortbuf[nf] = k
                nf += 1
            else:
                row_axpy(indptr, indices, data, mlist[k], y[mlist[k]] * x[k], tmp)
        for j in range(nf):
            k = sortbuf[j]
            i = mlist[k]
            rhs[j] = b[k] - y[i] * row_dot(indptr, indices, data, i, tmp)
            xf[j] = x[k]
        for k in range(m):
            if pin[k] != 0:
                i = mlist[k]
                for t in range(indptr[i], indptr[i + 1]):
                    tmp[indices[t]] = 0.0
        if nf > 0:
            it2, _ = cg_solve(X, fl, nf, rhs, xf, tmp, r, p, q, cg_rtol, cgmax)
            it += it2
        for j in range(nf):
            x[sortbuf[j]] = xf[j]
    return it, steps


@njit(cache=True, nogil=True)
def _bound_kinds(y, sw, mlist, m, beta, tau, btol, kind):
    """kind[k] of each margin multiplier: 0 inside its box, 1 at 0 (may only grow),
    2 at ub (may only follow ub's rate -y s), 3 both (ub = 0). True if any is 3."""
    two_sided = False
    for k in range(m):
        i = mlist[k]
        kind[k] = 0
        if beta[i] <= btol:
            kind[k] |= 1
        if upper_bound(y[i], sw[i], tau) - beta[i] <= btol:
            kind[k] |= 2
        two_sided = two_sided or kind[k] == 3
    return two_sided


@njit(cache=True, nogil=True)
def _direction(
    X, mlist, mpos, m, beta, tau, s_l, dbeta, W, F, cg_rtol, cg_factor, btol,
    dense_max_d, gram_max_m, xnorm, kept_calls, XM, ML, xnm, compact,
):  # fmt: skip
    """d beta_M / d tau into x[:m], and v = sum_M y dbeta x into u.

    The direction is a boxed QP: multipliers sitting at a bound may only move
    inwards. With many features it is solved by conjugate gradients inside an
    active set (:func:`_direction_cg`, the paper's step). With few (d <=
    dense_max_d) it is solved exactly with dense linear algebra, where CG to a 1e-11
    residual costs many sweeps and, once |M| exceeds the rank, runs on a singular
    Q_MM: for |M| <= min(d, gram_max_m) by a primal active set over Cholesky
    factorisations of the Gram matrix Q_MM (:func:`_box_qp_from`; the factor of
    the free multipliers is kept between kinks, :func:`_kept_free_factor`, and
    formed anew every kept_calls directions), and when that is singular or |M| is
    larger, in the d-dimensional primal (:func:`_direction_dense`). A multiplier
    boxed from both sides (ub = 0, only at tau = 0 or 1) takes the CG route, which
    keeps both bounds. Returns (CG
    iterations, active-set steps, route) with route 0 = CG, 1 = Gram, 2 = primal
    (3: primal with dependent unbounded columns). The primal route reads the
    margin rows from XM at ML's entries, with their norms in xnm (X, mlist and
    xnorm, or with compact the margin rows' copy: :func:`_margin_copy`)."""
    indptr, indices, data, y, sw = X
    tmp, b, x, u, kind = W[0], W[4], W[5], W[6], W[10]
    pin = F[1]
    d = len(u)
    two_sided = _bound_kinds(y, sw, mlist, m, beta, tau, btol, kind)
    it, steps, route = 0, 0, 0
    if d <= dense_max_d and m > 0 and not two_sided:
        route = 1
        solved = False
        Gc, gm = F[4], F[5]
        if m <= d and m <= gram_max_m and m <= len(gm):
            h = np.empty(m)
            for k in range(m):
                h[k] = -y[mlist[k]] * sw[mlist[k]]
            _gram(X, mlist, m, s_l, tmp, Gc, gm, b)
            free = np.empty(m, np.int64)
            nf = _kept_free_factor(
                Gc, mlist, m, mpos, kind, F[6:9], free, 1e-10, kept_calls
            )
            if nf >= 0:
                solved, steps = _box_qp_from(
                    Gc, b, m, kind, h, x, pin, 1e-10, F[6], free, nf
                )
        if not solved:
            # the unbounded columns' factor is kept while ML holds the margin rows'
            # copy's slots (compact; formed anew at every call otherwise)
            gen = F[16][2] if compact else -1
            steps, dependent = _direction_dense(
                XM, ML, m, kind, s_l, d, W, F, 1e-11, xnm, 1.0, u, F[17:21], gen,
                kept_calls if compact else 0,
            )  # fmt: skip
            route = 3 if dependent else 2
    else:
        it, steps = _direction_cg(
            X, mlist, m, kind, s_l, dbeta, W, F, cg_rtol, cg_factor
        )
    if route < 2:
        u[:] = 0.0
        for k in range(m):
            i = mlist[k]
            row_axpy(indptr, indices, data, i, y[i] * x[k], u)
    return it, steps, route


# the most kinks between refreshes while the margin set's drift cannot be repaired
# by a Newton step (Q_MM singular or too large)
UNREPAIRED_REFRESH = 10
# ... and the most drift on the margin gradients that may wait for that refresh
UNREPAIRED_DRIFT = 1e-9

# the candidate list's scalars (the array ``vs`` of dpf_run)
V_NCAND = 0  # rows in the list
V_RADIUS = 1  # the skin: the list is exact while ||w - wref||_2 <= radius
V_SINCE = 2  # advances since the last rebuild
V_DRIFT = 3  # how far w moves per advance (smoothed), 0 before it is measured
V_VALID = 4  # 0: the list (and the gradients outside it) must be rebuilt first
V_MODE = 5  # 1: candidate list, 0: full scan (the list holds every row)
V_RMIN = 6  # the smallest radius the next rebuild may choose
V_NMID = 7  # rows in the middle list
V_R2 = 8  # its radius around w2 (0: none yet)
V_NSLOTS = 10
# the middle list's radius in list radii (see :func:`_rebuild`)
MIDDLE_RADIUS = 4.0


@njit(cache=True, nogil=True)
def _lsq_repair(X, S, W, F, kappa, tau, xnorm, btol):
    """Repair the margin multipliers' KKT drift in the d-dimensional primal, for any
    |M|, also above the rank, where Q_MM is singular and the Newton step of
    :func:`_newton_repair` does not exist.

    With A = [y_k x_k]_{k in M} and exact gradients g_M = A^T w - 1 in g, the
    smallest change of w within range(A) that zeroes them is dw = -(A^T)^+ g_M =
    -U L^-1 U^T (A g_M), U and L the eigenvectors and eigenvalues of A A^T above the
    rank cut (:func:`row_space`). The multipliers follow as the bounded
    least-squares fit A dbeta = dw / kappa in which one at 0 may only grow and one at
    its upper bound only shrink (:func:`_direction_dense` with that target). beta_M
    is updated and clipped to its box; the caller recomputes w and the gradients and
    checks them. O(sum_M nnz^2 + d^3) and the bounded fit, where coordinate descent
    to 1e-11 takes tens of sweeps over M (8.8 ms a repair on all of a9a). False,
    with nothing changed, where M is empty or a multiplier is boxed from both
    sides."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    x, kind = W[5], W[10]
    m = int(scal[1])
    d = len(w)
    if m == 0 or _bound_kinds(y, sw, mlist, m, beta, tau, btol, kind):
        return False
    ag = np.zeros(d)
    for k in range(m):
        i = mlist[k]
        row_axpy(indptr, indices, data, i, y[i] * g[i], ag)
    cols = np.arange(m)
    first, V, lam = row_space(X, mlist, cols, m, d, 1e-11)
    if first == d:
        return False
    U = np.ascontiguousarray(V[:, first:])
    t = U @ ((U.T @ ag) / lam)
    for j in range(d):
        t[j] = -t[j] / kappa
    _direction_dense(
        X, mlist, m, kind, t, d, W, F, 1e-11, xnorm, 0.0, np.empty(d), F[17:21], -1, 0
    )  # fmt: skip
    for k in range(m):
        i = mlist[k]
        beta[i] = min(max(beta[i] + x[k], 0.0), upper_bound(y[i], sw[i], tau))
    return True


@njit(cache=True, nogil=True)
def _exact_from_sets(X, S, kappa, tau):
    """w, s_L and the margin rows' gradients from the sets and beta (the error set
    through its running sums); returns their largest magnitude (the KKT drift: 0 at
    the optimum). The other rows' gradients are the next rebuild's
    (:func:`_rebuild`)."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    primal_from_lsum(X, S, tau, kappa)
    drift = 0.0
    for k in range(int(scal[1])):
        i = mlist[k]
        g[i] = y[i] * row_dot(indptr, indices, data, i, w) - 1.0
        drift = max(drift, abs(g[i]))
    return drift


@njit(cache=True, nogil=True)
def _refresh(
    X, S, W, F, kappa, tau, eps_tie, drift_tol, cnt, diag, xnorm, dense, full
):  # fmt: skip
    """Exact w, s_L and every gradient from the sets and beta (with full, the error
    set's running sums from scratch first: where the sets changed outside dpf_run,
    at the start and after a plateau's programme); the margin multipliers
    are re-solved if their gradients drifted further than drift_tol from 0: with
    dense (d small enough for dense directions) by up to two least-squares repairs
    (:func:`_lsq_repair`), by coordinate descent over M, from the multipliers as
    they were, where those do not bring the drift under drift_tol. False if w is not
    finite."""
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    x, lo, hi = W[5], W[11], W[12]
    m = int(scal[1])
    cnt[6] += 1
    if full:
        lsum_from_sets(X, state, S[11])
    drift = _exact_from_sets(X, S, kappa, tau)
    diag[0] = max(diag[0], drift)
    if drift > drift_tol:
        kept = np.empty(m)
        for k in range(m):
            kept[k] = beta[mlist[k]]
        rounds = 0
        while dense and drift > drift_tol and rounds < 2:
            if not _lsq_repair(X, S, W, F, kappa, tau, xnorm, 1e-9):
                break
            rounds += 1
            drift = _exact_from_sets(X, S, kappa, tau)
        if drift > drift_tol:
            # from the multipliers as they were: a repair that fell short can leave
            # a state coordinate descent takes many more sweeps to settle
            for k in range(m):
                beta[mlist[k]] = kept[k]
            cnt[8] += resolve_margin(
                X, sqn, state, beta, tau, kappa, w, s_l, g, mlist, m, x, lo, hi,
                eps_tie, 100000,
            )  # fmt: skip
            cnt[14] += 1
        else:
            cnt[13] += 1
        cnt[4] += 1
    for k in range(m):
        g[mlist[k]] = 0.0
    for j in range(len(w)):
        if not np.isfinite(w[j]):
            return False
    return True


@njit(cache=True, nogil=True)
def _margin_drift(X, mlist, m, w, gm_out):
    """The margin rows' gradients g_k = y x . w - 1 into gm_out[:m]; returns their
    largest magnitude (the KKT drift: 0 on M at the optimum)."""
    indptr, indices, data, y, sw = X
    drift = 0.0
    for k in range(m):
        i = mlist[k]
        gm_out[k] = y[i] * row_dot(indptr, indices, data, i, w) - 1.0
        drift = max(drift, abs(gm_out[k]))
    return drift


@njit(cache=True, nogil=True)
def _newton_repair(X, S, W, F, kappa, tau, gram_max_m):
    """Repair the margin multipliers' KKT drift by one exact Newton step: the
    gradients on M move by kappa Q_MM dbeta_M, so dbeta_M = -(kappa Q_MM)^-1 g_M
    (from the Cholesky factor of the Gram matrix kept between kinks), w follows, and
    nothing outside M is read: O(|M|^3 / 6 + |M| nnz) where a refresh with
    coordinate descent reads every row several times. Expects g_M in W[5][:m] (from
    :func:`_margin_drift`). False, with nothing changed, when Q_MM is too large for
    the Gram route or numerically singular (|M| above the rank): the caller then
    refreshes."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    tmp, gres, b = W[0], W[5], W[4]
    G, gm = F[4], F[5]
    m = int(scal[1])
    d = len(w)
    if m == 0 or m > d or m > gram_max_m or m > len(gm):
        return False
    _gram(X, mlist, m, s_l, tmp, G, gm, b)
    free = np.arange(m)
    L = np.empty((m, m))
    for k in range(m):
        if not chol_append(G, free, k, k, L, 1e-10):
            return False
    rhs = np.empty(m)
    for k in range(m):
        rhs[k] = -gres[k] / kappa
    delta = np.empty(m)
    chol_solve(L, m, rhs, delta)
    for k in range(m):
        i = mlist[k]
        nb = min(max(beta[i] + delta[k], 0.0), upper_bound(y[i], sw[i], tau))
        row_axpy(indptr, indices, data, i, kappa * (nb - beta[i]) * y[i], w)
        beta[i] = nb
    return True


@njit(cache=True, nogil=True)
def _rebuild(X, state, g, w, gtol, V, vs, max_since, rebuild_cost, cnt):
    """The candidate list (a Verlet list) at w, with the exact gradients of the rows
    it is chosen from; counts full rebuilds in cnt[16] and the rows whose gradient
    was computed in cnt[17].

    A row outside M has an event (its gradient reaches 0) or a tie (|g| <= gtol) at
    some w' only if |g_i(w)| - gtol <= |y_i x_i . (w' - w)| <= ||x_i|| ||w' - w||. So
    with wref = w and a radius r, every row with |g_i| - gtol > ||x_i|| r can be left
    out as long as the path keeps ||w - wref|| <= r, which dpf_run checks at the far
    end of every segment (the norm is convex, so the whole segment is then inside).
    r is chosen from the drift of w per advance measured since the last rebuild:
    the radius covering K advances that minimises (list length + rebuild_cost x
    rows read / K), K in half-octave steps up to max_since. Mode 0 (full scan) takes
    r = inf. (A second radius in the max-norm, with ||x_i||_1, was tried: on a9a w
    moves on few features at a time, ||dw||_inf / ||dw||_2 ~ 0.34, and it never cut
    the list.) The listed rows are copied into a compact CSR block (cptr, cind,
    cdat), in list order: the rates x_i . u of every kink read them there, from a
    few hundred KB instead of rows scattered over all of X (a9a: 28 -> 15 ns a
    row).

    The same bound one level up: a full rebuild (every row's gradient) also keeps
    w2 = w and the middle list of the rows within R2 = MIDDLE_RADIUS r of it (and,
    added by dpf_run, every row that leaves M later). While ||w - w2|| + r <= R2, a
    row outside it cannot come within r of an event, so the next rebuilds compute
    the gradients of the middle list only, as long as the radius they choose fits:
    r <= R2 - ||w - w2||; one whose radius does not is redone in full. Gradients
    outside the middle list stay those of w2. All of a9a: the rows read by
    rebuilds 2,637 x n -> ~20% of that, the path 16.5 -> 14.8 s."""
    indptr, indices, data, y = X[0], X[1], X[2], X[3]
    clist, cflag, wref, rat, xnorm = V[:5]
    mid, mflag, w2 = V[8], V[9], V[10]
    n = len(g)
    d = len(w)
    nc = int(vs[V_NCAND])
    for c in range(nc):
        cflag[clist[c]] = 0
    since = vs[V_SINCE]
    if since > 0 and vs[V_VALID] > 0:
        dist = 0.0
        for j in range(d):
            dist += (w[j] - wref[j]) ** 2
        v_new = np.sqrt(dist) / since
        if v_new > 0.0:
            v_old = vs[V_DRIFT]
            vs[V_DRIFT] = v_new if v_old <= 0.0 else np.sqrt(v_old * v_new)
    for j in range(d):
        wref[j] = w[j]
    v = vs[V_DRIFT]
    computed = 0
    # one from the middle list (the most r may be then: cap), or a full rebuild
    cap = np.inf
    full = vs[V_MODE] == 0 or vs[V_VALID] == 0 or vs[V_R2] <= 0.0
    if not full:
        dist = 0.0
        for j in range(d):
            dist += (w[j] - w2[j]) ** 2
        cap = vs[V_R2] - np.sqrt(dist)
        full = cap < vs[V_RMIN]
    for _ in range(2):
        nmid = int(vs[V_NMID])
        if full:
            for k in range(nmid):
                mflag[mid[k]] = 0
            nmid = 0
            for i in range(n):
                if state[i] != M_SET:
                    g[i] = y[i] * row_dot(indptr, indices, data, i, w) - 1.0
                    mid[nmid] = i
                    nmid += 1
            cap = np.inf
        else:
            for k in range(nmid):
                i = mid[k]
                if state[i] != M_SET:
                    g[i] = y[i] * row_dot(indptr, indices, data, i, w) - 1.0
        computed += nmid
        hist = np.zeros(64, np.int64)
        for k in range(nmid):
            i = mid[k]
            if state[i] == M_SET:
                rat[i] = np.inf
                continue
            a = abs(g[i]) - gtol
            if a <= 0.0:
                r = 0.0
            elif xnorm[i] > 0.0:
                r = a / xnorm[i]
            else:
                r = np.inf
            rat[i] = r
            if v > 0.0 and r < np.inf:
                q = r / v
                b = 0 if q <= 1.0 else int(np.ceil(2.0 * np.log2(q)))
                if b < 64:
                    hist[b] += 1
        radius = 0.0
        if vs[V_MODE] == 0:
            radius = np.inf
        elif v > 0.0:
            best = np.inf
            cum = 0
            for b in range(64):
                cum += hist[b]
                k_adv = 2.0 ** (0.5 * b)
                if k_adv > max_since:
                    break
                cost = cum + rebuild_cost * nmid / k_adv
                if cost < best:
                    best = cost
                    radius = v * k_adv
        radius = max(radius, vs[V_RMIN])
        if radius <= cap:
            break
        full = True
    vs[V_RMIN] = 0.0
    if full:
        # the middle list: the rows within R2 of w2 = w
        r2 = MIDDLE_RADIUS * radius
        for j in range(d):
            w2[j] = w[j]
        nm = 0
        for k in range(nmid):
            i = mid[k]
            if rat[i] <= r2:
                mid[nm] = i
                mflag[i] = 1
                nm += 1
        nmid = nm
        vs[V_R2] = r2
    vs[V_NMID] = nmid
    nc = 0
    for k in range(nmid):
        i = mid[k]
        if state[i] != M_SET and rat[i] <= radius:
            clist[nc] = i
            cflag[i] = 1
            nc += 1
            _list_row(X, V, nc, i, g[i])
    vs[V_NCAND] = nc
    vs[V_RADIUS] = radius
    vs[V_SINCE] = 0
    vs[V_VALID] = 1
    cnt[17] += computed
    if full:
        cnt[16] += 1


@njit(cache=True, nogil=True)
def _margin_copy(X, mlist, m, F, xnorm):
    """Form the margin rows' copy anew, slot k holding position k's row. The copy is
    F[9:17] = (cptr int64[n+1], cind int64[c], cdat[c], y[n], sw[n], xnorm[n],
    slot int64[n], meta int64[3]): a CSR of slots with each slot's label, weight
    and norm, the slot of each position of M, and meta = (slots used, valid,
    generation: the number of times it was formed). With
    (cptr, cind, cdat, y, sw) in place of X and slot in place of mlist, the kernels
    that read every margin row at a primal kink (the bounded least squares, the
    pinned rows' rates, the drift check) read them in order from one block: on
    a9a's ~5,000 margin rows a pass takes a third of the time it takes through
    X's rows at random."""
    cptr, slot, meta = F[9], F[15], F[16]
    cptr[0] = 0
    for k in range(m):
        _copy_slot(X, F, mlist[k], k, xnorm)
        slot[k] = k
    meta[0] = m
    meta[1] = 1
    meta[2] += 1


@njit(cache=True, nogil=True, inline="always")
def _margin_rows(X, mlist, xnorm, F, want):
    """Where the margin rows are read: (rows, their entries by position, norms) of
    the margin rows' copy where wanted and current, else X, mlist and xnorm."""
    if want and F[16][1] != 0:
        return F[9:14], F[15], F[14]
    return X, mlist, xnorm


@njit(cache=True, nogil=True)
def _margin_copy_add(X, F, i, pos, xnorm):
    """Row i enters M at position pos: appended to the copy as a new slot; where
    the copy is full it is marked stale (formed anew when next needed)."""
    indptr = X[0]
    cptr, cind, slot, meta = F[9], F[10], F[15], F[16]
    if meta[1] == 0:
        return
    sl = meta[0]
    if sl + 1 >= len(cptr) or cptr[sl] + indptr[i + 1] - indptr[i] > len(cind):
        meta[1] = 0
        return
    _copy_slot(X, F, i, sl, xnorm)
    slot[pos] = sl
    meta[0] = sl + 1


@njit(cache=True, nogil=True, inline="always")
def _copy_slot(X, F, i, sl, xnorm):
    """Row i (values, label, weight, norm) into the margin rows' copy as slot sl,
    from cptr[sl] on (which must have room)."""
    indptr, indices, data, y, sw = X
    cptr, cind, cdat, yc, swc, xnc = F[9:15]
    q = cptr[sl]
    for p in range(indptr[i], indptr[i + 1]):
        cind[q] = indices[p]
        cdat[q] = data[p]
        q += 1
    cptr[sl + 1] = q
    yc[sl] = y[i]
    swc[sl] = sw[i]
    xnc[sl] = xnorm[i]


@njit(cache=True, nogil=True, inline="always")
def _list_row(X, V, nc, i, gi):
    """Row i, with its gradient gi, as the candidate list's entry nc - 1: its values
    copied into the compact rows, gi into the list-order gradients."""
    indptr, indices, data = X[0], X[1], X[2]
    cptr, cind, cdat, cg, cpos = V[5], V[6], V[7], V[11], V[15]
    cg[nc - 1] = gi
    cpos[i] = nc - 1
    q = cptr[nc - 1]
    for p in range(indptr[i], indptr[i + 1]):
        cind[q] = indices[p]
        cdat[q] = data[p]
        q += 1
    cptr[nc] = q


@njit(cache=True, nogil=True)
def _events(X, S, W, F, V, vs, u, degenerate, tols3, XM, ML):
    """The first event of the segment from the rows that can have one: the margin
    rows' boxes and the candidate list's gradients. Returns (step, rate of the
    quantity that hits its limit there). The margin rows' values are read from XM
    at the positions' entries in ML (X and mlist, or the margin rows' copy:
    :func:`_margin_copy`)."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    dg, cand, kind, crate = W[7], W[8], W[10], W[13]
    pinned = F[1]
    clist, cptr, cind, cdat = V[0], V[5], V[6], V[7]
    cg, cdg, ccand, ccrate = V[11], V[12], V[13], V[14]
    eps_tie, rate_tol, gtol, dtol = tols3
    tau = scal[0]
    m = int(scal[1])
    nc = int(vs[V_NCAND])
    if degenerate:
        # after a degenerate direction, margin rows whose gradient moves off 0 to
        # the side of the bound they are held at leave now: only rows the active
        # set pinned can (reading every margin row, ~4,700 at a9a's primal-route
        # kinks, was 1.6 s of the whole a9a path's 36 s)
        for k in range(m):
            if pinned[k] != 0:
                sl = ML[k]
                dg[mlist[k]] = XM[3][sl] * row_dot(XM[0], XM[1], XM[2], sl, u)
    step = 1.0 - tau
    rarg = 0.0
    for k in range(m):
        i = mlist[k]
        c = np.inf
        cr = 0.0
        db = dbeta[i]
        ub = upper_bound(y[i], sw[i], tau)
        rate = db + y[i] * sw[i]  # d(beta - ub)/dtau
        kind[i] = L_SET
        if rate > rate_tol:
            c = max(ub - beta[i], 0.0) / rate
            cr = rate
        if db < -rate_tol:
            c0 = max(beta[i], 0.0) / -db
            if c0 < c:
                c = c0
                cr = -db
                kind[i] = R_SET
        pk = pinned[k]
        if degenerate and ((pk == 1 and dg[i] > dtol) or (pk == 2 and dg[i] < -dtol)):
            # held at its bound by the active set and its gradient moves off zero
            # to the side of that bound: it leaves M now (a gradient moving the
            # other way is the QP's rounding: it stays)
            c = 0.0
            cr = 0.0
            kind[i] = R_SET if pk == 1 else L_SET
        cand[i] = c
        crate[i] = cr
        if c < step or (c == step and cr > rarg):
            step = c
            rarg = cr
    # the listed rows: the rate of each gradient and its step in one pass
    for ci in range(nc):
        i = clist[ci]
        s = state[i]
        if s == M_SET:
            continue
        r = y[i] * row_dot(cptr, cind, cdat, ci, u)
        cdg[ci] = r
        gi = cg[ci]
        c = np.inf
        cr = 0.0
        if s == L_SET:
            if r > dtol:
                c = 0.0 if gi > -gtol else -gi / r
                cr = r
        elif r < -dtol:
            c = 0.0 if gi < gtol else gi / -r
            cr = -r
        if c <= eps_tie and tau_left[i] == tau:
            # left M at this very tau a second time: no zero-length re-entry (a
            # degenerate cycle among tied rows). The first re-entry is allowed: where
            # several box events tie, a row can leave M only for the direction that
            # follows to send its gradient across its bound (one-hot rows merged
            # with weights: gap 0.26 on the next segment while it could not)
            c = np.inf
        ccand[ci] = c
        ccrate[ci] = cr
        if c < step or (c == step and cr > rarg):
            step = c
            rarg = cr
    return step, rarg


@njit(cache=True, nogil=True)
def _rerecord(msorted, m, beta, kink_bptr, bstore, cnt):
    """Rewrite the last kink's beta record after a refresh at its tau (same M, beta
    repaired), so that what a recovered solution interpolates is the repaired one."""
    kc = cnt[0]
    if kc > 0 and kink_bptr[kc] - kink_bptr[kc - 1] == m:
        _record_beta(msorted, m, beta, bstore, kink_bptr[kc - 1])


@njit(cache=True, nogil=True)
def dpf_run(X, S, W, F, O, V, vs, kappa, max_kinks, tols):
    """Follow the path from the state S until tau = 1, max_kinks new kinks, or full
    buffers.

    S = (state int8[n], beta[n], g[n], w[d], s_l[d], mlist int64[n], mpos int64[n],
         dbeta[n] (last direction, per index), tau_left[n] (tau at which an index last
         left M: tau + 2 the first time at that tau, -2 - tau once it came back at
         tau, tau the second time), scal[4] = (tau, |M|, zero steps at this tau, tau of the last plateau
         check), sqn[n], lsum[4, d] (the error set's sums of sw x by class with
         their rounding errors, :func:`_lsum_row`; formed at every refresh with
         V_VALID = 0 and kept by the events between), msorted int64[n] (M's indices
         in increasing order, the order of the beta records; likewise formed and
         kept)).
    W = (tmp[d], r[n], p[n], q[n], b[n], x[n], u[d], dg[n], cand[n], sortbuf int64[n],
         kind int8[n] (where an M index goes at its event), lo[n], hi[n], crate[n]
         (the rate of the quantity that reaches its limit at cand)).
    F = (free list int64[n], pinned int8[n], rhs[n], x_free[n], G[c, c], gm int64[c],
         Lk[c, c], krows int64[c], kmeta int64[2], margin rows' copy (8 arrays),
         the unbounded columns' kept factor (4 arrays))
        active-set work, the Gram matrix of M kept between kinks (gm: the row of
        each position, -1 at first; see :func:`_gram`), the Cholesky factor of
        its free part (krows: the row of each of its lines; kmeta = (lines, calls
        since formed), zeros at first; see :func:`_kept_free_factor`; the box QP
        works below its lines, :func:`_box_qp_from`), then the margin rows' copy
        F[9:17] (:func:`_margin_copy`; arrays of length 0 without dense
        directions), formed at the first primal kink of a call and kept by the
        events, and the Cholesky factor of the unbounded columns of the primal
        route F[17:21] (:func:`_unbounded_factor`).
    O = (kink_tau[K], kink_bptr int64[K+1], bstore[B], kink_cptr int64[K+1],
         cidx int64[C], cto int8[C], cnt int64[19], diag[4]) with cnt = (kinks,
         b_used, c_used, CG iterations, recoveries, zero steps, refreshes,
         degenerate directions, active-set steps, directions solved in the primal,
         rows examined for events, rebuilds because a segment left the radius,
         radius regrowths, refresh repairs by least squares, refresh repairs by
         coordinate descent, refreshes brought forward by drift at a kink, full
         rebuilds of the list, rows whose gradient rebuilds computed, primal
         directions whose unbounded columns were dependent) and diag =
         (largest KKT drift on M, -, -, -).
    V = (clist int64[n], cflag int8[n], wref[d], rat[n], xnorm[n], cptr int64[n+1],
        cind[nnz], cdat[nnz], mid int64[n], mflag int8[n], w2[d], cg[n], cdg[n],
        ccand[n], ccrate[n], cpos int64[n]): the candidate list (see
        :func:`_rebuild`), its flags, the w it was built at, work, the rows'
        2-norms, the listed rows' copy in list order (CSR, cptr[0] = 0), the middle
        list, its flags and the w of its full rebuild, and by list entry: the
        gradient, its rate, the step to the entry's event and the rate there, and
        each listed row's entry. vs[V_NSLOTS] holds the lists' scalars (V_*
        slots). Between rebuilds the listed rows' gradients are those in cg (g has
        them as of the last rebuild), and the gradients of rows outside M and the
        list are not kept current.
    tols = (event tie tolerance in tau, CG relative tolerance, drift threshold on g_M,
            rate tolerance, refresh period in advances, CG max iterations per |M|,
            the largest d for dense directions (0: always CG), the largest |M| for
            the Gram route, the cost of a rebuild of the list in row evaluations
            per row: see :func:`_rebuild`), the directions between factorisations
            of the kept Cholesky factor (see :func:`_kept_free_factor`).

    Each rebuild of the list is a refresh: w, s_L and every gradient are recomputed
    exactly and margin drift is repaired; one happens at least every refresh period,
    and whenever the next segment would leave the list's radius.
    """
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:11]
    lsum, msorted = S[11], S[12]
    tmp, r, p, q, b, x, u, dg, cand, sortbuf, kind, lo, hi, crate = W
    kink_tau, kink_bptr, bstore, kink_cptr, cidx, cto, cnt, diag = O
    clist, cflag, wref, rat, xnorm = V[:5]
    mid, mflag = V[8], V[9]
    cg, cdg, ccand, ccrate, cpos = V[11:16]
    eps_tie, cg_rtol, drift_tol, rate_tol, refresh_f, cg_factor, dense_d, gram_m = tols[
        :8
    ]
    rebuild_cost = tols[8]
    kept_calls = int(tols[9])
    refresh_every = int(refresh_f)
    btol = 1e-9
    gtol = 100.0 * drift_tol  # gradients this close to 0 are ties
    vtol = 0.1 * drift_tol  # how far a tie may move a value when it is snapped
    n = len(y)
    d = len(w)
    xnmax = 0.0
    for i in range(n):
        xnmax = max(xnmax, xnorm[i])
    dense = 0 < d <= int(dense_d)
    new_kinks = 0
    mcopy = F[9:17]
    mcmeta = mcopy[7]
    # the sets may have changed since the last call: the margin rows' copy is
    # formed anew when a primal kink needs it
    mcmeta[1] = 0
    while True:
        tau = scal[0]
        m = int(scal[1])
        if tau >= 1.0:
            return DONE
        if new_kinks >= max_kinks:
            return CHUNK
        kc = cnt[0]
        if (
            kc + 2 > len(kink_tau)
            or cnt[1] + n > len(bstore)
            or cnt[2] + 2 * n > len(cidx)
        ):
            return BUFFER_FULL
        if vs[V_VALID] == 0:
            # M may have changed outside (a plateau's programme): its sorted copy
            msorted[:m] = np.sort(mlist[:m])
            if not _refresh(
                X, S, W, F, kappa, tau, eps_tie, drift_tol, cnt, diag, xnorm, dense,
                True,
            ):  # fmt: skip
                return NOT_FINITE
            _rebuild(X, state, g, w, gtol, V, vs, refresh_every, rebuild_cost, cnt)
            _rerecord(msorted, m, beta, kink_bptr, bstore, cnt)
        # 1. the direction on M; above the rank the margin rows are read from
        # their copy (formed anew if stale)
        big = dense and m > d and len(mcopy[6]) == n
        if big and mcmeta[1] == 0:
            _margin_copy(X, mlist, m, F, xnorm)
        XM, ML, xnm = _margin_rows(X, mlist, xnorm, F, big)
        it, steps, route = _direction(
            X, mlist, mpos, m, beta, tau, s_l, dbeta, W, F, cg_rtol, cg_factor, btol,
            int(dense_d), int(gram_m), xnorm, kept_calls, XM, ML, xnm, big,
        )  # fmt: skip
        degenerate = steps > 0
        cnt[3] += it
        cnt[8] += steps
        if route >= 2:
            cnt[9] += 1
        if route == 3:
            cnt[18] += 1
        if degenerate:
            cnt[7] += 1
        # 2. u = dw/dtau = kappa (X_M^T (y dbeta) - s_L)
        for j in range(d):
            u[j] = kappa * (u[j] - s_l[j])
        for k in range(m):
            dbeta[mlist[k]] = x[k]
        un, sn, u2 = 0.0, 0.0, 0.0
        for j in range(d):
            un = max(un, abs(u[j]))
            sn = max(sn, kappa * abs(s_l[j]))
            u2 += u[j] * u[j]
        if un <= 1e-6 * sn and scal[3] != tau and m > d:
            if vs[V_SINCE] > 0:
                # the plateau's programme starts from this kink's beta: refresh and
                # repair it first (drift left there stays on the whole plateau)
                vs[V_VALID] = 0
                continue
            scal[3] = tau
            return PLATEAU
        unorm = np.sqrt(u2)
        # rounding in a rate x_i . u grows with |x_i| |u|
        dtol = rate_tol + 1e-13 * xnmax * unorm
        # 3. events: N -> M from the gradients, M -> L / R from the boxes
        tols3 = (eps_tie, rate_tol, gtol, dtol)
        step, rarg = _events(X, S, W, F, V, vs, u, degenerate, tols3, XM, ML)
        cnt[10] += m + int(vs[V_NCAND])
        if vs[V_MODE] != 0:
            # the list is exact only while w stays within its radius of wref: check
            # the segment's far end (tie band included)
            ext = step + eps_tie
            dist = 0.0
            for j in range(d):
                dist += (w[j] + ext * u[j] - wref[j]) ** 2
            if np.sqrt(dist) > vs[V_RADIUS]:
                if vs[V_SINCE] == 0:
                    # gradients are exact at w = wref: widen the list to this
                    # segment (a longer step than the drift measured so far)
                    vs[V_RMIN] = 2.0 * ext * unorm
                    _rebuild(
                        X, state, g, w, gtol, V, vs, refresh_every, rebuild_cost, cnt
                    )
                    cnt[12] += 1
                    step, rarg = _events(
                        X, S, W, F, V, vs, u, degenerate, tols3, XM, ML
                    )
                    cnt[10] += m + int(vs[V_NCAND])
                else:
                    # refresh there and solve this segment again
                    cnt[11] += 1
                    if not _refresh(
                        X, S, W, F, kappa, tau, eps_tie, drift_tol, cnt, diag, xnorm,
                        dense, False,
                    ):  # fmt: skip
                        return NOT_FINITE
                    _rebuild(
                        X, state, g, w, gtol, V, vs, refresh_every, rebuild_cost, cnt
                    )
                    _rerecord(msorted, m, beta, kink_bptr, bstore, cnt)
                    continue
        # 4. advance. A step within the tie tolerance in tau is a zero step only if
        # nothing would move by more than vtol over it: a degenerate direction can
        # have multipliers changing at rates of 1e4 and more, where snapping a 1e-11
        # step to zero leaves their values 1e-7 off (KKT drift). The step to the end
        # of the path is never snapped: with tau one rounding unit below 1 and no
        # event left, a zero step would be taken again and again (a stall the
        # scikit-learn checks' tied 20-row data reached)
        if step <= eps_tie and step * rarg <= vtol and step < 1.0 - tau:
            step = 0.0
        new_tau = tau + step
        if new_tau >= 1.0:
            new_tau = 1.0
            step = 1.0 - tau
        for k in range(m):
            i = mlist[k]
            beta[i] += step * dbeta[i]
        for j in range(d):
            w[j] += step * u[j]
        # the list's gradients advance, and the events within the tie tolerance are
        # collected in the same pass (one pass over the list fewer a kink)
        nc = int(vs[V_NCAND])
        lim = step + eps_tie
        collect = new_tau < 1.0
        ne = 0
        if collect:
            for k in range(m):
                i = mlist[k]
                if not (cand[i] > lim or (cand[i] - step) * crate[i] > vtol):
                    sortbuf[ne] = i
                    ne += 1
        for c in range(nc):
            i = clist[c]
            if state[i] != M_SET:
                cg[c] += step * cdg[c]
                if collect and not (
                    ccand[c] > lim or (ccand[c] - step) * ccrate[c] > vtol
                ):
                    sortbuf[ne] = i
                    ne += 1
        scal[0] = new_tau
        # 5. apply every event within the tie tolerance, in index order
        zero = step == 0.0
        if zero:
            cnt[5] += 1
            scal[2] += 1
            if scal[2] > 2 * n + 10:
                return STALLED
            kc -= 1  # same tau: extend the last kink, rewrite its beta record
            cnt[1] = kink_bptr[kc]
        else:
            scal[2] = 0
            kink_tau[kc] = new_tau
            kink_cptr[kc] = cnt[2]
            kink_bptr[kc] = cnt[1]
        c_used = cnt[2]
        if collect:
            ev = sortbuf[:ne]
            ev.sort()
            m_old = m
            for e in range(ne):
                i = ev[e]
                s = state[i]
                if s == M_SET:
                    dest = kind[i]
                    k = mpos[i]
                    last = mlist[m - 1]
                    mlist[k] = last
                    if mcmeta[1] != 0:
                        mcopy[6][k] = mcopy[6][m - 1]
                    mpos[last] = k
                    mpos[i] = -1
                    m -= 1
                    state[i] = dest
                    # may come back once at this tau (tau_left = tau + 2), not
                    # after it came back once already (tau_left = -2 - tau)
                    if tau_left[i] == -2.0 - new_tau:
                        tau_left[i] = new_tau
                    else:
                        tau_left[i] = new_tau + 2.0
                    if dest == L_SET:
                        beta[i] = upper_bound(y[i], sw[i], new_tau)
                        row_axpy(indptr, indices, data, i, sw[i], s_l)
                        _lsum_row(X, lsum, i, 1.0)
                        g[i] = min(g[i], 0.0)
                    else:
                        beta[i] = 0.0
                        g[i] = max(g[i], 0.0)
                    if cflag[i] == 0:
                        clist[nc] = i
                        cflag[i] = 1
                        nc += 1
                        _list_row(X, V, nc, i, g[i])
                    else:
                        cg[cpos[i]] = g[i]
                    if mflag[i] == 0:
                        nmid = int(vs[V_NMID])
                        mid[nmid] = i
                        mflag[i] = 1
                        vs[V_NMID] = nmid + 1
                else:
                    if s == L_SET:
                        row_axpy(indptr, indices, data, i, -sw[i], s_l)
                        _lsum_row(X, lsum, i, -1.0)
                        beta[i] = upper_bound(y[i], sw[i], new_tau)
                    else:
                        beta[i] = 0.0
                    state[i] = M_SET
                    if tau_left[i] == new_tau + 2.0:
                        tau_left[i] = -2.0 - new_tau
                    g[i] = 0.0
                    mlist[m] = i
                    mpos[i] = m
                    _margin_copy_add(X, F, i, m, xnorm)
                    m += 1
                    dbeta[i] = 0.0
                cidx[c_used] = i
                cto[c_used] = state[i]
                c_used += 1
            vs[V_NCAND] = nc
            _merge_sorted(msorted, m_old, ev, ne, state)
        cnt[2] = c_used
        scal[1] = m
        # 6. refresh and rebuild the list: exact w and gradients, drift repaired.
        # Between refreshes, while Q_MM can be factorised, the margin rows' KKT drift
        # is checked at every kink (O(|M| nnz), from the running w) and repaired by
        # a Newton step: the beta recorded below is what a recovered solution
        # interpolates. Where Q_MM is singular (|M| above the rank) the drift waits
        # for a refresh, at most UNREPAIRED_REFRESH kinks away (sooner once it exceeds
        # UNREPAIRED_DRIFT, and at once where a Newton step fell short of
        # drift_tol): refreshing at every
        # such kink made all of a9a 77 s against 47 s, waiting up to refresh_every
        # kinks left a9a 2,000 rows with a duality gap of 6e-9
        vs[V_SINCE] += 1
        unrepaired = m > min(d, gram_m)
        now = False
        XM, ML, xnm = _margin_rows(X, mlist, xnorm, F, dense and m > d)
        if vs[V_SINCE] < refresh_every and new_tau < 1.0:
            drift = _margin_drift(XM, ML, m, w, x)
            diag[0] = max(diag[0], drift)
            if unrepaired:
                # drift waits for the refresh only while it is small
                now = drift > UNREPAIRED_DRIFT
            elif drift > drift_tol:
                if _newton_repair(X, S, W, F, kappa, new_tau, gram_m):
                    cnt[4] += 1
                    # a step that multipliers' boxes cut short leaves the drift
                    # (a9a 8,000 rows: 1e-2 kept, a kink's duality gap 5e-3)
                    now = _margin_drift(XM, ML, m, w, x) > drift_tol
                else:
                    unrepaired = True
                    now = drift > UNREPAIRED_DRIFT
        if now:
            cnt[15] += 1
        since = vs[V_SINCE]
        if (
            now
            or since >= refresh_every
            or (unrepaired and since >= min(refresh_every, UNREPAIRED_REFRESH))
            or new_tau >= 1.0
        ):
            if not _refresh(
                X, S, W, F, kappa, new_tau, eps_tie, drift_tol, cnt, diag, xnorm, dense,
                False,
            ):  # fmt: skip
                return NOT_FINITE
            _rebuild(X, state, g, w, gtol, V, vs, refresh_every, rebuild_cost, cnt)
        # 7. record beta_M (sorted by index) at this kink
        _record_beta(msorted, m, beta, bstore, cnt[1])
        cnt[1] += m
        kink_bptr[kc + 1] = cnt[1]
        kink_cptr[kc + 1] = cnt[2]
        if not zero:
            new_kinks += 1
        cnt[0] = kc + 1


@njit(cache=True, nogil=True)
def replay(state, cidx, cto, start, stop):
    for c in range(start, stop):
        state[cidx[c]] = cto[c]


@njit(cache=True, nogil=True)
def coef_from_state(X, state, beta_m, beta_next, tau, t, kappa, w):
    """w at ``tau`` inside a segment: beta_M = (1 - t) beta_m + t beta_next over the
    M indices in index order, ub(tau) on L."""
    indptr, indices, data, y, sw = X
    w[:] = 0.0
    k = 0
    for i in range(len(y)):
        s = state[i]
        if s == M_SET:
            bi = (1.0 - t) * beta_m[k] + t * beta_next[k]
            row_axpy(indptr, indices, data, i, kappa * bi * y[i], w)
            k += 1
        elif s == L_SET:
            row_axpy(
                indptr,
                indices,
                data,
                i,
                kappa * upper_bound(y[i], sw[i], tau) * y[i],
                w,
            )


@njit(cache=True, nogil=True)
def set_counts(state, cidx, cto, cptr, out):
    """out[s, k] = number of indices in set s after kink k (state is consumed)."""
    c = np.zeros(3, np.int64)
    for i in range(len(state)):
        c[state[i]] += 1
    for k in range(len(cptr) - 1):
        for j in range(cptr[k], cptr[k + 1]):
            i = cidx[j]
            c[state[i]] -= 1
            state[i] = cto[j]
            c[state[i]] += 1
        for s in range(3):
            out[s, k] = c[s]
