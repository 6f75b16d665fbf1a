"""Exact duplicate rows of a CSR matrix with labels, found by hashing: rows with the
same label, indices and value bits share a group (the quantile path merges them into
one row of summed weight)."""

import numpy as np

from bigrate._jit import njit

__all__ = ["merge_groups", "row_hashes"]


@njit(cache=True, nogil=True)
def row_hashes(indptr, indices, data, y, out):
    """A 64-bit FNV-1a hash of each row's label, indices and value bits."""
    bits = data.view(np.int64)
    for i in range(len(indptr) - 1):
        h = np.uint64(14695981039346656037)
        prime = np.uint64(1099511628211)
        h = (h ^ np.uint64(1 if y[i] > 0 else 2)) * prime
        for p in range(indptr[i], indptr[i + 1]):
            h = (h ^ np.uint64(indices[p])) * prime
            h = (h ^ np.uint64(bits[p])) * prime
        out[i] = np.int64(h)


@njit(cache=True, nogil=True)
def merge_groups(indptr, indices, data, y, order, hashes, group):
    """Rows sorted by hash (``order``): equal rows (same label hash and same entries as
    the first row of their run) share a group id. Returns the number of groups."""
    ng = 0
    lead = -1
    for t in range(len(order)):
        i = order[t]
        same = False
        if lead >= 0 and hashes[i] == hashes[lead] and y[i] == y[lead]:
            a0, a1 = indptr[lead], indptr[lead + 1]
            b0, b1 = indptr[i], indptr[i + 1]
            if a1 - a0 == b1 - b0:
                same = True
                for k in range(a1 - a0):
                    if (
                        indices[a0 + k] != indices[b0 + k]
                        or data[a0 + k] != data[b0 + k]
                    ):
                        same = False
                        break
        if same:
            group[i] = group[lead]
        else:
            lead = i
            group[i] = ng
            ng += 1
    return ng
