"""The entire quantile path of the asymmetric linear SVM (Yu et al. 2009, "DPF"), restated
with its garbled conventions fixed in ``../shared/docs/algorithms.md`` sec. 2.

For tau in [0, 1] the quantile SVM solves

    min_w  lambda/2 ||w||^2 + sum_i c_i(tau) max(0, 1 - y_i w^T x_i),
    c_i(tau) = 2 (1 - tau) / n  (y_i = +1),   2 tau / n  (y_i = -1),

(tau = 1/2 is the usual SVM with the mean hinge loss; a bias is a constant feature).
Its dual solution is piecewise linear in tau. :class:`QuantilePathSVC` solves tau = 0 once,
then follows the dual from kink to kink (Alg. 1): each kink stores only the indices that
changed set and the margin multipliers alpha_M, so memory is O(n + kinks |M|), and the
classifier for any tau is recovered afterwards in O(nnz(X)) by interpolation.
"""

from __future__ import annotations

import time
import warnings
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import (
    _check_sample_weight,
    check_is_fitted,
    validate_data,
)
from threadpoolctl import threadpool_limits

from bigrate.base import RateClassifierMixin, binary_classes
from bigrate.errors import BigrateWarning
from bigrate.progress import Progress
from bigrate.quantile import _kernels as K
from bigrate.solvers import dual_cd
from bigrate.solvers.duplicate_rows import merge_groups, row_hashes

# direction="auto" solves densely up to this many design columns (a d x d eigenproblem
# per primal direction), and by Cholesky on the Gram matrix up to this |M|
DENSE_MAX_D = 1024
GRAM_MAX_M = 128
# a rebuild of the candidate list (a refresh: exact w and every gradient) costs about
# this many candidate evaluations per row; it weighs the list's length against how
# often it is rebuilt (a9a 8,000 rows, at most 60 kinks between refreshes: 813
# rebuilds with 3, 632 with 10, for about the same rows read per kink)
REBUILD_COST = 10.0
# the Gram route's Cholesky factor of the free margin multipliers is updated from
# kink to kink and formed anew every this many directions (0: at every direction),
# which bounds the rounding its updates accumulate
KEPT_FACTOR_CALLS = 64

_ARRAYS = (
    "kinks_", "_kink_bptr", "_bstore", "_kink_cptr", "_cidx", "_cto", "_ck_kink",
    "_ck_cpos", "_ck_state", "_Xi", "_Xp", "_Xd", "_y", "_sw", "_group",
    "_row_weight", "_n_margin", "_n_error", "_n_right",
)  # fmt: skip


#: diagnostics_ keys and the path's counters they report (K.N_*)
_COUNTERS = {
    "cg_iterations": K.N_CG_ITERATIONS, "recoveries": K.N_RECOVERIES,
    "zero_steps": K.N_ZERO_STEPS, "refreshes": K.N_REFRESHES,
    "degenerate_directions": K.N_DEGENERATE, "active_set_steps": K.N_ACTIVE_SET_STEPS,
    "primal_directions": K.N_PRIMAL_DIRECTIONS,
    "primal_dependent_directions": K.N_PRIMAL_DEPENDENT,
    "rows_examined": K.N_ROWS_EXAMINED, "rows_read_by_rebuilds": K.N_ROWS_REBUILT,
    "radius_exits": K.N_RADIUS_EXITS, "radius_regrowths": K.N_RADIUS_REGROWTHS,
    "lsq_repairs": K.N_LSQ_REPAIRS, "cd_repairs": K.N_CD_REPAIRS,
    "drift_refreshes": K.N_DRIFT_REFRESHES, "full_rebuilds": K.N_FULL_REBUILDS,
    "kink_storage_floats": K.N_BETA_USED, "index_changes": K.N_CHANGES_USED,
}  # fmt: skip


def direction_work(Xt, d, dense):
    """The direction's work arrays F of :func:`bigrate.quantile._kernels.dpf_run`
    for the merged rows Xt with d columns (those of dense directions empty
    without them)."""
    n = len(Xt[3])
    F = (np.zeros(n, np.int64), np.zeros(n, np.int8), np.zeros(n), np.zeros(n))
    cap = min(GRAM_MAX_M, d, n)
    F += (np.zeros((cap, cap)), np.full(cap, -1, np.int64))
    F += (np.zeros((cap, cap)), np.zeros(cap, np.int64), np.zeros(2, np.int64))
    # the margin rows' copy (K._margin_copy), for dense directions only: room for
    # every row once
    nr = n if dense else 0
    nz = len(Xt[1]) + int(np.diff(Xt[0]).max(initial=0)) if dense else 0
    F += (np.zeros(nr + 1, np.int64), np.zeros(nz, np.int64), np.zeros(nz))
    F += (np.zeros(nr, Xt[3].dtype), np.zeros(nr, Xt[4].dtype), np.zeros(nr))
    F += (np.zeros(nr, np.int64), np.zeros(3, np.int64))
    # the primal route's factor of the unbounded columns (K._unbounded_factor)
    dd = d if dense else 0
    F += (np.zeros((dd, dd)), np.zeros(dd, np.int64), np.zeros(3, np.int64))
    return F + (np.zeros(nr, np.int64),)


