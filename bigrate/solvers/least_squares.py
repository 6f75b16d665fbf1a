"""Least squares over columns given as signed sparse rows: column q of a matrix C is
``sgn[q] x_i`` for the CSR row ``i = rows[q]`` of the data tuple ``X = (indptr,
indices, data, y, sw)``, and C is never formed (a product with C or C^T is one sparse
row operation a column).

- :func:`project_out` / :func:`projected_column`: the orthogonal projection onto the
  complement of the span of some "unbounded" columns A_U, given by the Cholesky factor
  of their Gram matrix (full column rank) or an orthonormal basis of the complement;
- :func:`nnls`: Lawson-Hanson non-negative least squares through that projection;
- :func:`factor_lsq`: least squares on independent columns from their Cholesky factor,
  with iterative refinement;
- :func:`row_space` / :func:`min_norm_lsq`: the minimum-norm solution on dependent
  columns from an eigendecomposition of A A^T, with iterative refinement.
"""

import numpy as np

from bigrate._jit import njit
from bigrate.solvers.cholesky import chol_solve
from bigrate.solvers.sparse_rows import row_axpy, row_dot

__all__ = ["factor_lsq", "min_norm_lsq", "nnls", "project_out", "projected_column",
           "row_space"]  # fmt: skip


@njit(cache=True, nogil=True, internal=True)
def project_out(X, R, v, c, s):
    """v <- its part orthogonal to range(A_U), in place. R = (P, L, urow, usgn)
    describes A_U: with urow non-empty its columns are usgn[q] x_{urow[q]} and L is
    the Cholesky factor of their Gram matrix (full column rank), so the projection
    is v - A_U (L L^T)^-1 A_U^T v, O(|U| nnz + |U|^2); otherwise P (d x f) is an
    orthonormal basis of the complement and the projection P P^T v (no projection
    at all when P is empty: there are no unbounded columns). c and s are scratch of
    length >= |U|."""
    indptr, indices, data, y, sw = X
    P, L, urow, usgn = R
    nu = len(urow)
    if nu > 0:
        for q in range(nu):
            c[q] = usgn[q] * row_dot(indptr, indices, data, urow[q], v)
        chol_solve(L, nu, c, s)
        for q in range(nu):
            row_axpy(indptr, indices, data, urow[q], -usgn[q] * s[q], v)
    elif P.shape[0] > 0:
        d, f = P.shape
        pv = np.zeros(f)
        for j in range(d):
            for k in range(f):
                pv[k] += P[j, k] * v[j]
        for j in range(d):
            a = 0.0
            for k in range(f):
                a += P[j, k] * pv[k]
            v[j] = a


@njit(cache=True, nogil=True, internal=True)
def projected_column(X, R, i, sgn, out, c, s):
    """out = the projection (:func:`project_out`) of the column sgn x_i, applied twice:
    the Cholesky form squares the conditioning of A_U, and a second application
    removes what rounding left of range(A_U)."""
    indptr, indices, data, y, sw = X
    out[:] = 0.0
    row_axpy(indptr, indices, data, i, sgn, out)
    project_out(X, R, out, c, s)
    if len(R[2]) > 0:
        project_out(X, R, out, c, s)


@njit(cache=True, nogil=True)
def nnls(X, rows, sgn, p, R, t, tol, max_iter):
    """Lawson-Hanson non-negative least squares  min ||Pi (C z - t)||  over z >= 0,
    where column q of C is sgn[q] x_i for the sparse row i = rows[q] and Pi is the
    orthogonal projection described by R (:func:`project_out`: onto the complement of
    the unbounded columns' span, or the identity). C is never formed: the gradient
    C^T Pi r is one sparse dot product per column, and only the passive columns are
    projected. On a9a's margin sets of ~4,600 bounded columns of which about one
    enters, forming C and P^T C densely was 70% of a direction solve. The passive
    set's columns stay linearly independent, so each step is a full-rank
    least-squares solve of at most d columns. Returns (z, iterations)."""
    indptr, indices, data, y, sw = X
    d = len(t)
    nu = len(R[2])
    c = np.empty(max(nu, 1))
    s = np.empty(max(nu, 1))
    z = np.zeros(p)
    passive = np.zeros(p, np.bool_)
    banned = np.zeros(p, np.bool_)  # entered with a non-positive value (rounding)
    cols = np.zeros(p, np.int64)
    tp = t.copy()
    project_out(X, R, tp, c, s)
    if nu > 0:
        project_out(X, R, tp, c, s)
    res = tp.copy()  # Pi (t - C z)
    grad = np.zeros(p)
    col = np.empty(d)
    it = 0
    while it < max_iter:
        # grad = C^T Pi res (= C^T res: res is in the projection's range)
        for q in range(p):
            grad[q] = sgn[q] * row_dot(indptr, indices, data, rows[q], res)
        j, best = -1, tol
        for k in range(p):
            if not passive[k] and not banned[k] and grad[k] > best:
                j, best = k, grad[k]
        if j < 0:
            break
        passive[j] = True
        first = True
        while it < max_iter:
            it += 1
            nc = 0
            for k in range(p):
                if passive[k]:
                    cols[nc] = k
                    nc += 1
            sub = np.empty((d, nc))
            for q in range(nc):
                projected_column(X, R, rows[cols[q]], sgn[cols[q]], col, c, s)
                for r in range(d):  # loops, not slice copies: see bigrate._jit
                    sub[r, q] = col[r]
            sol = np.linalg.lstsq(sub, tp, -1.0)[0]
            if first:
                first = False
                ok = True
                for q in range(nc):
                    if cols[q] == j and sol[q] <= 0.0:
                        ok = False
                if not ok:
                    passive[j] = False
                    banned[j] = True
                    break
            step, kmin = 1.0, -1
            for q in range(nc):
                k = cols[q]
                if sol[q] <= 0.0:
                    a = z[k] / (z[k] - sol[q])
                    if a < step:
                        step, kmin = a, k
            if kmin < 0:
                for q in range(nc):
                    z[cols[q]] = sol[q]
                break
            for q in range(nc):
                k = cols[q]
                z[k] += step * (sol[q] - z[k])
                if z[k] <= 0.0:
                    z[k] = 0.0
                    passive[k] = False
            z[kmin] = 0.0
            passive[kmin] = False
        for r in range(res.shape[0]):
            res[r] = tp[r]
        for k in range(p):
            if z[k] != 0.0:
                projected_column(X, R, rows[k], sgn[k], col, c, s)
                for q in range(d):
                    res[q] -= z[k] * col[q]
    return z, it


