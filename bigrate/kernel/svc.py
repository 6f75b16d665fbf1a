"""Kernel SVMs on our SMO solver: the cost-sensitive 2C-SVM and the Neyman-Pearson SVM
(Gasso et al. 2011, Algorithms 1-3).

NP-SVM, one DC (CCCP) step at the current f_t (``../shared/docs/algorithms.md`` sec. 1):
with C_i = C / n+ for positives and lambda / n- for negatives, the ramp loss split
l = l1 - l2 and beta_i = 1 if y_i f_t(x_i) < -eta else 0, the convex problem

    min_f 1/2 ||f||^2 + sum_i C_i l1(y_i f(x_i)) + 1/(2 eta) sum_i C_i beta_i y_i f(x_i)

has the dual

    min_a 1/2 a^T Kt a - eta sum_i a_i   s.t.  sum_i y_i a_i = 0,
          -beta_i C_i <= 2 eta a_i <= (1 - beta_i) C_i,

f(x) = sum_i a_i y_i k(x_i, x) + b, and y_i f(x_i) = eta on the free a_i. Derivation: the
primal with slacks xi_i >= 0, xi_i >= (eta - y_i f_i) / (2 eta) has Lagrangian terms
mu_i (eta - y_i f_i)/(2 eta); substituting a_i = mu_i / (2 eta) - beta_i C_i / (2 eta)
(the linear term shifts the multiplier) gives w = sum a_i y_i phi(x_i), the box
0 <= mu_i <= C_i, i.e. -beta_i C_i <= 2 eta a_i <= (1 - beta_i) C_i, and the linear term
eta sum a_i after the constant is dropped. With beta = 0 it is the 2C-SVM with costs
C_i / (2 eta) scaled, which CostSensitiveSVC checks against scikit-learn's libsvm.

The multiplier is driven by the training false-alarm rate Pfa (negatives with f >= 0):
lambda <- lambda (1 + nu (Pfa - rho)), which keeps lambda > 0 (Alg. 1 and 3).
"""

from __future__ import annotations

import hashlib
import time
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate.base import RateClassifierMixin, binary_classes
from bigrate.data.reader import ShardedDataset
from bigrate.errors import BigrateWarning
from bigrate.kernel.smo import KERNELS, KernelProblem, cross_kernel, resolve_gamma
from bigrate.metrics import (
    auto_calibration_fraction,
    calibrated_pfa,
    np_quantile_threshold,
    np_threshold,
    np_umbrella_order,
)


class _KernelSVCBase(RateClassifierMixin, BaseEstimator):
    _parameter_constraints: dict = {
        "kernel": [StrOptions(set(KERNELS))],
        "gamma": [
            StrOptions({"scale", "auto"}),
            Interval(Real, 0, None, closed="neither"),
        ],
        "coef0": [Real],
        "degree": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "cache_mb": [Interval(Real, 0, None, closed="neither")],
    }

    def _data(self, X, y):
        if isinstance(X, (ShardedDataset, str)) and y is None:
            ds = X if isinstance(X, ShardedDataset) else ShardedDataset(X)
            whole = ds.to_csr("train")
            X, y = whole.X, whole.y
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the "
                "target y is None"
            )
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
        return X, binary_classes(self, y)

    def _problem(self, X):
        self.gamma_ = resolve_gamma(self.gamma, X)
        return KernelProblem(
            X,
            kernel=self.kernel,
            gamma=self.gamma_,
            coef0=self.coef0,
            degree=self.degree,
            cache_mb=self.cache_mb,
        )

    def _keep(self, X, y, alpha, b):
        sv = np.flatnonzero(np.abs(alpha) > 0)
        self.support_ = sv
        self.support_vectors_ = X[sv]
        self.dual_coef_ = (alpha[sv] * y[sv]).reshape(1, -1)
        self.intercept_ = np.array([b])
        self.n_support_ = np.array([int((y[sv] < 0).sum()), int((y[sv] > 0).sum())])

    def decision_function(self, X) -> np.ndarray:
        check_is_fitted(self, "dual_coef_")
        X = validate_data(self, X, accept_sparse="csr", reset=False, dtype=np.float64)
        return self._kernel_part(X) + self.intercept_[0]

    def _kernel_part(self, X) -> np.ndarray:
        """sum_i dual_coef_i K(sv_i, x): the decision without the intercept."""
        if len(self.support_) == 0:
            return np.zeros(X.shape[0])
        Kx = cross_kernel(
            self.support_vectors_, X, self.kernel, self.gamma_, self.coef0, self.degree
        )
        return self.dual_coef_.ravel() @ Kx


