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

from bigrate._jit import njit
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

# ---- the path's state, by name -------------------------------------------------
# The state lives in tuples of arrays (numba passes them to every step without
# copying); these names are the positions. n rows (after merging duplicates), d
# columns.

# S, the path's state: where every row is and the dual and primal there
S_STATE = 0  # int8[n]: each row's set, R_SET, M_SET or L_SET
S_BETA = 1  # [n]: the scaled duals beta
S_G = 2  # [n]: the gradients g_i = y_i x_i^T w - 1 (current for M and the list)
S_W = 3  # [d]: w = kappa sum_i beta_i y_i x_i
S_SL = 4  # [d]: s_L = sum over L of sw_i x_i
S_MLIST = 5  # int64[n]: M's rows, first |M| entries
S_MPOS = 6  # int64[n]: each row's position in mlist, -1 outside M
S_DBETA = 7  # [n]: d beta / d tau of the last direction, per row
S_TAU_LEFT = 8  # [n]: when a row last left M (tau + 2 the first time at that tau,
#                 -2 - tau once it came back at tau, tau the second time)
S_AT = 9  # [4]: where the path is, AT_* below
S_SQN = 10  # [n]: the rows' squared norms
S_LSUM = 11  # [4, d]: s_L's sums by class with their rounding errors (_lsum_row),
#              formed at every refresh and kept by the events between
S_MSORTED = 12  # int64[n]: M's rows in increasing order, the beta records' order
S_LEN = 13

# S[S_AT]: where the path is
AT_TAU = 0  # tau
AT_M = 1  # |M|
AT_ZERO_RUN = 2  # zero-length steps taken at this tau
AT_PLATEAU_TAU = 3  # the tau of the last plateau check

# W, a kink's work arrays
W_TMP = 0  # [d]
W_R = 1  # [n]
W_P = 2  # [n]
W_Q = 3  # [n]
W_B = 4  # [n]: the direction's right-hand side
W_X = 5  # [n]: the direction d beta_M / d tau, by position in mlist
W_U = 6  # [d]: d w / d tau
W_DG = 7  # [n]: d g / d tau of the rows whose events are searched
W_CAND = 8  # [n]: each row's step to its event
W_SORTBUF = 9  # int64[n]: the events of a kink
W_KIND = 10  # int8[n]: where an M row goes at its event (L_SET or R_SET)
W_LO = 11  # [n]: box work of the repairs
W_HI = 12  # [n]
W_CRATE = 13  # [n]: the rate of the quantity that reaches its limit at cand
W_LEN = 14

# F, the direction's work and what it keeps between kinks
F_FREE = 0  # int64[n]: the active set's free list
F_PINNED = 1  # int8[n]
F_RHS = 2  # [n]
F_XFREE = 3  # [n]
F_GRAM = 4  # [c, c]: M's Gram matrix kept between kinks (_gram)
F_GRAM_ROWS = 5  # int64[c]: the row of each of its positions, -1 at first
F_KEPT_L = 6  # [c, c]: the Cholesky factor of its free part (_kept_free_factor)
F_KEPT_ROWS = 7  # int64[c]: the row of each of the factor's lines
F_KEPT_META = 8  # int64[2]: (lines, calls since it was formed)
F_MC_PTR = 9  # the margin rows' copy (_margin_copy; empty without dense
F_MC_IND = 10  # directions): formed at the first primal kink of a call and kept by
F_MC_DAT = 11  # the events; CSR rows in M's order, their labels, weights and
F_MC_Y = 12  # norms, each row's slot and (rows, valid, generation)
F_MC_SW = 13
F_MC_XNORM = 14
F_MC_SLOT = 15
F_MC_META = 16
F_U_L = 17  # the primal route's Cholesky factor of the unbounded columns
F_U_SLOTS = 18  # (_unbounded_factor): L, its columns' slots, meta, positions
F_U_META = 19
F_U_POS = 20
F_LEN = 21
# the parts of F that functions take whole
F_KEPT, F_KEPT_END = F_KEPT_L, F_MC_PTR
F_MC, F_MC_END = F_MC_PTR, F_U_L
F_U, F_U_END = F_U_L, F_LEN
# within the margin rows' copy F[F_MC:F_MC_END]: its rows' slots and its meta
MC_SLOT, MC_META = F_MC_SLOT - F_MC, F_MC_META - F_MC

# V, the candidate list (_rebuild): the rows whose events the path looks at, with
# their gradients kept current between rebuilds (g has them as of the last
# rebuild; rows outside M and the list are not kept current); its scalars are the
# V_* slots of vs below
CL_LIST = 0  # int64[n]: the listed rows
CL_FLAG = 1  # int8[n]: listed or not, by row
CL_WREF = 2  # [d]: the w the list was built at
CL_RAT = 3  # [n]: work
CL_XNORM = 4  # [n]: the rows' 2-norms
CL_PTR = 5  # int64[n+1], CL_IND, CL_DAT: the listed rows' copy in list order (CSR)
CL_IND = 6
CL_DAT = 7
CL_MID = 8  # int64[n]: the middle list
CL_MID_FLAG = 9  # int8[n]
CL_W2 = 10  # [d]: the w of the last full rebuild
CL_G = 11  # [n], by list entry: the gradient,
CL_DG = 12  # its rate,
CL_CAND = 13  # the step to the entry's event,
CL_CRATE = 14  # the rate there,
CL_POS = 15  # int64[n], by row: its entry in the list
CL_LEN = 16

