"""Dual coordinate descent over CSR rows (numba), shared by the quantile-SVM path
(:mod:`bigrate.quantile`: drift repairs and the dual at one tau) and the dataset-
constrained learner (:mod:`bigrate.constrained`: its weighted-hinge inner problems).

The problem is a box-constrained dual of a linear model,

    min_z  scale/2 ||sum_k y_k z_k x_k + v0/scale||^2 - lin^T z,   lo <= z <= hi,

solved exactly one coordinate at a time with the primal vector v kept up to date, with
optional LIBLINEAR-style shrinking; the data tuple is ``X = (indptr, indices, data, y,
sw)``.
"""

from __future__ import annotations

import numpy as np

from bigrate._jit import njit
from bigrate.solvers.sparse_rows import row_axpy, row_dot

# status codes
CONVERGED = 0
MAX_EPOCHS = 1


@njit(cache=True, nogil=True)
def row_sq_norms(indptr, indices, data, out):
    for i in range(len(indptr) - 1):
        s = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            s += data[p] * data[p]
        out[i] = s


@njit(cache=True, nogil=True)
def box_cd(X, idx, m, lin, lo, hi, z, v, sqn, scale, tol, max_epochs, seed,
           shrink=False):  # fmt: skip
    """:func:`box_cd_signed` with every sign +1, in a fully random order."""
    return box_cd_signed(X, idx, np.ones(m), m, lin, lo, hi, z, v, sqn, scale, tol,
                         max_epochs, seed, shrink, 1)  # fmt: skip


@njit(cache=True, nogil=True)
def box_cd_signed(X, idx, sign, m, lin, lo, hi, z, v, sqn, scale, tol, max_epochs,
                  seed, shrink, chunk):  # fmt: skip
    """Coordinate descent on  min_z scale/2 ||sum_k y_k z_k x_k + v0/scale||^2 - lin^T z
    over lo <= z <= hi, for the positions k < m: row idx[k] of X with label
    y_k = y[idx[k]] * sign[k] (z, lin, lo, hi, sign by position). The caller passes
    v = v0 + scale sum_k y_k z_k x_k; it is kept up to date. The gradient of position
    k is y_k x^T v - lin_k. Stops when the largest projected gradient is below tol.

    Positions are visited in runs of ``chunk`` consecutive positions, the runs in a
    fresh random order every epoch: when the positions are sorted by row, a run reads
    neighbouring rows of X, and these memory-bound loops run about twice as fast as
    on rows in a random order, while the order stays random between runs (chunk=1:
    a fully random order). With ``shrink``, positions pinned at a bound whose
    gradient points out of the box by more than last epoch's largest violation are
    skipped (as in LIBLINEAR); convergence is always confirmed by a pass over every
    position, and after two confirmations that fail, shrinking is switched off (it
    can otherwise keep dropping a position that the others keep pushing off its
    bound). Returns (status, epochs, violation)."""
    indptr, indices, data, y, sw = X
    np.random.seed(seed)
    runs = (m + chunk - 1) // chunk
    order = np.arange(runs)
    alive = np.ones(m, np.bool_)
    n_alive = m
    failed = 0  # confirmations that found violations
    confirming = False
    bound_out = np.inf  # shrinking threshold: last epoch's largest violation
    viol = np.inf
    for epoch in range(max_epochs):
        np.random.shuffle(order)
        viol = 0.0
        for r in range(runs):
            first = order[r] * chunk
            for k in range(first, min(first + chunk, m)):
                if not alive[k]:
                    continue
                i = idx[k]
                if sqn[i] == 0.0 or hi[k] <= lo[k]:
                    continue
                yk = y[i] * sign[k]
                g = yk * row_dot(indptr, indices, data, i, v) - lin[k]
                zk = z[k]
                if zk <= lo[k]:
                    if shrink and g > bound_out:
                        alive[k] = False
                        n_alive -= 1
                        continue
                    pg = min(g, 0.0)
                elif zk >= hi[k]:
                    if shrink and -g > bound_out:
                        alive[k] = False
                        n_alive -= 1
                        continue
                    pg = max(g, 0.0)
                else:
                    pg = g
                if abs(pg) > viol:
                    viol = abs(pg)
                if pg != 0.0:
                    nz = min(max(zk - g / (scale * sqn[i]), lo[k]), hi[k])
                    if nz != zk:
                        row_axpy(indptr, indices, data, i, scale * (nz - zk) * yk, v)
                        z[k] = nz
        if viol <= tol:
            if n_alive == m:
                return CONVERGED, epoch + 1, viol
            alive[:] = True  # confirm on every position
            n_alive = m
            bound_out = np.inf
            confirming = True
        else:
            if confirming:
                failed += 1
                shrink = shrink and failed < 2
                confirming = False
            bound_out = viol
    return MAX_EPOCHS, max_epochs, viol