class CostSensitiveSVC(_KernelSVCBase):
    """The 2C-SVM (asymmetric-cost SVM) on our SMO solver:

        min_{w,b,xi} 1/2 ||w||^2 + C_pos sum_{y=+1} xi_i + C_neg sum_{y=-1} xi_i
        s.t. y_i (<w, phi(x_i)> + b) >= 1 - xi_i,  xi >= 0

    i.e. scikit-learn's ``SVC(C=1, class_weight={+1: C_pos, -1: C_neg})``.

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import CostSensitiveSVC
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(1, 1, (60, 2)), rng.normal(-1, 1, (60, 2))]
    >>> y = np.r_[np.ones(60), -np.ones(60)]
    >>> clf = CostSensitiveSVC(C_pos=1.0, C_neg=4.0).fit(X, y)
    >>> float(np.mean(clf.predict(X) == y)) > 0.85
    True
    """

    _sweep_select = "cost"

    _parameter_constraints: dict = {
        **_KernelSVCBase._parameter_constraints,
        "C_pos": [Interval(Real, 0, None, closed="neither")],
        "C_neg": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(
        self,
        *,
        C_pos=1.0,
        C_neg=1.0,
        kernel="rbf",
        gamma="scale",
        coef0=0.0,
        degree=3,
        tol=1e-3,
        max_iter=1_000_000,
        cache_mb=200.0,
    ):
        self.C_pos = C_pos
        self.C_neg = C_neg
        self.kernel = kernel
        self.gamma = gamma
        self.coef0 = coef0
        self.degree = degree
        self.tol = tol
        self.max_iter = max_iter
        self.cache_mb = cache_mb

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        X, yy = self._data(X, y)
        prob = self._problem(X)
        C = np.where(yy > 0, self.C_pos, self.C_neg)
        res = prob.solve(
            yy,
            np.ones_like(yy),
            np.zeros_like(yy),
            C,
            0.0,
            eps=self.tol,
            max_iter=self.max_iter,
        )
        self.objective_ = res.objective
        self.n_iter_ = res.n_iter
        self.cache_hit_rate_ = res.cache_hit_rate
        self._keep(X, yy, res.alpha, res.b)
        return self


# the KKT tolerance of the solves that only steer the multiplier search, over ``tol``
_LOOSE_TOL = 100.0


class NeymanPearsonSVC(_KernelSVCBase):
    """Kernel Neyman-Pearson SVM with the ramp loss (Gasso et al. 2011): minimise
    C * Pnd_hat + 1/2 ||f||^2 subject to Pfa_hat <= rho, solved by DC programming.

    Parameters
    ----------
    rho : float in (0, 1), default 0.1
    C : float > 0 or "auto", default "auto"
        Weight of the miss rate (C+ = C / n+; the negatives' cost is lambda / n-). "auto"
        is n, the number of training rows, so that per-example costs are about those of
        an SVC with C = 1.
    eta : float > 0, default 1.0
        Half-width of the ramp (margin of the free support vectors).
    nu : float > 0, default 1.0
        Multiplier gain of the paper's update (``multiplier_update="gain"``):
        lambda <- lambda (1 + nu (Pfa - rho)).
    multiplier_update : {"bracket", "gain"}, default "bracket"
        "bracket": lambda is moved towards the band rho +- epsilon (aimed at rho by
        the slope of logit(Pfa) in log lambda over the last two steps, at most by
        growing factors 2, 4, 8, 16) until the training Pfa has been seen on both
        sides of the band, then by secant steps in log lambda inside that bracket
        (safeguarded towards its middle); when the bracket closes without Pfa
        entering the band (Pfa jumps across it, as for a near-constant classifier at
        small C), the fit ends at the bracket's feasible end (Pfa <= rho). The number
        of DC steps then stays about the same over the whole C range. "gain": the paper's multiplicative rule with ``nu``; from a
        start where Pfa = 0 it shrinks lambda by at most (1 - rho) a step (tens of
        steps at large C), and at small C it may never settle.
    method : {"annealed", "uzawa"}
        "annealed" (Alg. 3): one warm-started dual solve per iteration, then beta and
        lambda are updated; "uzawa" (Alg. 1): Alg. 2 run to a stable beta for each lambda.
    epsilon : float, default 0.01
        Stop when |Pfa - rho| <= epsilon and beta is stable.
    max_iter : int, default 200
        Outer iterations (DC steps); ``smo_max_iter`` bounds each dual solve.
    calibrate : {"auto", "quantile", "umbrella", None}, default "auto"
        Hold out ``calibration_fraction`` of the negatives (drawn with
        ``random_state``, 0 if None), train on the rest, then move the threshold so that f >= 0
        exactly when the score exceeds a threshold t of the held-out negatives' scores:
        "quantile", the order statistic whose false-alarm rate on new data is at most
        rho on average (:func:`bigrate.metrics.np_quantile_threshold`; the plain
        empirical (1 - rho) quantile overshoots rho by (1 - rho) / (m + 1) on average
        with m held-out negatives); "umbrella", the NP
        umbrella order statistic (:func:`bigrate.metrics.np_umbrella_threshold`): Pfa on
        new data <= rho with probability >= 1 - ``delta`` over the held-out draw (needs
        at least log(delta) / log(1 - rho) held-out negatives: 59 at rho 0.05);
        "auto", the umbrella threshold where the held-out negatives are enough, else
        the "quantile" one with a warning (:func:`bigrate.metrics.np_threshold`); None:
        no hold-out, the training constraint only. ``guarantee_`` says which a fit
        got.
    calibration_fraction : "auto" or float in (0, 1), default "auto"
        The share of the negatives held out. "auto": 0.3, or what the umbrella
        threshold needs where at most 60% of them give it
        (:func:`bigrate.metrics.auto_calibration_fraction`); ``calibration_fraction_``
        says what a fit used.
    delta : float in (0, 1), default 0.05
    warm_start : bool, default False
        When refitted on the same data (same rows, labels and kernel) after a change of
        ``C`` (or ``rho``), start from the previous fit: its duals and multiplier scaled
        by the ratio of the C values, its beta, and its kernel-row cache; as
        scikit-learn's ``warm_start``. A sweep along C (:class:`NPSearchCV` with
        ``warm_start=True``) then pays the kernel rows once. The DC problem is not
        convex: a warm start may end at another local solution than a cold one. Keeps
        the kernel cache (up to ``cache_mb``) alive with the fitted estimator.

    Attributes
    ----------
    multiplier_ : float
    history_ : list of dict
        Per iteration: lambda, training Pfa / Pnd, ramp loss, SMO iterations and KKT gap,
        cache hit rate, beta changes, and ``dc_objectives``: the primal objective
        1/2 ||f||^2 + sum C_i ramp(y_i f_i) after each DC step at that lambda (one step
        for "annealed"; until beta is stable for "uzawa"), non-increasing (CCCP).
    threshold_shift_ : float
        With ``calibrate``: the change of the intercept made by the calibration.
    n_calibration_ : int
        With ``calibrate``: the number of held-out negatives.
    calibration_rows_ : ndarray of int
        With ``calibrate``: the rows of X held out (not trained on).
    training_rho_ : float
        The training false-alarm rate the fit aimed at: rho without ``calibrate``;
        with it, the mean false-alarm rate on new data of the threshold the held-out
        negatives will set (:func:`bigrate.metrics.calibrated_pfa`: 1/60 for 59 of
        them at rho 0.05), known from their number alone, so that the model is
        trained for the operating point it will have (held-out Pnd on the breast
        cancer sets 0.19 -> 0.06 at rho 0.1, BENCHMARKS).
    guarantee_ : dict
        What this fit promises on new data: ``kind`` "umbrella" (P(Pfa > rho) <=
        delta), "expected" (Pfa <= rho on average), "none" (too few held-out
        negatives to set a threshold) or "training" (calibrate=None), with ``rho``,
        ``delta``, ``n_calibration`` and ``text``.

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import NeymanPearsonSVC
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(1, 1, (100, 2)), rng.normal(-1, 1, (100, 2))]
    >>> y = np.r_[np.ones(100), -np.ones(100)]
    >>> clf = NeymanPearsonSVC(rho=0.1, random_state=0).fit(X, y)
    >>> float(np.mean(clf.decision_function(X[y < 0]) >= 0)) <= 0.12
    True
    """

    _rate_target = "rho"
    _sweep_select = "J_val"

    _parameter_constraints: dict = {
        **_KernelSVCBase._parameter_constraints,
        "rho": [Interval(Real, 0, 1, closed="neither")],
        "C": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "eta": [Interval(Real, 0, None, closed="neither")],
        "nu": [Interval(Real, 0, None, closed="neither")],
        "multiplier_update": [StrOptions({"bracket", "gain"})],
        "method": [StrOptions({"annealed", "uzawa"})],
        "epsilon": [Interval(Real, 0, 1, closed="left")],
        "smo_max_iter": [Interval(Integral, 1, None, closed="left")],
        "calibrate": [StrOptions({"auto", "quantile", "umbrella"}), None],
        "calibration_fraction": [
            StrOptions({"auto"}),
            Interval(Real, 0, 1, closed="neither"),
        ],
        "delta": [Interval(Real, 0, 1, closed="neither")],
        "warm_start": ["boolean"],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        *,
        rho=0.1,
        C="auto",
        kernel="rbf",
        gamma="scale",
        coef0=0.0,
        degree=3,
        eta=1.0,
        nu=1.0,
        multiplier_update="bracket",
        method="annealed",
        epsilon=0.01,
        tol=1e-3,
        max_iter=200,
        smo_max_iter=1_000_000,
        cache_mb=200.0,
        calibrate="auto",
        calibration_fraction="auto",
        delta=0.05,
        random_state=None,
        warm_start=False,
    ):
        self.rho = rho
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.coef0 = coef0
        self.degree = degree
        self.eta = eta
        self.nu = nu
        self.multiplier_update = multiplier_update
        self.method = method
        self.epsilon = epsilon
        self.tol = tol
        self.max_iter = max_iter
        self.smo_max_iter = smo_max_iter
        self.cache_mb = cache_mb
        self.calibrate = calibrate
        self.calibration_fraction = calibration_fraction
        self.delta = delta
        self.random_state = random_state
        self.warm_start = warm_start

    def _warm_state(self, X, yy):
        """With ``warm_start``: (a digest of the rows, labels and kernel parameters, the
        previous fit's state if its digest is the same: the kernel-row cache is only valid
        for them); without it (None, None), at no cost."""
        if not self.warm_start:
            return None, None
        h = hashlib.sha256()
        for arr in ((X.indptr, X.indices, X.data) if sp.issparse(X) else (X,)) + (yy,):
            h.update(np.ascontiguousarray(arr).tobytes())
        # the kernel's parameters as given: on the same X, "scale" resolves the same
        h.update(
            repr((self.kernel, self.gamma, self.coef0, self.degree, X.shape)).encode()
        )
        key = h.hexdigest()
        prev = getattr(self, "_warm", None)
        return key, (prev if prev is not None and prev["key"] == key else None)

    def _costs(self, y, lam, n_pos, n_neg):
        return np.where(y > 0, self.C_ / n_pos, lam / n_neg)

    def _boxes(self, C, beta):
        two_eta = 2.0 * self.eta
        return -beta * C / two_eta, (1.0 - beta) * C / two_eta

    def _in_band(self, pfa: float) -> bool:
        """|Pfa - rho| <= epsilon, up to the rounding of rho +- epsilon."""
        return abs(pfa - self.training_rho_) <= self.epsilon + 1e-12

    def _dc_objective(self, f, y, C):
        """The ramp-loss objective 1/2 ||f||^2 + sum C_i ramp(y_i f_i) at the iterate."""
        z = y * f
        ramp = np.clip((self.eta - z) / (2 * self.eta), 0.0, 1.0)
        return float(C @ ramp)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        t0 = time.perf_counter()
        X, yy = self._data(X, y)
        neg = np.flatnonzero(yy < 0)
        frac = self.calibration_fraction
        if frac == "auto":  # exactly m held out: no spare needed
            frac = auto_calibration_fraction(len(neg), self.rho, self.delta)
        self.calibration_fraction_ = float(frac) if self.calibrate else 0.0
        m = int(round(frac * len(neg)))
        calibrate = self.calibrate
        if calibrate == "auto" and (m < 1 or m >= len(neg)):
            calibrate = None  # too few negatives to hold any out: said below
        self.training_rho_ = float(self.rho)
        if calibrate is None:
            self._fit_np(X, yy)
            self.guarantee_ = {
                "kind": "training", "rho": float(self.rho), "delta": None,
                "n_calibration": 0,
                "text": f"Pfa <= {self.rho:g} on the training data only",
            }  # fmt: skip
            if self.calibrate == "auto":  # warns: too few to set any threshold
                self.guarantee_ = np_threshold(np.zeros(0), self.rho, self.delta)[1]
        else:
            if m < 1 or m >= len(neg):
                raise ValueError(
                    f"calibration_fraction={self.calibration_fraction} of {len(neg)} "
                    "negatives leaves no held-out or no training negative"
                )
            # enough held-out negatives? (checked before fitting)
            if calibrate == "umbrella":
                np_umbrella_order(m, self.rho, self.delta)
            elif calibrate == "quantile":
                np_quantile_threshold(np.zeros(m), self.rho)
            # trained for the false-alarm rate the calibrated threshold will have on
            # average (known from m alone, so the guarantee is the same): at rho, the
            # ramp loss gives up on the hardest rho of the negatives, exactly those a
            # threshold well under rho must rank low
            self.training_rho_ = calibrated_pfa(m, self.rho, self.delta, calibrate)
            # the same rows every fit unless random_state says otherwise (a warm start
            # along C refits on the same rows)
            seed = 0 if self.random_state is None else self.random_state
            rng = check_random_state(seed)
            held = np.zeros(len(yy), bool)
            held[rng.choice(neg, m, replace=False)] = True
            self._fit_np(X[~held], yy[~held])
            # the decision without its intercept, computed as decision_function
            # does, so that moving the intercept moves every score by exactly it
            raw = self._kernel_part(X[held])
            if calibrate == "quantile":
                t = np_quantile_threshold(raw, self.rho)
                self.guarantee_ = {
                    "kind": "expected", "rho": float(self.rho), "delta": None,
                    "n_calibration": m,
                    "text": f"Pfa <= {self.rho:g} on new data on average (the order "
                            f"statistic of {m:,} held-out negatives)",
                }  # fmt: skip
            else:  # umbrella, or auto: the umbrella where they are enough
                t, self.guarantee_ = np_threshold(raw, self.rho, self.delta)
            self.threshold_shift_ = 0.0
            if t is not None:
                b_new = -np.nextafter(t, np.inf)
                self.threshold_shift_ = float(b_new - self.intercept_[0])
                self.intercept_ = np.array([b_new])
            self.n_calibration_ = m
            self.calibration_rows_ = np.flatnonzero(held)
            self.support_ = np.flatnonzero(~held)[self.support_]  # rows of X
        self.fit_seconds_ = time.perf_counter() - t0
        return self

    def _fit_np(self, X, yy):
        n_pos, n_neg = int((yy > 0).sum()), int((yy < 0).sum())
        key, warm = self._warm_state(X, yy)
        self.C_ = float(len(yy)) if self.C == "auto" else float(self.C)
        if warm is None:
            self._warm = None  # a cold fit frees an earlier cache first
            prob = self._problem(X)
            lam = self.C_ * n_neg / n_pos  # C+ = C- at the start (Alg. 3)
            beta = np.zeros_like(yy)
            alpha = Qa = None
        else:  # the previous fit's solution, scaled to this C (boxes scale with C)
            prob = warm["prob"]
            self.gamma_ = prob.gamma
            r = self.C_ / warm["C"]
            lam = warm["lam"] * r
            beta = warm["beta"].copy()
            alpha, Qa = warm["alpha"] * r, warm["Qa"] * r
        self.warm_started_ = warm is not None
        p = np.full_like(yy, self.eta)
        self.history_ = []
        converged = False
        f = np.zeros_like(yy)
        b = 0.0
        search = (
            _MultiplierSearch(self.training_rho_, self.epsilon)
            if self.multiplier_update == "bracket"
            else None
        )
        band_run = 0
        # the previous fit's Pfa says how far from the band it starts only at its C
        last_pfa = warm["pfa"] if warm is not None and warm["C"] == self.C_ else None
        for it in range(self.max_iter):
            C = self._costs(yy, lam, n_pos, n_neg)
            # out of the band (or before the first Pfa is known), the solve only
            # steers the multiplier search: a 100x looser KKT tolerance does; every
            # fit ends on solves at ``tol`` (a step inside the band is solved at it)
            loose = (
                search is not None
                and not search.final
                and (last_pfa is None or not self._in_band(last_pfa))
            )
            smo_tol = _LOOSE_TOL * self.tol if loose else self.tol
            inner = 0
            dc_obj = []
            while True:  # Alg. 2 (uzawa: to a stable beta; annealed: a single solve)
                lo, hi = self._boxes(C, beta)
                res = prob.solve(
                    yy,
                    p,
                    lo,
                    hi,
                    0.0,
                    alpha0=alpha,
                    Qa0=Qa,
                    eps=smo_tol,
                    max_iter=self.smo_max_iter,
                )
                alpha, b = res.alpha, res.b
                Qa = res.gradient + p  # Q alpha, kept for the next warm start
                f, fnorm2 = yy * Qa + b, float(alpha @ Qa)
                dc_obj.append(0.5 * fnorm2 + self._dc_objective(f, yy, C))
                new_beta = (yy * f < -self.eta).astype(float)
                changed = int((new_beta != beta).sum())
                beta = new_beta
                inner += 1
                if self.method == "annealed" or changed == 0 or inner >= 50:
                    break
            pfa = float(np.mean(f[yy < 0] >= 0))
            pnd = float(np.mean(f[yy > 0] <= 0))
            last_pfa = pfa
            self.history_.append(
                {
                    "iteration": it + 1,
                    "lambda": lam,
                    "pfa": pfa,
                    "pnd": pnd,
                    "ramp_loss": self._dc_objective(f, yy, C),
                    "smo_iterations": res.n_iter,
                    "smo_gap": res.gap,
                    "smo_tol": smo_tol,
                    "cache_hit_rate": res.cache_hit_rate,
                    "beta_changes": changed,
                    "dual_objective": res.objective,
                    "dc_objectives": dc_obj,
                }
            )
            in_band = self._in_band(pfa)
            band_run = band_run + 1 if in_band else 0
            # beta stable; or, with the bracket search, the band held for 10 DC steps
            # while one or two betas keep flipping (a cycle of the inexact solves)
            done = (
                in_band
                and not loose
                and (changed == 0 or (search is not None and band_run >= 10))
            )
            if search is not None and search.final and changed == 0:
                # Pfa jumps across the band: settled on its feasible side (converged);
                # no multiplier brings Pfa near rho: stop (not converged); the
                # feasible end turned infeasible (the DC iterates moved): search on
                done = pfa <= self.training_rho_ + self.epsilon
                if not done and search.exhausted:
                    break
                search.reopen()
            if done and it > 0:
                converged = True
                break
            if search is None:  # the paper's rule
                lam = max(lam * (1.0 + self.nu * (pfa - self.training_rho_)), 1e-12)
            else:
                lam = search.next(lam, pfa, settled=changed == 0)
        if not converged:
            warnings.warn(
                f"NeymanPearsonSVC did not converge in max_iter={self.max_iter} iterations: "
                f"training Pfa {pfa:.4f} vs {self.training_rho_:.4g} (rho={self.rho}, "
                "see training_rho_); raise max_iter or nu",
                BigrateWarning,
                stacklevel=2,
            )
        self.multiplier_ = lam
        self.n_iter_ = len(self.history_)
        self.converged_ = converged
        self._keep(X, yy, alpha, b)
        if self.warm_start:
            self._warm = {"key": key, "prob": prob, "C": self.C_, "lam": lam,
                          "beta": beta, "alpha": alpha, "Qa": Qa,
                          "pfa": pfa}  # fmt: skip
        else:
            self._warm = None


def _logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))