# cnt, what the path did (QuantilePathSVC.diagnostics_ reads it)
N_KINKS = 0  # kinks recorded
N_BETA_USED = 1  # entries of the beta records used
N_CHANGES_USED = 2  # entries of the index-change records used
N_CG_ITERATIONS = 3
N_RECOVERIES = 4  # margin drift repaired (Newton steps and refreshes)
N_ZERO_STEPS = 5
N_REFRESHES = 6
N_DEGENERATE = 7  # degenerate directions (an active set was needed)
N_ACTIVE_SET_STEPS = 8
N_PRIMAL_DIRECTIONS = 9  # directions solved in the primal
N_ROWS_EXAMINED = 10  # rows examined for events
N_RADIUS_EXITS = 11  # refreshes because a segment left the list's radius
N_RADIUS_REGROWTHS = 12
N_LSQ_REPAIRS = 13  # refresh repairs by least squares
N_CD_REPAIRS = 14  # refresh repairs by coordinate descent
N_DRIFT_REFRESHES = 15  # refreshes brought forward by drift at a kink
N_FULL_REBUILDS = 16  # full rebuilds of the list
N_ROWS_REBUILT = 17  # rows whose gradient rebuilds computed
N_PRIMAL_DEPENDENT = 18  # primal directions whose unbounded columns were dependent
N_COUNTERS = 19

# tols, the path's tolerances and settings
TOL_TIE = 0  # events closer than this in tau are one
TOL_CG = 1  # CG's relative tolerance
TOL_DRIFT = 2  # the margin drift |g_M| repaired
TOL_RATE = 3  # rates this small are zero
TOL_REFRESH_EVERY = 4  # the most advances between two refreshes
TOL_CG_FACTOR = 5  # CG iterations per |M| at most
TOL_DENSE_D = 6  # the largest d of dense directions (0: always CG)
TOL_GRAM_M = 7  # the largest |M| of the Gram route
TOL_REBUILD_COST = 8  # a list rebuild's cost in row evaluations a row (_rebuild)
TOL_KEPT_CALLS = 9  # directions between factorisations of the kept factor
N_TOLS = 10

# V, the candidate list
CL_LIST = 0
CL_FLAG = 1
CL_WREF = 2
CL_RAT = 3
CL_XNORM = 4
CL_PTR = 5
CL_IND = 6
CL_DAT = 7
CL_MID = 8
CL_MID_FLAG = 9
CL_W2 = 10
CL_G = 11
CL_DG = 12
CL_CAND = 13
CL_CRATE = 14
CL_POS = 15
CL_LEN = 16

# cnt, what the path did (QuantilePathSVC.diagnostics_ reads it)
N_KINKS = 0
N_BETA_USED = 1
N_CHANGES_USED = 2
N_CG_ITERATIONS = 3
N_RECOVERIES = 4
N_ZERO_STEPS = 5
N_REFRESHES = 6
N_DEGENERATE = 7
N_ACTIVE_SET_STEPS = 8
N_PRIMAL_DIRECTIONS = 9
N_ROWS_EXAMINED = 10
N_RADIUS_EXITS = 11
N_RADIUS_REGROWTHS = 12
N_LSQ_REPAIRS = 13
N_CD_REPAIRS = 14
N_DRIFT_REFRESHES = 15
N_FULL_REBUILDS = 16
N_ROWS_REBUILT = 17
N_PRIMAL_DEPENDENT = 18
N_COUNTERS = 19

# tols, the path's tolerances and settings
TOL_TIE = 0
TOL_CG = 1
TOL_DRIFT = 2
TOL_RATE = 3
TOL_REFRESH_EVERY = 4
TOL_CG_FACTOR = 5
TOL_DENSE_D = 6
TOL_GRAM_M = 7
TOL_REBUILD_COST = 8
TOL_KEPT_CALLS = 9
N_TOLS = 10

# The steps of dpf_run are inlined into it at numba's IR level (inline="always"):
# as calls, each passing the state's ~80 arrays (a reference count each way), they
# made the synthetic 10,000-row path 1.6x slower.

# status codes of dpf_run
DONE = 0  # tau reached 1
CHUNK = 1  # max_kinks recorded in this call; call again
BUFFER_FULL = 2  # grow the output buffers and call again
STALLED = 3  # too many zero-length steps at one tau (a degenerate cycle)
NOT_FINITE = 4  # a non-finite value appeared in the state
PLATEAU = 5  # dw/dtau is ~0: check whether w stays optimal up to tau = 1


@njit(cache=True, nogil=True, internal=True)
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