@njit(cache=True, nogil=True)
def factor_lsq(X, R, t, out):
    """The least-squares solution of min ||A_U a - t|| for independent columns (R as
    in :func:`project_out`, with the Cholesky factor of their Gram matrix): a = (L
    L^T)^-1 A_U^T t, then two steps of iterative refinement with the residual
    computed from the sparse rows (the normal equations square the conditioning;
    each step shrinks the error by about eps cond(A_U)^2)."""
    indptr, indices, data, y, sw = X
    P, L, urow, usgn = R
    nu = len(urow)
    c = np.empty(nu)
    s = np.empty(nu)
    res = t.copy()
    out[:nu] = 0.0
    for step in range(3):
        if step > 0:
            for r in range(res.shape[0]):
                res[r] = t[r]
            for q in range(nu):
                row_axpy(indptr, indices, data, urow[q], -usgn[q] * out[q], res)
        for q in range(nu):
            c[q] = usgn[q] * row_dot(indptr, indices, data, urow[q], res)
        chol_solve(L, nu, c, s)
        for q in range(nu):
            out[q] += s[q]


@njit(cache=True, nogil=True)
def row_space(X, mlist, cols, nc, d, rank_rtol):
    """Eigen-decomposition of B = A A^T for the columns A = [y_i x_i] at the mlist
    positions ``cols[:nc]``: accumulated from the sparse rows (nnz^2 per row) and
    decomposed in O(d^3), far cheaper than an SVD of the d x nc matrix when nc is in
    the hundreds. Returns (first, V, ev): V[:, first:] spans range(A) (eigenvalues
    above rank_rtol times the largest), ev = those eigenvalues."""
    indptr, indices, data, y, sw = X
    B = np.zeros((d, d))
    for q in range(nc):
        i = mlist[cols[q]]
        for p1 in range(indptr[i], indptr[i + 1]):
            c1, v1 = indices[p1], data[p1]
            for p2 in range(indptr[i], indptr[i + 1]):
                B[c1, indices[p2]] += v1 * data[p2]
    ev, V = np.linalg.eigh(B)
    cut = rank_rtol * ev[d - 1]
    first = d
    while first > 0 and ev[first - 1] > cut:
        first -= 1
    return first, V, ev[first:].copy()


@njit(cache=True, nogil=True)
def min_norm_lsq(X, mlist, cols, nc, t, V, first, lam, out):
    """The minimum-norm solution of min ||A a - t|| (A as in :func:`row_space`, whose
    eigenvectors V and eigenvalues lam it takes): a = A^T U L^-1 U^T t, then two steps
    of iterative refinement on the normal equations A^T A a = A^T t with residuals
    computed from the sparse rows. Through A A^T the small singular values are
    squared (a 1e-4 relative singular value loses half the digits), and refinement
    wins them back: each step shrinks the error by about eps cond(A)^2."""
    indptr, indices, data, y, sw = X
    d = len(t)
    U = np.ascontiguousarray(V[:, first:])
    v = U @ ((U.T @ t) / lam)
    for j in range(nc):
        i = mlist[cols[j]]
        out[j] = y[i] * row_dot(indptr, indices, data, i, v)
    res = np.empty(d)
    ag = np.empty(d)
    for _ in range(2):
        for r in range(d):
            res[r] = t[r]
        for j in range(nc):
            i = mlist[cols[j]]
            row_axpy(indptr, indices, data, i, -y[i] * out[j], res)
        ag[:] = 0.0
        for j in range(nc):
            i = mlist[cols[j]]
            gj = y[i] * row_dot(indptr, indices, data, i, res)  # -(normal residual)
            row_axpy(indptr, indices, data, i, y[i] * gj, ag)
        v = U @ ((U.T @ ag) / (lam * lam))
        for j in range(nc):
            i = mlist[cols[j]]
            out[j] += y[i] * row_dot(indptr, indices, data, i, v)
