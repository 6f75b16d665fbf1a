"""Numba kernels of the exact AUM / AUC line search (Fowler and Hocking).

Lines T_b(s) = c_b + m_b s (one a breakpoint); their sorted order q changes only where two
adjacent lines cross. With gaps k = 0..B between sorted positions (gap k lies between
positions k-1 and k):

    FP[k] = sum_{j<k} dFP_{q_j},   FN[k] = sum_{j>=k} -dFN_{q_j},   M[k] = min(FP[k], FN[k])
    AUM(s) = sum_{k=1}^{B-1} (T_{q_k}(s) - T_{q_{k-1}}(s)) M[k]
    slope  = sum_{k=1}^{B-1} (m_{q_k} - m_{q_{k-1}}) M[k]
    AUC    = sum_{k=0}^{B-1} (FPR[k+1] - FPR[k]) (TPR[k+1] + TPR[k]) / 2,
             FPR = FP / FP[B],  TPR = 1 - FN / FN[0]

A swap of positions k-1 and k changes FP[k], FN[k] (so M[k]) only, hence only the slope
terms of gaps k-1, k, k+1 and the AUC trapezoids k-1 and k: O(1) per intersection
(the paper's Theorems 1 and 2). Candidate intersections of adjacent pairs sit in a binary
heap keyed by step size; entries made stale by a swap are skipped when popped.
"""

import numpy as np

from bigrate._jit import njit

FIRST_MIN = 0
LINEAR = 1
QUADRATIC = 2


@njit(cache=True, nogil=True, inline="always")
def _less(ks, ka, kb, a, b):
    return ks[a] < ks[b] or (ks[a] == ks[b] and ka[a] < ka[b])


@njit(cache=True, nogil=True, internal=True)
def _push(hs, hk, hu, hv, size, s, k, u, v):
    if size == hs.shape[0]:
        cap = 2 * size + 8
        ns = np.empty(cap)
        nk = np.empty(cap, np.int64)
        nu = np.empty(cap, np.int64)
        nv = np.empty(cap, np.int64)
        for j in range(size):  # a loop, not a slice copy: see bigrate._jit
            ns[j], nk[j], nu[j], nv[j] = hs[j], hk[j], hu[j], hv[j]
        hs, hk, hu, hv = ns, nk, nu, nv
    i = size
    hs[i], hk[i], hu[i], hv[i] = s, k, u, v
    while i > 0:
        p = (i - 1) // 2
        if _less(hs, hk, hk, i, p):
            hs[i], hs[p] = hs[p], hs[i]
            hk[i], hk[p] = hk[p], hk[i]
            hu[i], hu[p] = hu[p], hu[i]
            hv[i], hv[p] = hv[p], hv[i]
            i = p
        else:
            break
    return hs, hk, hu, hv, size + 1


@njit(cache=True, nogil=True, internal=True)
def _pop(hs, hk, hu, hv, size):
    s, k, u, v = hs[0], hk[0], hu[0], hv[0]
    size -= 1
    hs[0], hk[0], hu[0], hv[0] = hs[size], hk[size], hu[size], hv[size]
    i = 0
    while True:
        lft = 2 * i + 1
        rgt = lft + 1
        m = i
        if lft < size and _less(hs, hk, hk, lft, m):
            m = lft
        if rgt < size and _less(hs, hk, hk, rgt, m):
            m = rgt
        if m == i:
            break
        hs[i], hs[m] = hs[m], hs[i]
        hk[i], hk[m] = hk[m], hk[i]
        hu[i], hu[m] = hu[m], hu[i]
        hv[i], hv[m] = hv[m], hv[i]
        i = m
    return s, k, u, v, size


@njit(cache=True, nogil=True, inline="always")
def _cross(c, m, u, v, s_now):
    """Step size where line u (now below) overtakes line v (now above), or -1 if never.
    A crossing computed a rounding error before ``s_now`` is due now."""
    if m[u] > m[v]:
        s = (c[v] - c[u]) / (m[u] - m[v])
        return s if s > s_now else s_now
    return -1.0