@njit(cache=True, nogil=True, internal=True)
def primal_from_lsum(X, S, tau, kappa):
    """w = kappa (sum_M beta y x + (1 - tau) P - tau N) and s_L = P + N, with P and N
    the error set's running sums of sw x by class (S[S_LSUM], :func:`_lsum_row`): since
    ub(tau) y x is sw (1 - tau) x for a positive and -sw tau x for a negative, only
    the margin rows are read, O(nnz(M)) where a sum over L from scratch reads most of
    X (a9a: 2.3 ns a non-zero over all rows, 9% of the path)."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:S_LSUM]
    lsum = S[S_LSUM]
    for j in range(len(w)):
        pj = lsum[0, j] + lsum[1, j]
        nj = lsum[2, j] + lsum[3, j]
        w[j] = kappa * ((1.0 - tau) * pj - tau * nj)
        s_l[j] = pj + nj
    for k in range(int(scal[AT_M])):
        i = mlist[k]
        row_axpy(indptr, indices, data, i, kappa * beta[i] * y[i], w)


@njit(cache=True, nogil=True, internal=True)
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


@njit(cache=True, nogil=True, internal=True)
def _record_beta(msorted, m, beta, out, start):
    """beta_M by increasing index (msorted: M's indices in that order)."""
    for k in range(m):
        out[start + k] = beta[msorted[k]]


@njit(cache=True, nogil=True, internal=True)
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


@njit(cache=True, nogil=True, internal=True)
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
    x = W[W_X]
    pin = F[F_PINNED]
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


@njit(cache=True, nogil=True, internal=True)
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
    fl, pin, rhs, xf = F[F_FREE], F[F_PINNED], F[F_RHS], F[F_XFREE]
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


@njit(cache=True, nogil=True, internal=True)
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


@njit(cache=True, nogil=True, internal=True)
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
    tmp, b, x, u, kind = W[W_TMP], W[W_B], W[W_X], W[W_U], W[W_KIND]
    pin = F[F_PINNED]
    d = len(u)
    two_sided = _bound_kinds(y, sw, mlist, m, beta, tau, btol, kind)
    it, steps, route = 0, 0, 0
    if d <= dense_max_d and m > 0 and not two_sided:
        route = 1
        solved = False
        Gc, gm = F[F_GRAM], F[F_GRAM_ROWS]
        if m <= d and m <= gram_max_m and m <= len(gm):
            h = np.empty(m)
            for k in range(m):
                h[k] = -y[mlist[k]] * sw[mlist[k]]
            _gram(X, mlist, m, s_l, tmp, Gc, gm, b)
            free = np.empty(m, np.int64)
            nf = _kept_free_factor(
                Gc, mlist, m, mpos, kind, F[F_KEPT:F_KEPT_END], free, 1e-10, kept_calls
            )
            if nf >= 0:
                solved, steps = _box_qp_from(
                    Gc, b, m, kind, h, x, pin, 1e-10, F[F_KEPT_L], free, nf
                )
        if not solved:
            # the unbounded columns' factor is kept while ML holds the margin rows'
            # copy's slots (compact; formed anew at every call otherwise)
            gen = F[F_MC_META][2] if compact else -1
            steps, dependent = _direction_dense(
                XM, ML, m, kind, s_l, d, W, F, 1e-11, xnm, 1.0, u, F[F_U:F_U_END], gen,
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
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:S_LSUM]
    x, kind = W[W_X], W[W_KIND]
    m = int(scal[AT_M])
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
        X, mlist, m, kind, t, d, W, F, 1e-11, xnorm, 0.0, np.empty(d), F[F_U:F_U_END], -1, 0
    )  # fmt: skip
    for k in range(m):
        i = mlist[k]
        beta[i] = min(max(beta[i] + x[k], 0.0), upper_bound(y[i], sw[i], tau))
    return True


