"""Conjugate gradients on the Gram matrix of signed sparse rows,
Q_MM = Y_M X_M X_M^T Y_M for the rows ``mlist[:m]`` of the data tuple ``X = (indptr,
indices, data, y, sw)``: Q is never formed, a product is two passes over the rows.
"""

import numpy as np

from bigrate._jit import njit
from bigrate.solvers.sparse_rows import row_axpy, row_dot

__all__ = ["cg_solve", "gram_matvec"]


@njit(cache=True, nogil=True)
def gram_matvec(X, mlist, m, p, tmp, out):
    """out = Q_MM p = Y_M X_M (X_M^T Y_M p); tmp is a zeroed d-vector, left zeroed."""
    indptr, indices, data, y, sw = X
    for k in range(m):
        i = mlist[k]
        row_axpy(indptr, indices, data, i, y[i] * p[k], tmp)
    for k in range(m):
        i = mlist[k]
        out[k] = y[i] * row_dot(indptr, indices, data, i, tmp)
    for k in range(m):
        i = mlist[k]
        for q in range(indptr[i], indptr[i + 1]):
            tmp[indices[q]] = 0.0


@njit(cache=True, nogil=True)
def cg_solve(X, mlist, m, b, x, tmp, r, p, q, rtol, maxiter):
    """Conjugate gradients for Q_MM x = b from the initial x given; returns iterations
    and the final relative residual."""
    gram_matvec(X, mlist, m, x, tmp, q)
    bn = 0.0
    rr = 0.0
    for k in range(m):
        r[k] = b[k] - q[k]
        p[k] = r[k]
        rr += r[k] * r[k]
        bn += b[k] * b[k]
    bn = np.sqrt(bn)
    if bn == 0.0:
        for k in range(m):
            x[k] = 0.0
        return 0, 0.0
    it = 0
    while it < maxiter and np.sqrt(rr) > rtol * bn:
        gram_matvec(X, mlist, m, p, tmp, q)
        pq = 0.0
        for k in range(m):
            pq += p[k] * q[k]
        if pq <= 0.0:
            break
        a = rr / pq
        rr_new = 0.0
        for k in range(m):
            x[k] += a * p[k]
            r[k] -= a * q[k]
            rr_new += r[k] * r[k]
        beta_cg = rr_new / rr
        rr = rr_new
        for k in range(m):
            p[k] = r[k] + beta_cg * p[k]
        it += 1
    return it, np.sqrt(rr) / bn
