"""Cholesky factor updates (appends, removals by Givens rotations) and the solve."""

import numpy as np

from bigrate.solvers.cholesky import chol_append, chol_remove, chol_solve


def test_cholesky_factor_updated_by_appends_and_removals_equals_a_fresh_one():
    """The factor of G[free, free] (the quantile path's box QP keeps one) is grown by appends and shrunk by
    removals (Givens); after any sequence it must be the factor of the current free
    set and solve with it."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        m = int(rng.integers(2, 30))
        A = rng.standard_normal((m + 3, m))
        G = A.T @ A
        free, L, nf = np.empty(m, np.int64), np.empty((m, m)), 0
        out = []
        for _ in range(4 * m):
            inside = free[:nf].tolist()
            outside = [k for k in range(m) if k not in inside]
            if outside and (nf == 0 or rng.random() < 0.6):
                k = int(rng.choice(outside))
                assert chol_append(G, free, nf, k, L, 1e-12)
                free[nf] = k
                nf += 1
            else:
                p = int(rng.integers(0, nf))
                chol_remove(L, nf, p)
                free[p : nf - 1] = free[p + 1 : nf].copy()
                nf -= 1
            if nf == 0:
                continue
            idx = free[:nf]
            Lf = np.tril(L[:nf, :nf])
            np.testing.assert_allclose(Lf @ Lf.T, G[np.ix_(idx, idx)], atol=1e-9)
            assert (np.diag(Lf) > 0).all()
            rhs = rng.standard_normal(nf)
            chol_solve(L, nf, rhs, sol := np.empty(m))
            out.append(np.abs(G[np.ix_(idx, idx)] @ sol[:nf] - rhs).max())
        assert max(out) < 1e-8
    # a dependent column is refused
    G = np.ones((3, 3))
    free = np.array([0, 0, 0])
    L = np.empty((3, 3))
    assert chol_append(G, free, 0, 0, L, 1e-10)
    assert not chol_append(G, free, 1, 1, L, 1e-10)