@njit(cache=True, nogil=True, internal=True)
def _exact_from_sets(X, S, kappa, tau):
    """w, s_L and the margin rows' gradients from the sets and beta (the error set
    through its running sums); returns their largest magnitude (the KKT drift: 0 at
    the optimum). The other rows' gradients are the next rebuild's
    (:func:`_rebuild`)."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:S_LSUM]
    primal_from_lsum(X, S, tau, kappa)
    drift = 0.0
    for k in range(int(scal[AT_M])):
        i = mlist[k]
        g[i] = y[i] * row_dot(indptr, indices, data, i, w) - 1.0
        drift = max(drift, abs(g[i]))
    return drift


@njit(cache=True, nogil=True, internal=True)
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
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:S_LSUM]
    x, lo, hi = W[W_X], W[W_LO], W[W_HI]
    m = int(scal[AT_M])
    cnt[N_REFRESHES] += 1
    if full:
        lsum_from_sets(X, state, S[S_LSUM])
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
            cnt[N_ACTIVE_SET_STEPS] += resolve_margin(
                X, sqn, state, beta, tau, kappa, w, s_l, g, mlist, m, x, lo, hi,
                eps_tie, 100000,
            )  # fmt: skip
            cnt[N_CD_REPAIRS] += 1
        else:
            cnt[N_LSQ_REPAIRS] += 1
        cnt[N_RECOVERIES] += 1
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
    coordinate descent reads every row several times. Expects g_M in W[W_X][:m] (from
    :func:`_margin_drift`). False, with nothing changed, when Q_MM is too large for
    the Gram route or numerically singular (|M| above the rank): the caller then
    refreshes."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:S_LSUM]
    tmp, gres, b = W[W_TMP], W[W_X], W[W_B]
    G, gm = F[F_GRAM], F[F_GRAM_ROWS]
    m = int(scal[AT_M])
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


@njit(cache=True, nogil=True, inline="always")
def _measure_drift(w, wref, vs):
    """How far w moved per advance since the list was built at wref, folded into
    vs[V_DRIFT] (a geometric mean with the earlier measure)."""
    since = vs[V_SINCE]
    if since > 0 and vs[V_VALID] > 0:
        dist = 0.0
        for j in range(len(w)):
            dist += (w[j] - wref[j]) ** 2
        v_new = np.sqrt(dist) / since
        if v_new > 0.0:
            v_old = vs[V_DRIFT]
            vs[V_DRIFT] = v_new if v_old <= 0.0 else np.sqrt(v_old * v_new)


@njit(cache=True, nogil=True, inline="always")
def _choose_radius(state, g, gtol, V, nmid, v, full_scan, max_since, rebuild_cost):
    """The list's radius: each middle-list row's distance to an event,
    (|g_i| - gtol) / ||x_i|| (into V[CL_RAT]), binned in half-octaves of the drift
    v per advance; the radius covering K advances that minimises the list's length
    + rebuild_cost x rows read / K, K up to max_since (infinite for a full scan)."""
    rat, xnorm, mid = V[CL_RAT], V[CL_XNORM], V[CL_MID]
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
    if full_scan:
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
    return radius


@njit(cache=True, nogil=True, internal=True)
def _rebuild(X, state, g, w, gtol, V, vs, max_since, rebuild_cost, cnt):
    """The candidate list (a Verlet list) at w, with the exact gradients of the rows
    it is chosen from; counts full rebuilds in cnt[N_FULL_REBUILDS] and the rows whose gradient
    was computed in cnt[N_ROWS_REBUILT].

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
    clist, cflag, wref, rat, xnorm = V[:CL_PTR]
    mid, mflag, w2 = V[CL_MID], V[CL_MID_FLAG], V[CL_W2]
    n = len(g)
    d = len(w)
    nc = int(vs[V_NCAND])
    for c in range(nc):
        cflag[clist[c]] = 0
    _measure_drift(w, wref, vs)
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
        radius = _choose_radius(state, g, gtol, V, nmid, v, vs[V_MODE] == 0, max_since,
                                rebuild_cost)  # fmt: skip
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
    cnt[N_ROWS_REBUILT] += computed
    if full:
        cnt[N_FULL_REBUILDS] += 1


@njit(cache=True, nogil=True)
def _margin_copy(X, mlist, m, F, xnorm):
    """Form the margin rows' copy anew, slot k holding position k's row. The copy is
    F[F_MC:F_MC_END] = (cptr int64[n+1], cind int64[c], cdat[c], y[n], sw[n], xnorm[n],
    slot int64[n], meta int64[3]): a CSR of slots with each slot's label, weight
    and norm, the slot of each position of M, and meta = (slots used, valid,
    generation: the number of times it was formed). With
    (cptr, cind, cdat, y, sw) in place of X and slot in place of mlist, the kernels
    that read every margin row at a primal kink (the bounded least squares, the
    pinned rows' rates, the drift check) read them in order from one block: on
    a9a's ~5,000 margin rows a pass takes a third of the time it takes through
    X's rows at random."""
    cptr, slot, meta = F[F_MC_PTR], F[F_MC_SLOT], F[F_MC_META]
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
    if want and F[F_MC_META][1] != 0:
        return F[F_MC_PTR:F_MC_XNORM], F[F_MC_SLOT], F[F_MC_XNORM]
    return X, mlist, xnorm


@njit(cache=True, nogil=True, internal=True)
def _margin_copy_add(X, F, i, pos, xnorm):
    """Row i enters M at position pos: appended to the copy as a new slot; where
    the copy is full it is marked stale (formed anew when next needed)."""
    indptr = X[0]
    cptr, cind, slot, meta = F[F_MC_PTR], F[F_MC_IND], F[F_MC_SLOT], F[F_MC_META]
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
    cptr, cind, cdat, yc, swc, xnc = F[F_MC_PTR:F_MC_SLOT]
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
    cptr, cind, cdat, cg, cpos = V[CL_PTR], V[CL_IND], V[CL_DAT], V[CL_G], V[CL_POS]
    cg[nc - 1] = gi
    cpos[i] = nc - 1
    q = cptr[nc - 1]
    for p in range(indptr[i], indptr[i + 1]):
        cind[q] = indices[p]
        cdat[q] = data[p]
        q += 1
    cptr[nc] = q


