"""Numba kernels of the data layer: flat loops over CSR arrays, no Python objects."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def l2_normalize_rows(indptr, data):
    """Scale each CSR row to unit L2 norm in place; rows of norm 0 are left as they are."""
    n = indptr.shape[0] - 1
    for i in range(n):
        s = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[k])
            s += v * v
        if s > 0.0:
            inv = 1.0 / np.sqrt(s)
            for k in range(indptr[i], indptr[i + 1]):
                data[k] = data[k] * inv


@njit(cache=True, nogil=True)
def synth_rows(draws, draw_ptr, idf, out_indices, out_values, out_ptr):
    """Turn per-row feature draws (with repeats) into L2-normalised TF-IDF CSR rows.

    ``draws[draw_ptr[i]:draw_ptr[i+1]]`` are the feature ids drawn for row i; a feature
    drawn t times gets the value (1 + log t) * idf[feature]. Rows are written to
    ``out_indices``/``out_values`` (sorted, unique) with ``out_ptr`` as the CSR indptr.
    Returns the number of non-zeros written.
    """
    n = draw_ptr.shape[0] - 1
    pos = 0
    out_ptr[0] = 0
    for i in range(n):
        a = draw_ptr[i]
        b = draw_ptr[i + 1]
        row = np.sort(draws[a:b])
        start = pos
        k = 0
        m = b - a
        while k < m:
            f = row[k]
            t = 1
            while k + t < m and row[k + t] == f:
                t += 1
            out_indices[pos] = f
            out_values[pos] = (1.0 + np.log(t)) * idf[f]
            pos += 1
            k += t
        s = 0.0
        for q in range(start, pos):
            s += np.float64(out_values[q]) * out_values[q]
        if s > 0.0:
            inv = 1.0 / np.sqrt(s)
            for q in range(start, pos):
                out_values[q] = out_values[q] * inv
        out_ptr[i + 1] = pos
    return pos


@njit(cache=True, nogil=True)
def sparse_dot_rows(indptr, indices, data, w):
    """Row-wise inner products <x_i, w> of a CSR matrix with a dense vector."""
    n = indptr.shape[0] - 1
    out = np.empty(n, dtype=np.float64)
    for i in range(n):
        s = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            s += data[k] * w[indices[k]]
        out[i] = s
    return out
