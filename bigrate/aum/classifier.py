"""AUMLinearClassifier: a linear model trained by gradient descent on the AUM with the
exact line search of :mod:`bigrate.aum.line_search` (Fowler and Hocking)."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate.aum.line_search import Breakpoints, aum_auc, aum_gradient, line_search
from bigrate.base import RateClassifierMixin, binary_classes


class AUMLinearClassifier(RateClassifierMixin, BaseEstimator):
    """Linear classifier trained by full-batch gradient descent on the AUM with an exact
    line search for the step size (Fowler and Hocking).

    Parameters
    ----------
    line_search : {"first-min", "linear", "quadratic", "grid"}
        "grid" evaluates 100 log-spaced step sizes by brute force (the baseline).
    bracket : bool, default True
        With "first-min": locate the minimum by a few O(n log n) evaluations first and
        follow the exact path only near it (:func:`line_search`, ``bracket=True``); the
        same step sizes, without processing the up to n^2 / 2 crossings before the
        minimum. False follows the path from step size 0.
    max_iter : int, default 100
    tol : float, default 1e-3
        Stop when the AUM decreases by less than tol (relative).
    validation : float in (0, 1) or None
        Hold out this share of rows, report its AUC per step in ``history_`` and keep the
        weights of the step with the best validation AUC. (For binary labels the AUM
        scales with ||w||, so descent also shrinks w: the validation AUC, not the AUM, is
        what to select on.)
    random_state : int or None
        Seed of the initial weights and of the validation split.

    Attributes
    ----------
    coef_, intercept_ : the linear model; ``predict`` is positive where
        ``X @ coef_ + intercept_ >= 0``.
    threshold_ : float
        The decision threshold, already folded into ``intercept_``: the AUM is blind to
        a shift of every score, so after descent the threshold is set where the
        training rows (those fitted, without the validation share) are classified with
        the fewest errors, FP + FN (:func:`min_error_threshold`).
    history_ : list of dict
        Per iteration: step size, AUM, training AUC, line-search work, validation AUC.

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate.aum import AUMLinearClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((300, 4)); y = np.where(X[:, 0] + X[:, 1] > 0, 1, -1)
    >>> clf = AUMLinearClassifier(random_state=0).fit(X, y)
    >>> clf.history_[-1]["train_auc"] > 0.95
    True
    >>> float(np.mean(clf.predict(X) == y)) > 0.9
    True
    """

    _sweep_select = "auc"

    _parameter_constraints: dict = {
        "line_search": [StrOptions({"first-min", "linear", "quadratic", "grid"})],
        "bracket": ["boolean"],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "validation": [Interval(Real, 0, 1, closed="neither"), None],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        *,
        line_search="first-min",
        bracket=True,
        max_iter=100,
        tol=1e-3,
        validation=None,
        random_state=None,
    ):
        self.line_search = line_search
        self.bracket = bracket
        self.max_iter = max_iter
        self.tol = tol
        self.validation = validation
        self.random_state = random_state

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
        yy = binary_classes(self, y)
        rng = np.random.default_rng(
            self.random_state if isinstance(self.random_state, int) else None
        )
        n = X.shape[0]
        val = np.zeros(n, bool)
        if self.validation:
            val[rng.permutation(n)[: int(round(self.validation * n))]] = True
        Xa = (
            sp.hstack([X, np.ones((n, 1))], format="csr")
            if sp.issparse(X)
            else np.hstack([X, np.ones((n, 1))])
        )
        Xt, yt = Xa[~val], yy[~val]
        bp = Breakpoints.binary(yt)
        bpv = Breakpoints.binary(yy[val]) if val.any() else None
        w = rng.standard_normal(Xa.shape[1]) * 1e-3
        self.history_ = []
        prev = None
        best_w, best_auc = w.copy(), -np.inf
        for it in range(self.max_iter):
            pred = Xt @ w
            g = aum_gradient(pred, bp)
            d = -(Xt.T @ g)
            pd = Xt @ d
            if self.line_search == "grid":
                grid = np.r_[0.0, np.logspace(-4, 4, 99)] / max(np.abs(pd).max(), 1e-12)
                vals = [aum_auc(pred + s * pd, bp)[0] for s in grid]
                step = float(grid[int(np.argmin(vals))])
                iters = len(grid)
                aum_now = float(min(vals))
            else:
                res = line_search(
                    bp, pred, pd, variant=self.line_search,
                    bracket=self.bracket and self.line_search == "first-min",
                )  # fmt: skip
                step = res.best_step()
                iters = res.intersections
                aum_now = float(res.aum_at(step))
            w = w + step * d
            tr_aum, tr_auc = aum_auc(Xt @ w, bp)
            rec = {
                "iteration": it + 1,
                "step_size": step,
                "aum": tr_aum,
                "train_auc": tr_auc,
                "line_search_iterations": iters,
                "predicted_aum": aum_now,
            }
            if bpv is not None:
                rec["validation_auc"] = aum_auc(Xa[val] @ w, bpv)[1]
                if rec["validation_auc"] > best_auc:
                    best_auc, best_w = rec["validation_auc"], w.copy()
            self.history_.append(rec)
            if step == 0.0 or (
                prev is not None and prev - tr_aum <= self.tol * max(prev, 1e-12)
            ):
                break
            prev = tr_aum
        if bpv is not None:  # keep the iterate of best validation AUC
            w = best_w
            self.best_validation_auc_ = best_auc
        # the AUM fixes the ranking only: place the decision threshold where the
        # training rows are classified with the fewest errors (FP + FN)
        self.threshold_ = min_error_threshold(yt, np.asarray(Xt @ w).ravel())
        self.coef_ = w[:-1].reshape(1, -1)
        self.intercept_ = np.array([w[-1] - self.threshold_])
        self.n_iter_ = len(self.history_)
        return self

    def decision_function(self, X):
        check_is_fitted(self, "coef_")
        X = validate_data(self, X, accept_sparse="csr", reset=False, dtype=np.float64)
        return np.asarray(X @ self.coef_.ravel()).ravel() + self.intercept_[0]


def min_error_threshold(y, s) -> float:
    """The threshold t minimising the training errors of the rule "positive iff
    s >= t": FN (positives below t) + FP (negatives at or above t), over every cut
    between distinct scores (and the cuts below and above all of them). The first
    minimiser is taken, placed halfway between the two scores it separates.

    Examples
    --------
    >>> import numpy as np
    >>> min_error_threshold(np.array([-1, -1, 1, 1]), np.array([0.0, 1.0, 2.0, 3.0]))
    1.5
    """
    y = np.asarray(y)
    s = np.asarray(s, dtype=np.float64)
    u, inv = np.unique(s, return_inverse=True)
    pos = np.bincount(inv, weights=(y > 0), minlength=len(u))
    neg = np.bincount(inv, weights=(y < 0), minlength=len(u))
    # cut k: positive iff s >= u[k] (k = len(u): nothing positive)
    fn = np.r_[0.0, np.cumsum(pos)]
    fp = neg.sum() - np.r_[0.0, np.cumsum(neg)]
    k = int(np.argmin(fn + fp))
    if k == 0:
        return float(u[0] - 1.0)
    if k == len(u):
        return float(u[-1] + 1.0)
    return float((u[k - 1] + u[k]) / 2)