@njit(cache=True, nogil=True)
def line_search(
    c, m, dfp, dfn, variant, max_events, out_s, out_aum, out_slope, out_auc
):
    """Run the line search; fills the outputs (piece i starts at out_s[i]) and returns
    (number of pieces, number of intersections processed, True if the outputs filled up
    before the search was done). The lines must come sorted by (intercept, slope), their
    order just after s = 0."""
    B = c.shape[0]
    q = np.arange(B)
    FP = np.zeros(B + 1)
    FN = np.zeros(B + 1)
    for k in range(B):
        FP[k + 1] = FP[k] + dfp[q[k]]
    for k in range(B - 1, -1, -1):
        FN[k] = FN[k + 1] - dfn[q[k]]
    M = np.minimum(FP, FN)
    tot = FN[0]
    # ROC axes: FPR = FP / FP(+inf), TPR = 1 - FN / FN(-inf) (AUM uses the raw counts)
    norm = 1.0 / (FP[B] * tot) if FP[B] > 0 and tot > 0 else 0.0
    aum = 0.0
    slope = 0.0
    for k in range(1, B):
        aum += (c[q[k]] - c[q[k - 1]]) * M[k]
        slope += (m[q[k]] - m[q[k - 1]]) * M[k]
    auc = 0.0
    for k in range(B):
        auc += (FP[k + 1] - FP[k]) * ((tot - FN[k + 1]) + (tot - FN[k])) / 2.0 * norm
    hs = np.empty(B + 8)
    hk = np.empty(B + 8, np.int64)
    hu = np.empty(B + 8, np.int64)
    hv = np.empty(B + 8, np.int64)
    size = 0
    for k in range(1, B):
        s = _cross(c, m, q[k - 1], q[k], 0.0)
        if s >= 0.0:
            hs, hk, hu, hv, size = _push(hs, hk, hu, hv, size, s, k, q[k - 1], q[k])
    n_out = 0
    out_s[0] = 0.0
    out_aum[0] = aum
    out_slope[0] = slope
    out_auc[0] = auc
    n_out = 1
    s_prev = 0.0
    events = 0
    if variant == FIRST_MIN and slope >= 0.0:
        return n_out, events, False
    while size > 0 and events < max_events:
        s, k, u, v, size = _pop(hs, hk, hu, hv, size)
        if q[k - 1] != u or q[k] != v:
            continue  # stale
        # several lines through one point give crossings that differ by rounding only:
        # they are one group at one step size
        if s > s_prev + 1e-12 * max(1.0, abs(s_prev)):
            if variant == FIRST_MIN and slope >= 0.0:
                break
            if n_out == out_s.shape[0]:
                return n_out, events, True
            aum += slope * (s - s_prev)
            s_prev = s
            out_s[n_out] = s
            out_aum[n_out] = aum
            n_out += 1
        # slope and AUC terms touched by the swap, before
        old = 0.0
        for g in range(max(1, k - 1), min(B - 1, k + 1) + 1):
            old += (m[q[g]] - m[q[g - 1]]) * M[g]
        old_auc = 0.0
        for g in range(k - 1, k + 1):
            old_auc += (
                (FP[g + 1] - FP[g]) * ((tot - FN[g + 1]) + (tot - FN[g])) / 2.0 * norm
            )
        q[k - 1] = v
        q[k] = u
        FP[k] = FP[k - 1] + dfp[q[k - 1]]
        FN[k] = FN[k + 1] - dfn[q[k]]
        M[k] = min(FP[k], FN[k])
        new = 0.0
        for g in range(max(1, k - 1), min(B - 1, k + 1) + 1):
            new += (m[q[g]] - m[q[g - 1]]) * M[g]
        new_auc = 0.0
        for g in range(k - 1, k + 1):
            new_auc += (
                (FP[g + 1] - FP[g]) * ((tot - FN[g + 1]) + (tot - FN[g])) / 2.0 * norm
            )
        slope += new - old
        auc += new_auc - old_auc
        out_slope[n_out - 1] = slope
        out_auc[n_out - 1] = auc
        events += 1
        if k - 1 >= 1:
            s2 = _cross(c, m, q[k - 2], q[k - 1], s)
            if s2 >= 0.0:
                hs, hk, hu, hv, size = _push(
                    hs, hk, hu, hv, size, s2, k - 1, q[k - 2], q[k - 1]
                )
        if k + 1 <= B - 1:
            s2 = _cross(c, m, q[k], q[k + 1], s)
            if s2 >= 0.0:
                hs, hk, hu, hv, size = _push(
                    hs, hk, hu, hv, size, s2, k + 1, q[k], q[k + 1]
                )
        if variant == LINEAR and events >= B:
            break
    return n_out, events, False


@njit(cache=True, nogil=True)
def aum_auc_at(c, m, dfp, dfn, s):
    """Brute force: AUM and AUC of the lines at step size s (sort and sum; tied
    thresholds form one ROC segment)."""
    B = c.shape[0]
    T = c + m * s
    q = np.argsort(T, kind="mergesort")
    FP = np.zeros(B + 1)
    FN = np.zeros(B + 1)
    for k in range(B):
        FP[k + 1] = FP[k] + dfp[q[k]]
    for k in range(B - 1, -1, -1):
        FN[k] = FN[k + 1] - dfn[q[k]]
    aum = 0.0
    for k in range(1, B):
        aum += (T[q[k]] - T[q[k - 1]]) * min(FP[k], FN[k])
    tot = FN[0]
    norm = 1.0 / (FP[B] * tot) if FP[B] > 0 and tot > 0 else 0.0
    auc = 0.0
    k = 0
    while k < B:  # ROC points only between distinct thresholds
        j = k
        while j + 1 < B and T[q[j + 1]] == T[q[k]]:
            j += 1
        auc += (FP[j + 1] - FP[k]) * ((tot - FN[j + 1]) + (tot - FN[k])) / 2.0 * norm
        k = j + 1
    return aum, auc


@njit(cache=True, nogil=True)
def aum_slope_at(c, m, dfp, dfn, s, q):
    """AUM of the lines at step size s and its slope just after s; q sorts the lines
    by their value at s (any order among equal values: runs of ties are re-sorted here
    by slope, their order just after s)."""
    B = c.shape[0]
    T = c + m * s
    i = 0
    while i < B:
        j = i + 1
        while j < B and T[q[j]] == T[q[i]]:
            j += 1
        for a in range(i + 1, j):  # insertion sort of a (short) run of ties
            x = q[a]
            b = a
            while b > i and m[q[b - 1]] > m[x]:
                q[b] = q[b - 1]
                b -= 1
            q[b] = x
        i = j
    fp = 0.0
    fn = 0.0
    for k in range(B):
        fn -= dfn[k]
    aum = 0.0
    slope = 0.0
    for k in range(1, B):
        fp += dfp[q[k - 1]]
        fn += dfn[q[k - 1]]
        mk = min(fp, fn)
        aum += (T[q[k]] - T[q[k - 1]]) * mk
        slope += (m[q[k]] - m[q[k - 1]]) * mk
    return aum, slope