@njit(cache=True, nogil=True, internal=True)
def _events(X, S, W, F, V, vs, u, degenerate, tols3, XM, ML):
    """The first event of the segment from the rows that can have one: the margin
    rows' boxes and the candidate list's gradients. Returns (step, rate of the
    quantity that hits its limit there). The margin rows' values are read from XM
    at the positions' entries in ML (X and mlist, or the margin rows' copy:
    :func:`_margin_copy`)."""
    indptr, indices, data, y, sw = X
    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[:S_LSUM]
    dg, cand, kind, crate = W[W_DG], W[W_CAND], W[W_KIND], W[W_CRATE]
    pinned = F[F_PINNED]
    clist, cptr, cind, cdat = V[CL_LIST], V[CL_PTR], V[CL_IND], V[CL_DAT]
    cg, cdg, ccand, ccrate = V[CL_G], V[CL_DG], V[CL_CAND], V[CL_CRATE]
    eps_tie, rate_tol, gtol, dtol = tols3
    tau = scal[AT_TAU]
    m = int(scal[AT_M])
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


@njit(cache=True, nogil=True, internal=True)
def _rerecord(msorted, m, beta, kink_bptr, bstore, cnt):
    """Rewrite the last kink's beta record after a refresh at its tau (same M, beta
    repaired), so that what a recovered solution interpolates is the repaired one."""
    kc = cnt[N_KINKS]
    if kc > 0 and kink_bptr[kc] - kink_bptr[kc - 1] == m:
        _record_beta(msorted, m, beta, bstore, kink_bptr[kc - 1])


@njit(cache=True, nogil=True)
def dpf_run(X, S, W, F, O, V, vs, kappa, max_kinks, tols):
    """Follow the path from the state S until tau = 1, ``max_kinks`` new kinks or full
    output buffers; returns a status code (DONE, CHUNK, BUFFER_FULL, ...).

    Between two kinks the sets R, M, L are fixed and the solution moves linearly in
    tau (Yu et al., Alg. 1). Each kink takes the steps:

    1. the direction: d beta_M / d tau solves Q_MM dbeta_M = y_M (X_M s_L) plus the
       box terms (:func:`_direction`; an active set where M's boxes bind, the
       primal where |M| is above the rank);
    2. the rate of w, u = dw/dtau = kappa (X_M^T (y dbeta_M) - s_L)
       (:func:`_rate_of_w`); where u vanishes the solution stays optimal on a
       plateau, which the caller crosses in one programme (PLATEAU);
    3. the events: the first tau at which a row outside M reaches g = 0 or a row of
       M reaches its box (:func:`_events`, over the candidate list, exact while w
       stays within its radius of the w it was built at, :func:`_within_radius`);
    4. the advance to the event (:func:`_advance`): beta_M, w and the list's
       gradients move by the step, and the events within the tie tolerance are
       collected;
    5. the events applied in index order (:func:`_apply_events`): rows move between
       the sets, s_L and the records follow;
    6. the certificate (:func:`_after_kink`): margin drift |g_M| checked and
       repaired by a Newton step, and a refresh (w, s_L and every gradient
       recomputed exactly, :func:`_refresh`, then the list rebuilt) at least every
       ``tols[TOL_REFRESH_EVERY]`` kinks;
    7. beta_M recorded at the kink, in increasing row order.

    The state's arrays are named by the S_, W_, F_, CL_, AT_, N_ and TOL_ constants
    above; O = (kink taus, beta records' offsets, beta records, index changes'
    offsets, changed rows, their new sets, cnt, diag) are the growable outputs,
    with diag[0] the largest KKT drift seen on M.
    """
    state, beta, g, w, mlist = S[S_STATE], S[S_BETA], S[S_G], S[S_W], S[S_MLIST]
    scal, msorted, u = S[S_AT], S[S_MSORTED], W[W_U]
    kink_tau, kink_bptr, bstore, kink_cptr, cidx, cto, cnt, diag = O
    wref, xnorm = V[CL_WREF], V[CL_XNORM]
    eps_tie, drift_tol, rate_tol = tols[TOL_TIE], tols[TOL_DRIFT], tols[TOL_RATE]
    refresh_every = int(tols[TOL_REFRESH_EVERY])
    rebuild_cost = tols[TOL_REBUILD_COST]
    gtol = 100.0 * drift_tol  # gradients this close to 0 are ties
    vtol = 0.1 * drift_tol  # how far a tie may move a value when it is snapped
    n = len(state)
    d = len(w)
    xnmax = 0.0
    for i in range(n):
        xnmax = max(xnmax, xnorm[i])
    dense = 0 < d <= int(tols[TOL_DENSE_D])
    new_kinks = 0
    # the sets may have changed since the last call: the margin rows' copy is
    # formed anew when a primal kink needs it
    F[F_MC_META][1] = 0
    while True:
        tau = scal[AT_TAU]
        m = int(scal[AT_M])
        if tau >= 1.0:
            return DONE
        if new_kinks >= max_kinks:
            return CHUNK
        kc = cnt[N_KINKS]
        if kc + 2 > len(kink_tau) or cnt[N_BETA_USED] + n > len(bstore):
            return BUFFER_FULL
        if cnt[N_CHANGES_USED] + 2 * n > len(cidx):
            return BUFFER_FULL
        if vs[V_VALID] == 0:
            # M may have changed outside (a plateau's programme): its sorted copy
            srt = np.sort(mlist[:m])
            for i in range(m):  # a loop, not a slice copy: see bigrate._jit
                msorted[i] = srt[i]
            if not _resync(X, S, W, F, V, vs, O, kappa, tau, tols, dense, True, True):
                return NOT_FINITE
        # 1. the direction on M
        degenerate, XM, ML = _direction_at_kink(X, S, W, F, V, cnt, tols, m, dense)
        # 2. u = dw/dtau
        un, sn, unorm = _rate_of_w(S, W, kappa, m)
        if un <= 1e-6 * sn and scal[AT_PLATEAU_TAU] != tau and m > d:
            if vs[V_SINCE] > 0:
                # the plateau's programme starts from this kink's beta: refresh and
                # repair it first (drift left there stays on the whole plateau)
                vs[V_VALID] = 0
                continue
            scal[AT_PLATEAU_TAU] = tau
            return PLATEAU
        # rounding in a rate x_i . u grows with |x_i| |u|
        dtol = rate_tol + 1e-13 * xnmax * unorm
        # 3. events: N -> M from the gradients, M -> L / R from the boxes
        tols3 = (eps_tie, rate_tol, gtol, dtol)
        step, rarg = _events(X, S, W, F, V, vs, u, degenerate, tols3, XM, ML)
        cnt[N_ROWS_EXAMINED] += m + int(vs[V_NCAND])
        if vs[V_MODE] != 0 and not _within_radius(w, u, wref, step + eps_tie, vs):
            if vs[V_SINCE] == 0:
                # gradients are exact at w = wref: widen the list to this segment
                # (a longer step than the drift measured so far)
                vs[V_RMIN] = 2.0 * (step + eps_tie) * unorm
                _rebuild(X, state, g, w, gtol, V, vs, refresh_every, rebuild_cost, cnt)
                cnt[N_RADIUS_REGROWTHS] += 1
                step, rarg = _events(X, S, W, F, V, vs, u, degenerate, tols3, XM, ML)
                cnt[N_ROWS_EXAMINED] += m + int(vs[V_NCAND])
            else:
                # refresh there and solve this segment again
                cnt[N_RADIUS_EXITS] += 1
                if not _resync(
                    X, S, W, F, V, vs, O, kappa, tau, tols, dense, False, True
                ):  # fmt: skip
                    return NOT_FINITE
                continue
        # 4. advance to the event
        step, new_tau = _snapped_step(step, rarg, tau, eps_tie, vtol)
        ne = _advance(S, W, V, vs, m, step, new_tau < 1.0, step + eps_tie, vtol)
        scal[AT_TAU] = new_tau
        # 5. apply every event within the tie tolerance, in index order
        zero = step == 0.0
        kc = _open_kink(O, scal, kc, new_tau, zero, n)
        if kc < 0:
            return STALLED
        if new_tau < 1.0:
            m = _apply_events(X, S, W, F, V, vs, O, m, ne, new_tau)
        scal[AT_M] = m
        # 6. the certificate: drift checked and repaired, a refresh when due
        if not _after_kink(X, S, W, F, V, vs, O, kappa, new_tau, tols, xnorm, dense):
            return NOT_FINITE
        # 7. record beta_M (sorted by index) at this kink
        _record_beta(msorted, m, beta, bstore, cnt[N_BETA_USED])
        cnt[N_BETA_USED] += m
        kink_bptr[kc + 1] = cnt[N_BETA_USED]
        kink_cptr[kc + 1] = cnt[N_CHANGES_USED]
        if not zero:
            new_kinks += 1
        cnt[N_KINKS] = kc + 1


