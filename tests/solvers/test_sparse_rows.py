"""The CSR row primitives every kernel builds on, against scipy."""

import numpy as np
import scipy.sparse as sp

from bigrate.solvers.sparse_rows import row_axpy, row_dot


def test_row_dot_and_axpy_match_scipy():
    rng = np.random.default_rng(0)
    X = sp.random(40, 30, density=0.2, format="lil", random_state=1)
    X[3] = 0  # an empty row
    X = sp.csr_matrix(X)
    v = rng.normal(size=30)
    got = [row_dot(X.indptr, X.indices, X.data, i, v) for i in range(40)]
    np.testing.assert_allclose(got, X @ v, rtol=1e-12, atol=0)
    assert got[3] == 0.0
    for i in (0, 3, 17):
        out = v.copy()
        row_axpy(X.indptr, X.indices, X.data, i, -2.5, out)
        np.testing.assert_allclose(out, v - 2.5 * X[i].toarray().ravel(), rtol=1e-12)
