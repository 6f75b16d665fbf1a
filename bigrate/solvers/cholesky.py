"""Updates of a dense Cholesky factor L (lower triangular, L L^T = G) as the matrix
gains or loses one row and column, and the solve with it: the factorised Gram matrices
the quantile path keeps between kinks (:mod:`bigrate.quantile`) are grown by one
column when an index enters and shrunk when one leaves, at O(f^2) instead of O(f^3)
a refactorisation.
"""

import numpy as np

from bigrate._jit import njit

__all__ = ["chol_append", "chol_finish_row", "chol_remove", "chol_solve"]


@njit(cache=True, nogil=True)
def chol_append(G, free, nf, k, L, rel_pivot):
    """Grow the Cholesky factor L of G[free, free] (first nf) by the index k, O(nf^2);
    False if the new pivot falls below rel_pivot times its diagonal (singular)."""
    for j in range(nf):
        L[nf, j] = G[free[j], k]
    return chol_finish_row(L, nf, G[k, k], rel_pivot)


@njit(cache=True, nogil=True, inline="always")
def chol_finish_row(L, nf, diag, rel_pivot):
    """Row nf of a Cholesky factor from the new column's entries against the first nf
    (in L[nf, :nf], replaced by the factor's row) and its diagonal; False if the
    pivot falls below rel_pivot times the diagonal."""
    v = diag
    for j in range(nf):
        s = L[nf, j]
        for q in range(j):
            s -= L[nf, q] * L[j, q]
        s /= L[j, j]
        L[nf, j] = s
        v -= s * s
    if not v > rel_pivot * diag:
        return False
    L[nf, nf] = np.sqrt(v)
    return True


@njit(cache=True, nogil=True)
def chol_remove(L, nf, p):
    """Drop row and column p from the factor of an nf x nf matrix, O((nf - p)^2): the
    rows below move up one and Givens rotations on column pairs (j, j + 1) restore the
    triangle (L Q Q^T L^T is unchanged; the new pivots are never smaller)."""
    for r in range(p + 1, nf):
        for q in range(r + 1):
            L[r - 1, q] = L[r, q]
    for j in range(p, nf - 1):
        a, c = L[j, j], L[j, j + 1]
        rr = np.hypot(a, c)
        cs, sn = a / rr, c / rr
        L[j, j] = rr
        L[j, j + 1] = 0.0
        for r in range(j + 1, nf - 1):
            u, v = L[r, j], L[r, j + 1]
            L[r, j] = cs * u + sn * v
            L[r, j + 1] = cs * v - sn * u


@njit(cache=True, nogil=True)
def chol_solve(L, nf, rhs, out):
    """out = (L L^T)^-1 rhs on the first nf entries."""
    for j in range(nf):
        v = rhs[j]
        for k in range(j):
            v -= L[j, k] * out[k]
        out[j] = v / L[j, j]
    for j in range(nf - 1, -1, -1):
        v = out[j]
        for k in range(j + 1, nf):
            v -= L[k, j] * out[k]
        out[j] = v / L[j, j]