@njit(cache=True, nogil=True, inline="always")
def _direction_at_kink(X, S, W, F, V, cnt, tols, m, dense):
    """Step 1 of a kink: the direction on M (:func:`_direction`), with M's rows read
    from their copy above the rank (formed anew if stale), counted in ``cnt``.
    Returns (whether it was degenerate, the margin rows, their labels and weights)."""
    mlist, xnorm, d = S[S_MLIST], V[CL_XNORM], len(S[S_W])
    mcopy = F[F_MC:F_MC_END]
    big = dense and m > d and len(mcopy[MC_SLOT]) == len(mlist)
    if big and mcopy[MC_META][1] == 0:
        _margin_copy(X, mlist, m, F, xnorm)
    XM, ML, xnm = _margin_rows(X, mlist, xnorm, F, big)
    it, steps, route = _direction(
        X, mlist, S[S_MPOS], m, S[S_BETA], S[S_AT][AT_TAU], S[S_SL], S[S_DBETA], W,
        F, tols[TOL_CG], tols[TOL_CG_FACTOR], 1e-9, int(tols[TOL_DENSE_D]),
        int(tols[TOL_GRAM_M]), xnorm, int(tols[TOL_KEPT_CALLS]), XM, ML, xnm, big,
    )  # fmt: skip
    cnt[N_CG_ITERATIONS] += it
    cnt[N_ACTIVE_SET_STEPS] += steps
    if route >= 2:
        cnt[N_PRIMAL_DIRECTIONS] += 1
    if route == 3:
        cnt[N_PRIMAL_DEPENDENT] += 1
    if steps > 0:
        cnt[N_DEGENERATE] += 1
    return steps > 0, XM, ML