class _MultiplierSearch:
    """The "bracket" multiplier update of :class:`NeymanPearsonSVC`: find lambda with
    the training Pfa in [rho - epsilon, rho + epsilon], Pfa decreasing in lambda (more
    weight on the negatives) up to the DC iterations' noise."""

    def __init__(self, rho: float, epsilon: float):
        self.rho, self.eps = rho, epsilon
        self.lo = self.hi = None  # (lambda, Pfa): Pfa above the band / below it
        self.run = 0  # consecutive steps on the same side before a bracket exists
        self.final = False  # the bracket closed: the last solve is at its feasible end
        self.last_side = None  # side of the band of the previous bracketed step
        self.same_side = 0  # bracketed steps in a row on that side
        self.rechecked = False  # the far end was measured again in this bracket
        self.exhausted = False  # expanded as far as allowed without finding the band
        self.prev = None  # (lambda, Pfa) of the previous expansion step

    def reopen(self) -> None:
        """The solve at the bracket's feasible end came out infeasible: drop that end
        and go on searching."""
        self.final = False
        self.hi = None
        self.run = 0
        self.rechecked = False
        self.prev = None

    def next(self, lam: float, pfa: float, settled: bool) -> float:
        above = pfa > self.rho + self.eps + 1e-12
        below = pfa < self.rho - self.eps - 1e-12
        if above and (self.lo is None or lam >= self.lo[0]):
            self.lo = (lam, pfa)
        if below and (self.hi is None or lam <= self.hi[0]):
            self.hi = (lam, pfa)
        if self.lo is not None and self.hi is not None and self.lo[0] >= self.hi[0]:
            # contradictory (the DC iterates moved): keep the newest side only and
            # expand from it in small steps again
            if above:
                self.hi = None
            else:
                self.lo = None
            self.run = 0
            self.last_side, self.same_side = None, 0
            self.rechecked = False
            self.prev = None
        if not (above or below):  # inside the band: wait for beta to settle
            return lam
        if self.lo is None or self.hi is None:  # expand towards the band
            self.run += 1
            if self.run > 12:  # lambda moved ~1e13-fold: the band is out of reach
                self.final = self.exhausted = True
                self.prev = None
                return lam
            step = np.log(2.0) * min(self.run, 4)  # growing factors 2, 4, 8, 16
            if self.prev is not None and self.prev[0] != lam:
                # the last two steps on this side give the slope of logit(Pfa) in
                # log lambda (of Pfa itself where one is 0 or 1): aim at rho with it,
                # never beyond the growing factor
                inside = 0 < min(pfa, self.prev[1]) and max(pfa, self.prev[1]) < 1
                g = _logit if inside else float
                slope = (g(pfa) - g(self.prev[1])) / (
                    np.log(lam) - np.log(self.prev[0])
                )
                if slope < 0:
                    need = abs(g(pfa) - g(self.rho)) / -slope
                    step = min(max(need, np.log(1.1)), step)
            self.prev = (lam, pfa)
            return float(lam * np.exp(step) if above else lam / np.exp(step))
        self.prev = None
        (l0, p0), (l1, p1) = self.lo, self.hi
        if l1 / l0 <= 1.0 + 1e-3:  # closed without Pfa entering the band
            self.final = True
            return l1
        a, b = np.log(l0), np.log(l1)
        side = "above" if above else "below"
        self.same_side = self.same_side + 1 if side == self.last_side else 1
        self.last_side = side
        if self.same_side == 3 and not self.rechecked:
            # three steps in a row on one side: the other end was measured on earlier
            # DC iterates and may no longer hold; measure it again, once a bracket (if
            # it moved to this side, the bracket is dropped and the search expands from
            # there; if not, a true jump, bisection goes on)
            self.rechecked = True
            return float(l1 if above else l0)
        if self.same_side > 1:  # the secant stalls on one side (e.g. a jump): bisect
            x = 0.5 * (a + b)
        else:
            g0, g1 = p0 - self.rho, p1 - self.rho  # > 0 and < 0
            x = a + (b - a) * g0 / (g0 - g1)  # secant in log lambda
            x = min(max(x, a + 0.1 * (b - a)), b - 0.1 * (b - a))
        return float(np.exp(x))
