"""Conjugate gradients on a Gram matrix of signed sparse rows, the minimum-norm least
squares of dependent columns, and exact duplicate rows, against numpy."""

import numpy as np
import scipy.sparse as sp

from bigrate.solvers.cg import cg_solve
from bigrate.solvers.duplicate_rows import merge_groups, row_hashes
from bigrate.solvers.least_squares import min_norm_lsq, row_space


def _tuple(M, y):
    M = sp.csr_matrix(M)
    return (M.indptr.astype(np.int64), M.indices.astype(np.int64), M.data,
            y.astype(np.float64), np.ones(M.shape[0]))  # fmt: skip


def test_cg_solves_the_gram_system_of_the_chosen_rows():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, d = 30, int(rng.integers(8, 20))
        A = rng.standard_normal((n, d)) * (rng.uniform(size=(n, d)) < 0.5)
        y = rng.choice([-1.0, 1.0], n)
        X = _tuple(A, y)
        m = int(rng.integers(1, d // 2 + 1))  # fewer rows than features: Q_MM is SPD
        mlist = rng.choice(n, m, replace=False).astype(np.int64)
        YA = y[mlist, None] * A[mlist]
        Q = YA @ YA.T
        if np.linalg.eigvalsh(Q).min() < 1e-6:
            continue
        b = rng.standard_normal(m)
        x = np.zeros(m)
        work = [np.zeros(d)] + [np.zeros(m) for _ in range(3)]
        it, rel = cg_solve(X, mlist, m, b, x, *work, 1e-12, 10 * m)
        assert rel <= 1e-12 and it <= 10 * m
        np.testing.assert_allclose(x, np.linalg.solve(Q, b), rtol=1e-8, atol=1e-9)
        assert not work[0].any()  # the d-vector is left zeroed


def test_min_norm_least_squares_of_dependent_columns_equals_lstsq():
    rng = np.random.default_rng(1)
    d, nc = 6, 10  # more columns than rows: dependent, the min-norm solution
    B = rng.standard_normal((d, 3))
    A = B @ rng.standard_normal((3, nc))  # rank 3
    y = rng.choice([-1.0, 1.0], nc)
    X = _tuple((A * y).T, y)  # column j of A is y_j x_j
    mlist = np.arange(nc, dtype=np.int64)
    cols = np.arange(nc, dtype=np.int64)
    first, V, lam = row_space(X, mlist, cols, nc, d, 1e-10)
    assert d - first == 3
    t = rng.standard_normal(d)
    out = np.empty(nc)
    min_norm_lsq(X, mlist, cols, nc, t, V, first, lam, out)
    np.testing.assert_allclose(out, np.linalg.lstsq(A, t, rcond=None)[0],
                               rtol=1e-9, atol=1e-10)  # fmt: skip


def test_duplicate_rows_share_a_group_and_nothing_else_does():
    rng = np.random.default_rng(2)
    base = sp.random(20, 15, density=0.3, format="csr", random_state=3)
    pick = rng.integers(0, 20, 60)
    M = sp.csr_matrix(base[pick])
    y = np.where(pick % 3 == 0, 1.0, -1.0)
    y[::7] *= -1  # the same row with the other label is another group
    ip, ix = M.indptr.astype(np.int64), M.indices.astype(np.int64)
    h = np.empty(60, np.int64)
    row_hashes(ip, ix, M.data, y, h)
    order = np.argsort(h, kind="stable")
    group = np.empty(60, np.int64)
    ng = merge_groups(ip, ix, M.data, y, order, h, group)
    keys = [(tuple(M[i].indices), tuple(M[i].data), y[i]) for i in range(60)]
    assert ng == len(set(keys))
    for i in range(60):
        for j in range(60):
            assert (group[i] == group[j]) == (keys[i] == keys[j])
