"""bigrate._lapack: one LU factorisation for a solve and an inverse, equal bit for bit
to numba's np.linalg.solve and np.linalg.inv."""

import numpy as np
import pytest
from numba import njit
from threadpoolctl import threadpool_limits

from bigrate._lapack import lu_inverse, lu_solve


@njit(cache=False)
def _numba_solve_inv(A, b):
    return np.linalg.solve(A, b), np.linalg.inv(A)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 151])
def test_lu_solve_and_inverse_equal_numbas_bit_for_bit(n):
    rng = np.random.default_rng(n)
    A = rng.standard_normal((n, n))
    A = A + A.T  # symmetric indefinite, as the bordered systems are
    b = rng.standard_normal((n, 3))
    A0, b0 = A.copy(), b.copy()
    with threadpool_limits(1, user_api="blas"):
        x0, inv0 = _numba_solve_inv(A, b)
        ok, x, lu, ipiv = lu_solve(A, b)
        inv = lu_inverse(lu, ipiv)
    assert ok
    assert np.array_equal(x, x0) and np.array_equal(inv, inv0)
    assert np.abs(A @ x - b).max() < 1e-8 and np.abs(A @ inv - np.eye(n)).max() < 1e-8
    assert np.array_equal(A, A0) and np.array_equal(b, b0)  # inputs left as they were


def test_lu_solve_refuses_singular_and_non_finite_systems():
    b = np.ones((3, 2))
    ok, x, _, _ = lu_solve(np.ones((3, 3)), b)
    assert not ok and not x.any()
    A = np.eye(3)
    A[1, 2] = np.nan
    assert not lu_solve(A, b)[0]
    B = b.copy()
    B[0, 1] = np.inf
    assert not lu_solve(np.eye(3), B)[0]
    ok, x, _, _ = lu_solve(np.zeros((0, 0)), np.zeros((0, 3)))
    assert ok and x.shape == (0, 3)