@njit(cache=True, nogil=True, inline="always")
def _open_kink(O, scal, kc, new_tau, zero, n):
    """The records of the kink the path just reached, ``kc``: a zero-length step
    extends the last kink instead (its beta record is written again; too many at one
    tau are a degenerate cycle: -1). Returns the kink's index."""
    kink_tau, kink_bptr, kink_cptr, cnt = O[0], O[1], O[3], O[6]
    if zero:
        cnt[N_ZERO_STEPS] += 1
        scal[AT_ZERO_RUN] += 1
        if scal[AT_ZERO_RUN] > 2 * n + 10:
            return -1
        kc -= 1  # same tau: extend the last kink, rewrite its beta record
        cnt[N_BETA_USED] = kink_bptr[kc]
    else:
        scal[AT_ZERO_RUN] = 0
        kink_tau[kc] = new_tau
        kink_cptr[kc] = cnt[N_CHANGES_USED]
        kink_bptr[kc] = cnt[N_BETA_USED]
    return kc


@njit(cache=True, nogil=True, inline="always")
def _snapped_step(step, rarg, tau, eps_tie, vtol):
    """The step to take and the tau it reaches. A step within the tie tolerance in
    tau is a zero step only if nothing would move by more than vtol over it
    (``step * rarg``): a degenerate direction can have multipliers changing at rates
    of 1e4 and more, where snapping a 1e-11 step to zero leaves their values 1e-7
    off (KKT drift). The step to the end of the path is never snapped: with tau one
    rounding unit below 1 and no event left, a zero step would be taken again and
    again (a stall the scikit-learn checks' tied 20-row data reached)."""
    if step <= eps_tie and step * rarg <= vtol and step < 1.0 - tau:
        step = 0.0
    new_tau = tau + step
    if new_tau >= 1.0:
        new_tau = 1.0
        step = 1.0 - tau
    return step, new_tau


@njit(cache=True, nogil=True, inline="always")
def _rate_of_w(S, W, kappa, m):
    """u = dw/dtau = kappa (X_M^T (y dbeta_M) - s_L), in place of the X_M^T (y
    dbeta_M) the direction left in W[W_U]; the direction x (by position in M)
    becomes each row's dbeta. Returns (max |u_j|, max kappa |s_L,j|, ||u||_2): a
    plateau is where the first is negligible against the second."""
    s_l, mlist, dbeta = S[S_SL], S[S_MLIST], S[S_DBETA]
    x, u = W[W_X], W[W_U]
    d = len(u)
    for j in range(d):
        u[j] = kappa * (u[j] - s_l[j])
    for k in range(m):
        dbeta[mlist[k]] = x[k]
    un, sn, u2 = 0.0, 0.0, 0.0
    for j in range(d):
        un = max(un, abs(u[j]))
        sn = max(sn, kappa * abs(s_l[j]))
        u2 += u[j] * u[j]
    return un, sn, np.sqrt(u2)


@njit(cache=True, nogil=True, inline="always")
def _within_radius(w, u, wref, ext, vs):
    """Whether w + ext u (the segment's far end, tie band included) stays within
    the candidate list's radius of the w it was built at: the list is exact only
    there."""
    dist = 0.0
    for j in range(len(w)):
        dist += (w[j] + ext * u[j] - wref[j]) ** 2
    return not np.sqrt(dist) > vs[V_RADIUS]


@njit(cache=True, nogil=True, inline="always")
def _advance(S, W, V, vs, m, step, collect, lim, vtol):
    """Move beta_M and w by ``step`` along the direction and the listed rows'
    gradients by their rates; with ``collect``, gather the rows whose events fall
    within ``lim`` (the step plus the tie tolerance, and moving by more than
    ``vtol`` before them otherwise) into W[W_SORTBUF], in the same pass (one pass
    over the list fewer a kink). Returns how many."""
    state, beta, w, mlist, dbeta = S[S_STATE], S[S_BETA], S[S_W], S[S_MLIST], S[S_DBETA]
    u, cand, crate, sortbuf = W[W_U], W[W_CAND], W[W_CRATE], W[W_SORTBUF]
    clist, cg, cdg = V[CL_LIST], V[CL_G], V[CL_DG]
    ccand, ccrate = V[CL_CAND], V[CL_CRATE]
    for k in range(m):
        i = mlist[k]
        beta[i] += step * dbeta[i]
    for j in range(len(w)):
        w[j] += step * u[j]
    ne = 0
    if collect:
        for k in range(m):
            i = mlist[k]
            if not (cand[i] > lim or (cand[i] - step) * crate[i] > vtol):
                sortbuf[ne] = i
                ne += 1
    for c in range(int(vs[V_NCAND])):
        i = clist[c]
        if state[i] != M_SET:
            cg[c] += step * cdg[c]
            if collect and not (ccand[c] > lim or (ccand[c] - step) * ccrate[c] > vtol):
                sortbuf[ne] = i
                ne += 1
    return ne


