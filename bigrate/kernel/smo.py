"""Our SMO solver for box-constrained SVM duals with a general equality constraint.

    min_a 1/2 a^T Q a - p^T a   s.t.  y^T a = delta,  lo <= a <= hi,  Q_ij = y_i y_j K_ij

:class:`KernelProblem` holds the training inputs and an LRU cache of kernel rows with a
memory budget; it is kept across solves (the NP-SVM solves many problems on the same
kernel matrix), so warm starts reuse both the duals and the cached rows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from bigrate.errors import BigrateWarning
from bigrate.kernel import _kernels as K

KERNELS = {"linear": K.LINEAR, "rbf": K.RBF, "poly": K.POLY}


@dataclass
class SMOResult:
    alpha: np.ndarray
    b: float
    objective: float
    n_iter: int
    gap: float
    converged: bool
    cache_hits: int
    cache_misses: int
    gradient: np.ndarray  # G = Q alpha - p at the solution
    n_shrunk: int = 0  # variables set aside by shrinking (counted each time)
    n_reconstructions: int = 0  # gradient reconstructions (unshrinking)
    n_reentered: int = 0  # set-aside variables that moved again after reactivation
    g_bar: bool = False  # set-aside gradients rebuilt by libsvm's G_bar (cold starts)

    @property
    def cache_hit_rate(self) -> float:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else 0.0


def resolve_gamma(gamma, X) -> float:
    """'scale' is 1 / (n_features * X.var()) as in scikit-learn; 'auto' 1 / n_features."""
    d = X.shape[1]
    if gamma == "scale":
        if sp.issparse(X):
            m = X.mean()
            var = X.multiply(X).mean() - m * m
        else:
            var = X.var()
        return 1.0 / (d * var) if var > 0 else 1.0
    if gamma == "auto":
        return 1.0 / d
    return float(gamma)


class KernelProblem:
    """Training inputs, kernel parameters and the kernel-row cache."""

    def __init__(
        self,
        X,
        *,
        kernel: str = "rbf",
        gamma: float = 1.0,
        coef0: float = 0.0,
        degree: int = 3,
        cache_mb: float = 200.0,
    ):
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
        self.kind = KERNELS[kernel]
        self.gamma, self.coef0, self.degree = float(gamma), float(coef0), int(degree)
        n = X.shape[0]
        self.n = n
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float64)
            X.sort_indices()
            self.sparse = True
            self.indptr, self.indices, self.data = (
                X.indptr,
                X.indices.astype(np.int64),
                X.data,
            )
            self.Xd = np.zeros((1, 1))
            self.sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
            self.work = np.zeros(X.shape[1])
        else:
            Xd = np.ascontiguousarray(X, dtype=np.float64)
            self.sparse = False
            self.Xd = Xd
            self.indptr = np.zeros(1, np.int64)
            self.indices = np.zeros(0, np.int64)
            self.data = np.zeros(0)
            self.sq = np.einsum("ij,ij->i", Xd, Xd)
            self.work = np.zeros(1)
        row_bytes = 8 * n
        slots = int(cache_mb * 2**20 // max(row_bytes, 1))
        if slots < 2:
            need = 2 * row_bytes / 2**20
            raise ValueError(
                f"cache_mb={cache_mb} holds {slots} kernel row(s) of {n} values; the solver "
                f"needs at least two: raise cache_mb to {need:.3f} or more"
            )
        slots = min(slots, n)
        self.cache = np.empty((slots, n))
        # the cache's bookkeeping (rows K.VA_*, K.SL_*, K.TK_*: see K._row)
        self.var = np.zeros((3, n), np.int64)
        self.var[K.VA_SLOT] = -1
        self.slot = np.zeros((4, slots), np.int64)
        self.slot[K.SL_ROW] = -1
        self.tick = np.zeros(2, np.int64)
        self.par = np.zeros(5)
        self.par[[K.P_KIND, K.P_SPARSE, K.P_GAMMA, K.P_COEF0, K.P_DEGREE]] = (
            self.kind,
            float(self.sparse),
            self.gamma,
            self.coef0,
            self.degree,
        )
        # K(x_i, x_i): exactly 1 (RBF: exp(-gamma 0)) and ||x_i||^2 (linear), as the
        # kernel function gives them; only the polynomial kernel needs its compiled
        # loop (a cold process then compiles it only for that kernel)
        if self.kind == K.RBF:
            self.diag = np.ones(n)
        elif self.kind == K.LINEAR:
            self.diag = self.sq.copy()
        else:
            self.diag = K.diag_kernel(
                self.sq, self.kind, self.gamma, self.coef0, self.degree
            )
        # the solver's work arrays (see K.smo_solve), made once for every solve
        self._ws = (
            np.empty(n, np.int64), np.empty(n), np.empty(n, np.bool_),
            np.empty(n, np.bool_), np.empty(n, np.bool_), np.empty(n, np.int64),
            np.empty(n), np.empty(n),
        )  # fmt: skip

    def _kp(self):
        """The kernel inputs and row cache as one tuple for the numba kernels."""
        return (self.Xd, self.indptr, self.indices, self.data, self.sq, self.work,
                self.cache, self.var, self.slot, self.tick, self.par)  # fmt: skip

    def solve(
        self,
        y,
        p,
        lo,
        hi,
        delta: float = 0.0,
        *,
        alpha0=None,
        Qa0=None,
        eps: float = 1e-3,
        max_iter: int = 1_000_000,
        shrinking: bool = True,
    ) -> SMOResult:
        """Solve the QP; ``alpha0`` warm-starts (it is projected onto the boxes and the
        equality constraint first). ``Qa0 = Q alpha0`` (a previous result's
        ``gradient + p``) spares recomputing the gradient: only the duals the projection
        moved cost a kernel row. ``shrinking`` sets aside variables that cannot be
        selected soon (libsvm's heuristic); the solution meets the same stopping rule."""
        y = np.asarray(y, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        if np.any(lo > hi):
            raise ValueError("every box must have lo <= hi")
        a = feasible_point(y, lo, hi, delta, alpha0)
        stats = np.zeros(6, np.int64)
        # G = Q a - p: from Q alpha0 and the duals the projection moved, or from the
        # full kernel rows of the non-zero a_i (added by the solver first)
        if Qa0 is not None and alpha0 is not None:
            G = np.array(Qa0, dtype=np.float64)
            if G.shape != a.shape:
                raise ValueError(f"Qa0 has shape {G.shape}, expected {a.shape}")
            da, less_p = a - np.asarray(alpha0, dtype=np.float64), True
        else:
            G, da, less_p = -p, a, False
        status, it, gap = K.smo_solve(
            self._kp(), y, p, lo, hi, a, G, da, less_p, self.diag, eps, max_iter,
            stats, bool(shrinking), self._ws,
        )  # fmt: skip
        converged = status == K.OK
        if not converged:
            warnings.warn(
                f"SMO stopped at max_iter={max_iter} with KKT gap {gap:.3g} > eps={eps:g}; "
                "the best iterate is returned: raise max_iter (or eps)",
                BigrateWarning,
                stacklevel=3,
            )
        b = _intercept(y, G, a, lo, hi)
        obj = 0.5 * float(a @ (G - p))
        return SMOResult(
            alpha=a,
            b=b,
            objective=obj,
            n_iter=int(it),
            gap=float(gap),
            converged=converged,
            cache_hits=int(stats[0]),
            cache_misses=int(stats[1]),
            gradient=G,
            n_shrunk=int(stats[2]),
            n_reconstructions=int(stats[3]),
            n_reentered=int(stats[4]),
            g_bar=bool(stats[5]),
        )

    def decision(self, alpha, y, b, X) -> np.ndarray:
        """f(x) = sum_i alpha_i y_i K(x_i, x) + b for the rows of X."""
        sv = np.flatnonzero(alpha != 0)
        coef = alpha[sv] * y[sv]
        return (
            cross_kernel(
                self.support_rows(sv),
                X,
                self.kind_name(),
                self.gamma,
                self.coef0,
                self.degree,
            ).T
            @ coef
            + b
        )

    def kind_name(self) -> str:
        return {v: k for k, v in KERNELS.items()}[self.kind]

    def support_rows(self, sv):
        if self.sparse:
            X = sp.csr_matrix(
                (self.data, self.indices, self.indptr),
                shape=(self.n, self.work.shape[0]),
            )
            return X[sv]
        return self.Xd[sv]


def cross_kernel(
    A, B, kernel: str, gamma: float, coef0: float, degree: int
) -> np.ndarray:
    """K(A_i, B_j); sparse inputs are densified in blocks of 2048 rows."""
    kind = KERNELS[kernel]
    out = np.empty((A.shape[0], B.shape[0]))

    def dense(M):
        return (
            M.toarray() if sp.issparse(M) else np.ascontiguousarray(M, dtype=np.float64)
        )

    Ad = dense(A)
    sqa = np.einsum("ij,ij->i", Ad, Ad)
    for s in range(0, B.shape[0], 2048):
        Bd = dense(B[s : s + 2048])
        sqb = np.einsum("ij,ij->i", Bd, Bd)
        out[:, s : s + 2048] = K.cross_kernel_dense(
            Ad, sqa, Bd, sqb, kind, gamma, coef0, degree
        )
    return out


def feasible_point(y, lo, hi, delta, alpha0=None) -> np.ndarray:
    """A point of the feasible set: ``alpha0`` (or 0) clipped to the boxes, then moved
    variable by variable until y^T a = delta."""
    a = np.clip(
        np.zeros_like(lo) if alpha0 is None else np.asarray(alpha0, float), lo, hi
    )
    r = delta - float(y @ a)
    if abs(r) > 1e-12:
        # variables that can raise y^T a (r > 0) or lower it (r < 0), largest room first
        room = (
            np.where(y > 0, hi - a, a - lo)
            if r > 0
            else np.where(y > 0, a - lo, hi - a)
        )
        for t in np.argsort(-room):
            if abs(r) <= 1e-12:
                break
            step = min(room[t], abs(r))
            if step <= 0:
                break
            if step == room[t]:  # onto the bound exactly (a sum can miss it by an ulp)
                a[t] = hi[t] if np.sign(r) * y[t] > 0 else lo[t]
            else:
                a[t] += np.sign(r) * y[t] * step
            r -= np.sign(r) * step
        if abs(r) > 1e-9 * max(1.0, abs(delta)):
            raise ValueError(
                f"no dual point satisfies y^T alpha = {delta} within the boxes"
            )
    return a


def _intercept(y, G, a, lo, hi) -> float:
    """b from the KKT conditions: y_i f(x_i) fixed by the free variables, or the middle of
    the feasible interval when none is free (libsvm's rule, per-example boxes)."""
    yG = y * G
    at_hi = a >= hi - 1e-12 * np.maximum(1, np.abs(hi))
    at_lo = a <= lo + 1e-12 * np.maximum(1, np.abs(lo))
    free = ~(at_hi | at_lo)
    if free.any():
        return -float(yG[free].mean())
    ub, lb = np.inf, -np.inf
    up = (at_hi & (y < 0)) | (at_lo & (y > 0))
    low = (at_hi & (y > 0)) | (at_lo & (y < 0))
    if up.any():
        ub = yG[up].min()
    if low.any():
        lb = yG[low].max()
    rho = (
        (ub + lb) / 2
        if np.isfinite(ub) and np.isfinite(lb)
        else (ub if np.isfinite(ub) else lb)
    )
    return -float(rho)
