"""The row primitives every CSR kernel of the package is built on: the dot product of
one row with a dense vector (with the row's squared norm from the same pass, for the SGD
steps that need it), and a multiple of one row added to a dense vector.

They are inlined into their callers at numba's IR level: LLVM did not inline them across
compiled libraries, and a call per row (a9a: 14 non-zeros) was 30% of the quantile path's
time; inlined, the all-a9a path runs 10-20% faster with the same arithmetic (the same
kinks, bit for bit).
"""

from bigrate._jit import njit

__all__ = ["row_axpy", "row_dot", "row_dot_sq"]


@njit(cache=True, nogil=True, inline="always")
def row_dot(indptr, indices, data, i, v):
    """<x_i, v> for row ``i`` of the CSR matrix (indptr, indices, data)."""
    s = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        s += data[p] * v[indices[p]]
    return s


@njit(cache=True, nogil=True, inline="always")
def row_dot_sq(indptr, indices, data, i, v):
    """(<x_i, v>, ||x_i||^2) for row ``i``, in one pass over its non-zeros."""
    s = 0.0
    q = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        d = data[p]
        s += d * v[indices[p]]
        q += d * d
    return s, q


@njit(cache=True, nogil=True, inline="always")
def row_axpy(indptr, indices, data, i, a, v):
    """v += a x_i for row ``i`` of the CSR matrix (indptr, indices, data)."""
    for p in range(indptr[i], indptr[i + 1]):
        v[indices[p]] += a * data[p]