@njit(cache=True, nogil=True, inline="always")
def _apply_events(X, S, W, F, V, vs, O, m, ne, new_tau):
    """Apply the ``ne`` events gathered in W[W_SORTBUF] at ``new_tau``, in increasing
    row order: a row of M goes to its box (L at the upper bound, adding to s_L, or R
    at 0), a row of L or R joins M; a row may leave M and come back once at one tau.
    Rows that leave M join the candidate list and the middle list; every change is
    recorded (O's index changes). Returns the new |M|."""
    indptr, indices, data, y, sw = X
    state, beta, g, s_l, mlist, mpos = (
        S[S_STATE],
        S[S_BETA],
        S[S_G],
        S[S_SL],
        S[S_MLIST],
        S[S_MPOS],
    )
    dbeta, tau_left, lsum, msorted = S[S_DBETA], S[S_TAU_LEFT], S[S_LSUM], S[S_MSORTED]
    kind, sortbuf = W[W_KIND], W[W_SORTBUF]
    cidx, cto, cnt = O[4], O[5], O[6]
    clist, cflag, cg, cpos = V[CL_LIST], V[CL_FLAG], V[CL_G], V[CL_POS]
    mid, mflag = V[CL_MID], V[CL_MID_FLAG]
    mcopy = F[F_MC:F_MC_END]
    mcmeta = mcopy[MC_META]
    nc = int(vs[V_NCAND])
    c_used = cnt[N_CHANGES_USED]
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
                mcopy[MC_SLOT][k] = mcopy[MC_SLOT][m - 1]
            mpos[last] = k
            mpos[i] = -1
            m -= 1
            state[i] = dest
            # may come back once at this tau (tau_left = tau + 2), not after it
            # came back once already (tau_left = -2 - tau)
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
            _margin_copy_add(X, F, i, m, V[CL_XNORM])
            m += 1
            dbeta[i] = 0.0
        cidx[c_used] = i
        cto[c_used] = state[i]
        c_used += 1
    vs[V_NCAND] = nc
    _merge_sorted(msorted, m_old, ev, ne, state)
    cnt[N_CHANGES_USED] = c_used
    return m


@njit(cache=True, nogil=True, inline="always")
def _after_kink(X, S, W, F, V, vs, O, kappa, new_tau, tols, xnorm, dense):
    """The certificate kept at a kink: exact w and gradients, drift repaired.

    Between refreshes, while Q_MM can be factorised, the margin rows' KKT drift
    |g_M| is checked at every kink (O(|M| nnz), from the running w) and repaired by
    a Newton step: the beta recorded after this is what a recovered solution
    interpolates. Where Q_MM is singular (|M| above the rank) the drift waits for a
    refresh, at most UNREPAIRED_REFRESH kinks away (sooner once it exceeds
    UNREPAIRED_DRIFT, and at once where a Newton step fell short of the drift
    tolerance): refreshing at every such kink made all of a9a 77 s against 47 s,
    waiting up to the refresh period left a9a 2,000 rows with a duality gap of 6e-9.
    A refresh (:func:`_refresh`, then the list rebuilt) comes at least every
    refresh period and at tau = 1. False if the state became non-finite."""
    w, mlist, x = S[S_W], S[S_MLIST], W[W_X]
    cnt, diag = O[6], O[7]
    drift_tol = tols[TOL_DRIFT]
    refresh_every = int(tols[TOL_REFRESH_EVERY])
    gram_m = tols[TOL_GRAM_M]
    m = int(S[S_AT][AT_M])
    d = len(w)
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
                cnt[N_RECOVERIES] += 1
                # a step that multipliers' boxes cut short leaves the drift
                # (a9a 8,000 rows: 1e-2 kept, a kink's duality gap 5e-3)
                now = _margin_drift(XM, ML, m, w, x) > drift_tol
            else:
                unrepaired = True
                now = drift > UNREPAIRED_DRIFT
    if now:
        cnt[N_DRIFT_REFRESHES] += 1
    since = vs[V_SINCE]
    if (
        now
        or since >= refresh_every
        or (unrepaired and since >= min(refresh_every, UNREPAIRED_REFRESH))
        or new_tau >= 1.0
    ):
        return _resync(X, S, W, F, V, vs, O, kappa, new_tau, tols, dense, False, False)
    return True


@njit(cache=True, nogil=True, inline="always")
def _resync(X, S, W, F, V, vs, O, kappa, tau, tols, dense, first, rerecord):
    """A refresh at ``tau`` (:func:`_refresh`: w, s_L and every gradient recomputed
    exactly, margin drift repaired; ``first``: the sets may have changed outside
    the path), the candidate list rebuilt there (:func:`_rebuild`) and, with
    ``rerecord``, the last kink's beta record written again from the repaired
    beta. False if the state became non-finite."""
    cnt, diag = O[6], O[7]
    drift_tol = tols[TOL_DRIFT]
    if not _refresh(
        X, S, W, F, kappa, tau, tols[TOL_TIE], drift_tol, cnt, diag, V[CL_XNORM],
        dense, first,
    ):  # fmt: skip
        return False
    _rebuild(X, S[S_STATE], S[S_G], S[S_W], 100.0 * drift_tol, V, vs,
             int(tols[TOL_REFRESH_EVERY]), tols[TOL_REBUILD_COST], cnt)  # fmt: skip
    if rerecord:
        m = int(S[S_AT][AT_M])
        _rerecord(S[S_MSORTED], m, S[S_BETA], O[1], O[2], cnt)
    return True


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