class QuantilePathSVC(RateClassifierMixin, BaseEstimator):
    """Linear SVM for every quantile tau in [0, 1] from one fit (Yu et al. 2009, Alg. 1).

    tau is the share of the misclassification cost put on false positives: the SVM at
    tau minimises ``alpha/2 ||w||^2 + sum_i c_i(tau) hinge(y_i w^T x_i)`` with
    ``c_i = 2 (1 - tau) / n`` for positives and ``2 tau / n`` for negatives, and its sign
    estimates ``sign(P(y = +1 | x) - tau)``. Train once, then pick tau per user.

    Parameters
    ----------
    alpha : float > 0, default 1e-4
        The regulariser lambda (tau = 1/2 matches ``SGDClassifier(alpha=...)``'s hinge
        objective).
    fit_intercept : bool, default True
        Append a constant feature ``intercept_scaling`` (regularised like the others, as
        in the paper and LIBLINEAR).
    intercept_scaling : float > 0, default 1.0
    tau : float in [0, 1], default 0.5
        The quantile used by ``predict`` / ``decision_function`` when none is given.
    tol : float > 0, default 1e-11
        Event tolerance: KKT tolerance of the initial solve, ties between events closer
        than this in tau are taken together; conjugate gradients solve to tol too.
    drift_tol : float > 0, default 1e-11
        At every kink the margin examples' gradients are checked; one further than
        this from 0 has its margin multipliers repaired by an exact Newton step on
        the Gram matrix. Where that matrix is singular (more margin examples than
        the rank) the next refresh, at most 10 kinks later, repairs it: w and every
        gradient are recomputed exactly and, if they drifted, the margin multipliers
        are corrected by a least-squares repair in the primal (the smallest change
        of w that zeroes the margin gradients, the multipliers fitted to it within
        their boxes), or re-solved by coordinate descent where that falls short
        (all repairs counted in ``diagnostics_["recoveries"]``, the refreshes' in
        ``"lsq_repairs"`` and ``"cd_repairs"``). A refresh comes sooner where the
        drift exceeds 1e-9 above the rank, or where a Newton step, cut short by the
        multipliers' boxes, leaves it above ``drift_tol`` (``"drift_refreshes"``).
    refresh_every : int, default 60
        The most kinks between two refreshes. A refresh also rebuilds the candidate
        list of ``events="candidates"``, which is rebuilt sooner when w leaves its
        radius.
    max_kinks : int, default 5_000_000
        Guard on the path length: a clear error rather than an endless fit.
    direction : {"auto", "dense", "cg"}, default "auto"
        How each segment's direction d alpha_M / d tau is solved. "cg": the paper's
        conjugate gradients on Q_MM (Q never formed), with an active set over the
        multipliers sitting at a bound. "dense": exact dense solves, Cholesky on the
        Gram matrix Q_MM while |M| is small, and once |M| exceeds the rank (many
        rows tied on the margin, as on one-hot data) a bounded least-squares problem
        in the d-dimensional primal, where dw/dtau is unique even when alpha_M's
        direction is not; it costs a d x d eigenproblem per such segment. "auto":
        "dense" up to 1,024 design columns, "cg" above.
    events : {"candidates", "scan"}, default "candidates"
        How the next event is found. "scan": every example's gradient rate is read at
        every kink (the paper's step, O(nnz) a kink). "candidates": only the margin
        examples and a candidate list are read, the examples whose gradient can reach
        0 while w stays within a radius of where the list was built (|g_i| >
        ||x_i|| r rules an example out). The list is rebuilt, from exact gradients,
        before a segment would leave the radius, so the events found are the same
        (the tests compare both on tied data); the radius is chosen from how far w
        moved per kink so far. Rebuilds read the rows near the list (a second list,
        four radii wide) and every row only when w leaves that
        (``diagnostics_["full_rebuilds"]``). ``diagnostics_["scan_share"]`` is the
        share of a full scan per kink that was read, rebuilds included.
    progress : bool, default False
        Show progress (tau reached, kinks) on stderr.

    Attributes
    ----------
    kinks_ : ndarray of shape (n_kinks,)
        The tau values where an index changes set (0 first, 1 last).
    n_kinks_ : int
    diagnostics_ : dict
        Initial-solve epochs and violation, CG iterations, zero-length steps, refreshes,
        recoveries, the largest KKT drift seen, directions solved in the primal
        (``direction="dense"`` with |M| above the rank) and path time.
    coef_, intercept_ : the classifier at ``tau``.

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import QuantilePathSVC
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((200, 3)); y = np.where(X[:, 0] + 0.5 * rng.standard_normal(200) > 0, 1, -1)
    >>> path = QuantilePathSVC(alpha=1e-2).fit(X, y)
    >>> float(path.kinks_[0]), float(path.kinks_[-1])
    (0.0, 1.0)
    >>> p_low, p_high = (path.predict(X, tau=t).mean() for t in (0.1, 0.9))
    >>> bool(p_low > p_high)  # a higher false-positive cost predicts fewer positives
    True
    """

    _job_kinds = ("train", "evaluate")  # one path; its tau is chosen, not swept

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "fit_intercept": ["boolean"],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "tau": [Interval(Real, 0, 1, closed="both")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "drift_tol": [Interval(Real, 0, None, closed="neither")],
        "refresh_every": [Interval(Integral, 1, None, closed="left")],
        "max_kinks": [Interval(Integral, 1, None, closed="left")],
        "direction": [StrOptions({"auto", "dense", "cg"})],
        "events": [StrOptions({"candidates", "scan"})],
        "progress": ["boolean"],
    }

    def __init__(
        self,
        *,
        alpha=1e-4,
        fit_intercept=True,
        intercept_scaling=1.0,
        tau=0.5,
        tol=1e-11,
        drift_tol=1e-11,
        refresh_every=60,
        max_kinks=5_000_000,
        direction="auto",
        events="candidates",
        progress=False,
    ):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.tau = tau
        self.tol = tol
        self.drift_tol = drift_tol
        self.refresh_every = refresh_every
        self.max_kinks = max_kinks
        self.direction = direction
        self.events = events
        self.progress = progress

    # ------------------------------------------------------------------ fit
    def _design(self, X) -> sp.csr_matrix:
        X = sp.csr_matrix(X, dtype=np.float64)
        if self.fit_intercept:
            col = np.full((X.shape[0], 1), float(self.intercept_scaling))
            X = sp.hstack([X, sp.csr_matrix(col)], format="csr")
        X.sort_indices()
        return X

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Solve tau = 0, then follow the dual path to tau = 1.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), two classes (the larger is positive)
        sample_weight : array-like of shape (n_samples,), optional
            Non-negative weights multiplying each example's cost c_i(tau).

        Identical rows with the same label are merged into one weighted example first
        (exact: the primal only sees their summed cost); on binary data such as a9a
        this removes most ties that would otherwise make the path degenerate.
        """
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
        yy = binary_classes(self, y)
        n_rows = X.shape[0]
        sw = _check_sample_weight(sample_weight, X, dtype=np.float64)
        if (sw < 0).any() or not (sw > 0).any():
            raise ValueError(
                "sample_weight must be non-negative with at least one positive weight"
            )
        Xc = self._design(X)
        group, ng = _merge_rows(Xc, yy, sw)
        keep = np.zeros(ng, np.int64)
        keep[group[::-1]] = np.arange(n_rows)[::-1]  # first row of each group
        Xu = Xc[keep]
        yu = yy[keep]
        su = np.bincount(group, weights=sw, minlength=ng)
        live = su > 0
        if not live.all():  # groups of zero weight never enter the problem
            remap = np.cumsum(live) - 1
            group = np.where(live[group], remap[group], -1)
            Xu, yu, su = Xu[live], yu[live], su[live]
        if len(np.unique(yu)) < 2:
            raise ValueError(
                "both classes need a positive sample_weight; got weight only on "
                f"class {self.classes_[int(yu[0] > 0)]!r}"
            )
        n, d = Xu.shape
        kappa = 2.0 / (n_rows * self.alpha)
        dense = self.direction == "dense" or (
            self.direction == "auto" and d <= DENSE_MAX_D
        )
        Xt = (
            Xu.indptr.astype(np.int64),
            Xu.indices.astype(np.int64),
            Xu.data,
            yu,
            su,
        )
        t0 = time.perf_counter()
        sqn = np.empty(n)
        dual_cd.row_sq_norms(Xt[0], Xt[1], Xt[2], sqn)
        beta, w = np.zeros(n), np.zeros(d)
        status, epochs, viol = K.dcd_solve(
            Xt, sqn, kappa, 0.0, beta, w, self.tol, 100_000, 0
        )
        if status != dual_cd.CONVERGED:
            warnings.warn(
                f"QuantilePathSVC: the initial solve at tau = 0 stopped after {epochs} "
                f"epochs with KKT violation {viol:.2e} > tol = {self.tol:g}; the path "
                "starts from an inexact point (raise tol or alpha)",
                BigrateWarning,
                stacklevel=2,
            )
        g = np.empty(n)
        K.gradient_all(Xt, w, g)
        gtol = max(self.tol * 100, 1e-9)
        state = np.where(g < -gtol, K.L_SET, np.where(g > gtol, K.R_SET, K.M_SET))
        state = state.astype(np.int8)
        mlist = np.flatnonzero(state == K.M_SET).astype(np.int64)
        m = len(mlist)
        mlist = np.concatenate([mlist, np.zeros(n - m, np.int64)])
        mpos = np.full(n, -1, np.int64)
        mpos[mlist[:m]] = np.arange(m)
        beta[state == K.R_SET] = 0.0
        ub0 = np.where(yu > 0, su, 0.0)
        beta[state == K.L_SET] = ub0[state == K.L_SET]
        s_l = np.zeros(d)
        zbuf, lo, hi = np.zeros(n), np.zeros(n), np.zeros(n)
        K.resolve_margin(
            Xt, sqn, state, beta, 0.0, kappa, w, s_l, g, mlist, m, zbuf, lo, hi,
            self.tol, 100_000,
        )  # fmt: skip
        g[mlist[:m]] = 0.0

        scal = np.array([0.0, m, 0.0, -1.0])
        S = (state, beta, g, w, s_l, mlist, mpos, np.zeros(n), np.full(n, -1.0), scal)
        S += (sqn, np.zeros((4, d)), np.zeros(n, np.int64))
        W = (np.zeros(d),) + tuple(np.zeros(n) for _ in range(5))
        W += (np.zeros(d), np.zeros(n), np.zeros(n), np.zeros(n, np.int64))
        W += (np.zeros(n, np.int8), lo, hi, np.zeros(n))
        F = direction_work(Xt, d, dense)
        cap_k = 1024
        bufs = {
            "kink_tau": np.zeros(cap_k),
            "kink_bptr": np.zeros(cap_k + 1, np.int64),
            "bstore": np.zeros(max(4 * n, 1024)),
            "kink_cptr": np.zeros(cap_k + 1, np.int64),
            "cidx": np.zeros(max(4 * n, 1024), np.int64),
            "cto": np.zeros(max(4 * n, 1024), np.int8),
        }
        cnt = np.zeros(19, np.int64)
        diag = np.zeros(4)
        # kink 0: the initial solution, no changes
        bufs["bstore"][:m] = beta[np.sort(mlist[:m])]
        bufs["kink_bptr"][1] = m
        cnt[: K.N_CHANGES_USED] = (1, m)
        ck_kink, ck_cpos, ck_state = [0], [0], [state.copy()]
        self._plateau_from = None
        n_plateaus = 0
        LP = (np.zeros(n), np.zeros(n), np.zeros(n))
        V = (
            np.zeros(n, np.int64), np.zeros(n, np.int8), np.zeros(d), np.zeros(n),
            np.sqrt(sqn), np.zeros(n + 1, np.int64), np.empty_like(Xt[1]),
            np.empty_like(Xt[2]), np.zeros(n, np.int64), np.zeros(n, np.int8),
            np.zeros(d), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n),
            np.zeros(n, np.int64),
        )  # fmt: skip
        vs = np.zeros(K.V_NSLOTS)
        vs[K.V_MODE] = 1.0 if self.events == "candidates" else 0.0
        ck_every = max(256, n // 64)
        tols = (
            self.tol,
            self.tol,
            self.drift_tol,
            1e-10,
            float(self.refresh_every),
            10.0,
            float(d if dense else 0),
            float(GRAM_MAX_M),
            REBUILD_COST,
            float(KEPT_FACTOR_CALLS),
        )
        bar = Progress("quantile path (tau x 1000)", total=1000, enabled=self.progress)
        shown = 0
        # the direction's eigenproblems and Cholesky solves are 10^2-sized: one BLAS
        # thread. With more, OpenBLAS threads spin against any other busy process
        # (a second worker on the node): a9a 2,000 rows took 7.8 s instead of 3.1 s
        # with a benchmark running on the other core
        with threadpool_limits(limits=1, user_api="blas"):
            while True:
                O = (
                    bufs["kink_tau"], bufs["kink_bptr"], bufs["bstore"],
                    bufs["kink_cptr"], bufs["cidx"], bufs["cto"], cnt, diag,
                )  # fmt: skip
                chunk = max(1, min(ck_every, self.max_kinks + 1 - int(cnt[K.N_KINKS])))
                status = K.dpf_run(Xt, S, W, F, O, V, vs, kappa, chunk, tols)
                now = int(scal[K.AT_TAU] * 1000)
                if now > shown:
                    bar.update(
                        now - shown,
                        extra=f"{cnt[K.N_KINKS]} kinks, |M| = {int(scal[K.AT_M])}",
                    )
                    shown = now
                if status == K.DONE:
                    break
                if status == K.CHUNK:
                    ck_kink.append(int(cnt[K.N_KINKS]) - 1)
                    ck_cpos.append(int(cnt[K.N_CHANGES_USED]))
                    ck_state.append(state.copy())
                elif status == K.BUFFER_FULL:
                    _grow(bufs, cnt, n)
                elif status == K.PLATEAU:
                    _grow(bufs, cnt, n)
                    tau_a = float(scal[K.AT_TAU])
                    if _cross_plateau(Xt, S, bufs, cnt, kappa, self.tol, self.tol, LP):
                        vs[K.V_VALID] = 0.0  # new sets and w: rebuild the list
                        n_plateaus += 1
                        if scal[K.AT_TAU] >= 1.0:
                            self._plateau_from = tau_a
                            break
                elif status == K.STALLED:
                    raise RuntimeError(
                        f"QuantilePathSVC: more than {2 * n + 10} zero-length steps at "
                        f"tau = {scal[K.AT_TAU]:.12g} (a degenerate cycle among tied examples); "
                        "raise tol or add a little noise to duplicated rows"
                    )
                elif status == K.NOT_FINITE:
                    raise FloatingPointError(
                        f"QuantilePathSVC: non-finite weights at tau = {scal[K.AT_TAU]:.12g}; "
                        "the margin system is ill-conditioned: raise alpha"
                    )
                if cnt[K.N_KINKS] > self.max_kinks:
                    raise RuntimeError(
                        f"QuantilePathSVC: the path passed max_kinks = {self.max_kinks} "
                        f"kinks at tau = {scal[K.AT_TAU]:.6g}; raise max_kinks (memory grows "
                        "with kinks x |M|) or raise alpha"
                    )
        bar.close(extra=f"{cnt[K.N_KINKS]} kinks")
        plateau = getattr(self, "_plateau_from", None)
        nk = int(cnt[K.N_KINKS])
        self.kinks_ = _resized(bufs["kink_tau"], nk)
        self._kink_bptr = _resized(bufs["kink_bptr"], nk + 1)
        self._bstore = _resized(bufs["bstore"], int(cnt[K.N_BETA_USED]))
        self._kink_cptr = _resized(bufs["kink_cptr"], nk + 1)
        self._cidx = _resized(bufs["cidx"], int(cnt[K.N_CHANGES_USED]))
        self._cto = _resized(bufs["cto"], int(cnt[K.N_CHANGES_USED]))
        self._ck_kink = np.array(ck_kink, np.int64)
        self._ck_cpos = np.array(ck_cpos, np.int64)
        self._ck_state = np.stack(ck_state)
        self._Xp, self._Xi, self._Xd, self._y, self._sw = Xt
        self._group, self._row_weight = group, sw
        self._kappa = kappa
        self._n_margin, self._n_error, self._n_right = _set_counts(
            self._ck_state[0], self._cidx, self._cto, self._kink_cptr
        )
        self.n_kinks_ = nk
        self.diagnostics_ = {
            "init_epochs": int(epochs),
            "init_violation": float(viol),
            **{key: int(cnt[i]) for key, i in _COUNTERS.items()},
            "scan_share": float(cnt[K.N_ROWS_EXAMINED] + cnt[K.N_ROWS_REBUILT])
            / max(1.0, float(nk) * n),
            "max_kkt_drift": float(diag[0]),
            "path_seconds": time.perf_counter() - t0,
            "merged_rows": int(n_rows - n),
            "final_plateau_from": plateau,
            "plateaus_crossed": n_plateaus,
        }
        self._set_tau_attributes(self.tau)
        return self

    # ------------------------------------------------------------- recovery
    def _X(self):
        return (self._Xp, self._Xi, self._Xd, self._y, self._sw)

    def _state_at_kink(self, k: int) -> np.ndarray:
        c = int(np.searchsorted(self._ck_kink, k, side="right")) - 1
        state = self._ck_state[c].copy()
        K.replay(state, self._cidx, self._cto, self._ck_cpos[c], self._kink_cptr[k + 1])
        return state

    def _segment(self, tau: float):
        """(state, beta_M at the segment start, beta_M at its end, t in [0, 1])."""
        check_is_fitted(self, "kinks_")
        tau = float(tau)
        if not (0.0 <= tau <= 1.0):
            raise ValueError(
                f"tau must be in [0, 1] to recover a solution; got {tau!r}"
            )
        nk = len(self.kinks_)
        k = min(
            max(int(np.searchsorted(self.kinks_, tau, side="right")) - 1, 0), nk - 1
        )
        state = self._state_at_kink(k)
        b0 = self._bstore[self._kink_bptr[k] : self._kink_bptr[k + 1]]
        if k == nk - 1:
            return state, b0, b0, 0.0
        members = np.flatnonzero(state == K.M_SET)
        nxt = state.copy()
        K.replay(
            nxt, self._cidx, self._cto, self._kink_cptr[k + 1], self._kink_cptr[k + 2]
        )
        t1 = self.kinks_[k + 1]
        b1 = np.where(
            nxt[members] == K.L_SET,
            np.where(self._y[members] > 0, 1.0 - t1, t1) * self._sw[members],
            0.0,
        )
        stay = nxt[members] == K.M_SET
        if stay.any():
            nxt_members = np.flatnonzero(nxt == K.M_SET)
            vals = self._bstore[self._kink_bptr[k + 1] : self._kink_bptr[k + 2]]
            b1[stay] = vals[np.searchsorted(nxt_members, members[stay])]
        span = t1 - self.kinks_[k]
        t = (tau - self.kinks_[k]) / span if span > 0 else 0.0
        return state, b0, b1, min(max(t, 0.0), 1.0)

    def _w_at(self, tau: float) -> np.ndarray:
        state, b0, b1, t = self._segment(tau)
        w = np.zeros(self._n_features_design)
        K.coef_from_state(self._X(), state, b0, b1, float(tau), t, self._kappa, w)
        return w

    def dual_coef_at(self, tau: float) -> np.ndarray:
        """The dual solution alpha(tau) per training row (original scale, 0 <= alpha_i
        <= c_i(tau); a merged group's multiplier is shared in proportion to weight)."""
        state, b0, b1, t = self._segment(tau)
        beta = np.zeros(len(self._y))
        lmask = state == K.L_SET
        ub = np.where(self._y > 0, 1.0 - tau, tau) * self._sw
        beta[lmask] = ub[lmask]
        beta[state == K.M_SET] = (1.0 - t) * b0 + t * b1
        g = self._group
        share = np.where(g >= 0, self._row_weight / self._sw[np.maximum(g, 0)], 0.0)
        return beta[np.maximum(g, 0)] * share * 2.0 / len(g)

    def dual_objective_at(self, tau: float) -> float:
        """D(alpha) = 1/(2 lambda) alpha^T Q alpha - sum(alpha) at tau (minimised)."""
        alpha = self.dual_coef_at(tau)
        w = self._w_at(tau)
        return float(0.5 * self.alpha * (w @ w) - alpha.sum())

    def duality_gap_at(self, tau: float) -> float:
        """(P(w) + D(alpha)) / max(|D|, 1) at ``tau``, for the recovered primal w(tau)
        and dual alpha(tau): P(w) = lambda/2 |w|^2 + sum_i c_i(tau) hinge_i(w) (the
        intercept regularised, as in the fit). Weak duality makes P + D >= 0 for any w
        and feasible alpha, with equality only at the optimum, so a gap at rounding
        level certifies the recovered solution without another solver."""
        w = self._w_at(tau)
        y = self._y
        X = sp.csr_matrix((self._Xd, self._Xi, self._Xp), shape=(len(y), len(w)))
        cost = np.where(y > 0, 1.0 - tau, tau) * self._sw * 2.0 / len(self._group)
        primal = 0.5 * self.alpha * (w @ w) + cost @ np.maximum(0.0, 1.0 - y * (X @ w))
        dual = self.dual_objective_at(tau)
        return float((primal + dual) / max(abs(dual), 1.0))

    def coef_at(self, tau: float):
        """(coef of shape (n_features,), intercept) of the SVM at ``tau``."""
        w = self._w_at(tau)
        if self.fit_intercept:
            return w[:-1].copy(), float(w[-1] * self.intercept_scaling)
        return w, 0.0

    def _set_tau_attributes(self, tau):
        coef, b = self.coef_at(tau)
        self.coef_ = coef.reshape(1, -1)
        self.intercept_ = np.array([b])

    @property
    def _n_features_design(self) -> int:
        return self.n_features_in_ + int(bool(self.fit_intercept))

    def decision_function(self, X, tau=None):
        """Signed distance w(tau)^T x + b(tau); ``tau`` defaults to the ``tau`` parameter."""
        check_is_fitted(self, "kinks_")
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        coef, b = self.coef_at(self.tau if tau is None else tau)
        return np.asarray(X @ coef).ravel() + b

    def predict(self, X, tau=None):
        """The SVM's sign at ``tau``: ``classes_[1]`` where w(tau)^T x + b(tau) >= 0
        (the package's convention, :class:`~bigrate.base.RateClassifierMixin`)."""
        check_is_fitted(self, "kinks_")
        return self.classes_[(self.decision_function(X, tau) >= 0).astype(int)]

    def rate_target(self) -> dict:
        """``{"rho": ...}`` once :meth:`select_tau` chose tau for a false-alarm target,
        else ``{}``."""
        sel = getattr(self, "tau_selection_", None)
        return {"rho": float(sel["rho"])} if sel else {}

    def select_tau(self, X, y, *, rho: float, by: str = "J_val", taus=None) -> dict:
        """Choose the quantile ``predict`` uses, on held-out rows (X, y), for the
        false-alarm target ``rho``: ``by="J_val"``, the tau of least J_val = Pnd +
        max(0, Pfa - rho) / rho; ``by="pfa"``, the tau of least Pnd among those whose
        Pfa <= rho (the least Pfa if none is). ``taus``: where to look (default 201
        points on [0, 1]). Sets the ``tau`` parameter (and ``coef_``,
        ``intercept_``) and ``tau_selection_``: ``tau``, ``pfa``, ``pnd``, ``J_val``
        along ``taus`` on (X, y), ``rho``, ``by`` and the chosen ``tau_chosen``;
        returns it. No refit: the path holds every tau."""
        from bigrate.metrics import j_val, rate_metrics

        check_is_fitted(self, "kinks_")
        if by not in ("J_val", "pfa"):
            raise ValueError(f"by must be 'J_val' or 'pfa', got {by!r}")
        if not 0 < float(rho) < 1:
            raise ValueError(f"rho must be in (0, 1), got {rho!r}")
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        yy = np.where(np.asarray(y) == self.classes_[1], 1, -1)
        taus = np.linspace(0.0, 1.0, 201) if taus is None else np.asarray(taus, float)
        pfa, pnd = np.empty(len(taus)), np.empty(len(taus))
        for j, t in enumerate(taus):
            m = rate_metrics(yy, self.decision_function(X, tau=t))
            pfa[j], pnd[j] = m["pfa"], m["pnd"]
        jv = np.array([j_val(a, b, float(rho)) for a, b in zip(pfa, pnd, strict=True)])
        if by == "J_val":
            best = int(np.argmin(jv))
        else:
            ok = np.flatnonzero(pfa <= rho)
            best = int(ok[np.argmin(pnd[ok])]) if len(ok) else int(np.argmin(pfa))
        tau = float(taus[best])
        self.set_params(tau=tau)
        self._set_tau_attributes(tau)
        self.tau_selection_ = {"tau": taus, "pfa": pfa, "pnd": pnd, "J_val": jv,
                               "rho": float(rho), "by": by, "tau_chosen": tau}  # fmt: skip
        return self.tau_selection_

    # --------------------------------------------------------------- output
    def path_summary(self) -> dict:
        """Per kink: tau and the sizes of M (margin), L (error) and R (right)."""
        check_is_fitted(self, "kinks_")
        return {
            "tau": self.kinks_.copy(),
            "n_margin": self._n_margin.copy(),
            "n_error": self._n_error.copy(),
            "n_right": self._n_right.copy(),
        }

    def roc_path(self, X, y, taus=None) -> dict:
        """TPR and TNR of the classifier at each tau (default 101 points on [0, 1]) on
        (X, y); y in the classes seen in fit."""
        check_is_fitted(self, "kinks_")
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        y = np.asarray(y)
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if len(unknown):
            raise ValueError(
                f"y holds labels {unknown[:5].tolist()} not seen in fit "
                f"(classes {self.classes_.tolist()})"
            )
        pos = y == self.classes_[1]
        taus = np.linspace(0.0, 1.0, 101) if taus is None else np.asarray(taus, float)
        tpr, tnr = np.empty(len(taus)), np.empty(len(taus))
        for j, t in enumerate(taus):
            s = self.decision_function(X, tau=t) > 0
            tpr[j] = s[pos].mean() if pos.any() else np.nan
            tnr[j] = (~s[~pos]).mean() if (~pos).any() else np.nan
        return {"tau": taus, "tpr": tpr, "tnr": tnr}

    def plot_roc_path(self, X, y, path, *, taus=None, title=None) -> Path:
        """TPR and TNR against tau as a PNG (the paper's Figure 2)."""
        from bigrate._plot import pyplot, save_png

        r = self.roc_path(X, y, taus)
        fig, ax = pyplot().subplots(figsize=(5, 3.5))
        ax.plot(r["tau"], r["tpr"], label="TPR (sensitivity)")
        ax.plot(r["tau"], r["tnr"], label="TNR (specificity)")
        ax.set_xlabel("tau (share of cost on false positives)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title or f"quantile SVM path, {self.n_kinks_} kinks")
        ax.legend(loc="center right")
        return save_png(fig, path)

    # ---------------------------------------------------------- persistence
    _persist_private = (*(k for k in _ARRAYS if k.startswith("_")), "_kappa")

    def _after_load(self):
        self._set_tau_attributes(self.tau)


def _resized(a: np.ndarray, size: int) -> np.ndarray:
    """a with size elements (zeros past its old end), in place: realloc moves a large
    block's pages (mremap) instead of copying them into fresh pages, which fault in
    one by one (all of a9a: 160 MB of beta records, doubling from 4 n: copies and
    faults were 0.7 s of the path). Only for the growable buffers below, which no
    view outlives."""
    a.resize(size, refcheck=False)
    return a


def _grow(bufs: dict, cnt: np.ndarray, n: int) -> None:
    need = {
        "kink_tau": int(cnt[K.N_KINKS]) + 2,
        "bstore": int(cnt[K.N_BETA_USED]) + 2 * n,
        "cidx": int(cnt[K.N_CHANGES_USED]) + 2 * n,
    }
    if len(bufs["kink_tau"]) < need["kink_tau"] + 1:
        cap = 2 * len(bufs["kink_tau"])
        for key in ("kink_tau", "kink_bptr", "kink_cptr"):
            extra = 1 if key != "kink_tau" else 0
            bufs[key] = _resized(bufs[key], cap + extra)
    if len(bufs["bstore"]) < need["bstore"] + 1:
        cap = max(2 * len(bufs["bstore"]), need["bstore"] + 1)
        bufs["bstore"] = _resized(bufs["bstore"], cap)
    if len(bufs["cidx"]) < need["cidx"] + 1:
        cap = max(2 * len(bufs["cidx"]), need["cidx"] + 1)
        for key in ("cidx", "cto"):
            bufs[key] = _resized(bufs[key], cap)


def _set_counts(state0, cidx, cto, cptr):
    """|M|, |L|, |R| after each kink, by replaying the index changes once."""
    nk = len(cptr) - 1
    out = np.zeros((3, nk), np.int64)
    K.set_counts(state0.copy(), cidx, cto, cptr, out)
    return out[K.M_SET], out[K.L_SET], out[K.R_SET]


def _merge_rows(Xc: sp.csr_matrix, y: np.ndarray, sw: np.ndarray):
    """Group identical (row, label) pairs: (group id per row, number of groups)."""
    n = Xc.shape[0]
    h = np.empty(n, np.int64)
    ip, ix = Xc.indptr.astype(np.int64), Xc.indices.astype(np.int64)
    row_hashes(ip, ix, Xc.data, y, h)
    order = np.argsort(h, kind="stable")
    group = np.empty(n, np.int64)
    ng = merge_groups(ip, ix, Xc.data, y, order, h, group)
    return group, int(ng)


def _cross_plateau(Xt, S, bufs, cnt, kappa, tol, eps_tie, work) -> bool:
    """Where dw/dtau vanishes, jump to the far end of the plateau in one segment.

    w stays optimal at tau' exactly when some beta with the current gradient's signs
    reproduces it: with T the examples tied at the margin (|g| tiny, M among them) and
    L, R the others at their bounds, sum_T beta_i y_i x_i + sum_L ub_i(tau') y_i x_i
    = w / kappa and 0 <= beta_T <= ub_T(tau'). The boxes are linear in tau', so the
    set of such (beta_T, tau') is a polyhedron and the largest tau' is one linear
    programme (HiGHS); the interpolation of the current beta and the programme's beta
    is optimal on the whole segment. This replaces the many spurious kinks a dual
    degenerate over a large tie set makes, e.g. every positive on the margin of the
    constant classifier at tau = 0, or every negative at the end of the path. The
    programme's vertex has at most d multipliers strictly inside their boxes; the path
    follower resumes there. Returns True if tau moved."""
    from scipy.optimize import linprog

    state, beta, g, w, s_l, mlist, mpos, dbeta, tau_left, scal, sqn = S[: K.S_LSUM]
    indptr, indices, data, y, sw = Xt
    tau = float(scal[K.AT_TAU])
    n, d = len(y), len(w)
    a = np.where(y > 0, sw, 0.0)  # ub_i(tau) = a_i + b_i tau
    b = np.where(y > 0, -sw, sw)
    ub_a = a + b * tau
    beta_a = np.where(state == K.L_SET, ub_a, np.where(state == K.R_SET, 0.0, beta))
    beta_a = np.clip(beta_a, 0.0, ub_a)
    w_a, tmp = np.zeros(d), np.zeros(d)
    K.primal_from_sets(Xt, state, beta_a, tau, kappa, w_a, tmp)
    g_a = np.empty(n)
    K.gradient_all(Xt, w_a, g_a)
    gtol = max(100 * tol, 1e-9)
    tied = (state == K.M_SET) | (np.abs(g_a) <= gtol)
    T = np.flatnonzero(tied)
    Lo = np.flatnonzero((state == K.L_SET) & ~tied)
    X = sp.csr_matrix((data, indices, indptr), shape=(n, d))
    c0 = np.asarray(X[Lo].T @ (a[Lo] * y[Lo])).ravel()
    c1 = np.asarray(X[Lo].T @ (b[Lo] * y[Lo])).ravel()
    XT = sp.csc_matrix(X[T].T.multiply(y[T]))  # d x |T|
    A_eq = sp.hstack([XT, sp.csc_matrix(c1.reshape(-1, 1))], format="csc")
    b_eq = w_a / kappa - c0
    nt = len(T)
    A_ub = sp.hstack(
        [sp.identity(nt, format="csc"), sp.csc_matrix(-b[T].reshape(-1, 1))],
        format="csc",
    )
    cost = np.zeros(nt + 1)
    cost[-1] = -1.0
    bounds = np.zeros((nt + 1, 2))
    bounds[:nt, 1] = np.inf
    bounds[-1] = (tau, 1.0)
    res = linprog(
        cost, A_ub=A_ub, b_ub=a[T], A_eq=A_eq, b_eq=b_eq, bounds=bounds,
        method="highs",
        # presolve off: on all of a9a the plateau from tau = 0.755 to 0.995 is an LP
        # of 19,718 tied multipliers, each with a row tying its box to tau', which
        # HiGHS's presolve took 4.6 s of 5.2 s over; without it 0.63 s, same tau'
        options={"primal_feasibility_tolerance": 1e-10,
                 "dual_feasibility_tolerance": 1e-10, "presolve": False},
    )  # fmt: skip
    if res.status != 0 or res.x[-1] <= tau + eps_tie:
        return False
    tau_b = min(float(res.x[-1]), 1.0)
    ub_b = a + b * tau_b
    bt = np.clip(res.x[:nt], 0.0, ub_b[T])
    btol = 1e-12 * max(1.0, float(sw.max()))
    state_b = state.copy()
    state_b[T] = np.where(
        bt <= btol, K.R_SET, np.where(bt >= ub_b[T] - btol, K.L_SET, K.M_SET)
    )
    beta_b = np.where(state_b == K.L_SET, ub_b, 0.0)
    inside = state_b[T] == K.M_SET
    beta_b[T[inside]] = bt[inside]
    # polish: the margin multipliers at tau_b to the KKT tolerance
    m_b = np.flatnonzero(state_b == K.M_SET)
    z, lo, hi = work
    w_b, s_b, g_b = np.zeros(d), np.zeros(d), np.empty(n)
    K.resolve_margin(
        Xt, sqn, state_b, beta_b, tau_b, kappa, w_b, s_b, g_b, m_b.astype(np.int64),
        len(m_b), z, lo, hi, tol, 100_000,
    )  # fmt: skip
    # the segment [tau, tau_b]: every tied example in M, from beta_a to beta_b
    seg = state.copy()
    seg[T] = K.M_SET
    kc = int(cnt[K.N_KINKS])
    moved = np.flatnonzero(seg != state)
    c0_ = int(cnt[K.N_CHANGES_USED])
    bufs["cidx"][c0_ : c0_ + len(moved)] = moved
    bufs["cto"][c0_ : c0_ + len(moved)] = seg[moved]
    c1_ = c0_ + len(moved)
    members = np.flatnonzero(seg == K.M_SET)
    b0 = int(bufs["kink_bptr"][kc - 1])
    bufs["bstore"][b0 : b0 + len(members)] = beta_a[members]
    b1 = b0 + len(members)
    bufs["kink_bptr"][kc] = b1
    bufs["kink_cptr"][kc] = c1_
    # the kink at tau_b
    moved = np.flatnonzero(state_b != seg)
    bufs["cidx"][c1_ : c1_ + len(moved)] = moved
    bufs["cto"][c1_ : c1_ + len(moved)] = state_b[moved]
    c2 = c1_ + len(moved)
    bufs["bstore"][b1 : b1 + len(m_b)] = beta_b[m_b]
    bufs["kink_tau"][kc] = tau_b
    bufs["kink_bptr"][kc + 1] = b1 + len(m_b)
    bufs["kink_cptr"][kc + 1] = c2
    cnt[K.N_KINKS], cnt[K.N_BETA_USED], cnt[K.N_CHANGES_USED] = (
        kc + 1,
        b1 + len(m_b),
        c2,
    )
    # the follower resumes from the programme's vertex
    state[:] = state_b
    beta[:] = beta_b
    w[:] = w_b
    s_l[:] = s_b
    g[:] = g_b
    g[m_b] = 0.0
    mlist[: len(m_b)] = m_b
    mpos[:] = -1
    mpos[m_b] = np.arange(len(m_b))
    dbeta[:] = 0.0
    tau_left[:] = -1.0
    scal[:] = (tau_b, len(m_b), 0.0, tau_b)
    return True
