"""Training with dataset constraints (Goh et al. 2016), restated in
``../shared/docs/algorithms.md`` sec. 3.

Rates use the ramp sigma(t) = max(0, min(1, 1/2 + t)) of the score z = w^T x + b (this
module keeps the usual ``+ b``; the paper writes ``- b``): s_p(D) = mean sigma(z),
s_n(D) = mean sigma(-z). Problem 2: minimise ``alpha/2 ||w||^2 + objective`` subject to
``constraint_j <= 0``, each a non-negative combination of rates plus a constant
(:mod:`bigrate.constraints` normalises them).

Algorithm 1 (majorisation-minimisation): at the current scores z', each s_p term is
bounded by the convex, tight hinge max(0, 1/2 + z) where z' <= 1/2 and by the constant 1
elsewhere (mirror image for s_n). For fixed multipliers v >= 0 the bound problem is a
weighted hinge SVM with margin 1/2 (solved exactly by dual coordinate descent, a numba
kernel shared with the quantile path); the multipliers maximise the concave dual by
bisection (one constraint) or Kelley's cutting planes (Algorithm 2). Each MM step starts
from the previous iterate, so from a feasible start the ramp objective never increases.
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate._validation import binary_classes
from bigrate.constraints import Constraint, Expr, Subset
from bigrate.errors import BigrateWarning
from bigrate.path import _quantile_kernels as QK


def ramp(t):
    return np.clip(0.5 + t, 0.0, 1.0)


class _Data:
    """Every dataset stacked into one CSR (bias column appended), with row ranges."""

    def __init__(self, X, y, groups, datasets, intercept_scaling):
        blocks, self.ranges, self.labels, self.groups, self.raw = [], {}, {}, {}, {}
        start = 0
        items = [("train", {"X": X, "y": y, "groups": groups})]
        for name, spec in (datasets or {}).items():
            if name == "train":
                raise ValueError('datasets: the name "train" is reserved for fit(X, y)')
            if not isinstance(spec, dict):
                spec = {"X": spec}
            unknown = set(spec) - {"X", "y", "groups"}
            if unknown:
                raise ValueError(
                    f"datasets[{name!r}]: unknown keys {sorted(unknown)}; "
                    "expected X and optionally y, groups"
                )
            items.append((name, spec))
        for name, spec in items:
            Xd = spec["X"]
            Xd = (
                sp.csr_matrix(Xd, dtype=np.float64)
                if sp.issparse(Xd)
                else np.asarray(Xd, dtype=np.float64)
            )
            if Xd.ndim != 2 or Xd.shape[0] == 0:
                raise ValueError(f"dataset {name!r} is empty or not 2-D")
            if Xd.shape[1] != X.shape[1]:
                raise ValueError(
                    f"dataset {name!r} has {Xd.shape[1]} features; fit's X has "
                    f"{X.shape[1]}"
                )
            vals = Xd.data if sp.issparse(Xd) else Xd
            if not np.isfinite(vals).all():
                raise ValueError(f"dataset {name!r} contains NaN or infinity")
            n = Xd.shape[0]
            self.raw[name] = Xd
            self.ranges[name] = (start, start + n)
            if spec.get("y") is not None:
                self.labels[name] = np.asarray(spec["y"], float)
            if spec.get("groups") is not None:
                g = np.asarray(spec["groups"])
                if len(g) != n:
                    raise ValueError(
                        f"dataset {name!r}: groups has {len(g)} entries for {n} rows"
                    )
                self.groups[name] = g
            col = sp.csr_matrix(np.full((n, 1), float(intercept_scaling)))
            blocks.append(sp.hstack([sp.csr_matrix(Xd), col], format="csr"))
            start += n
        self.X = sp.vstack(blocks, format="csr")
        self.X.sort_indices()
        self.n = start

    def rows(self, s: Subset, what: str) -> np.ndarray:
        if s.dataset not in self.ranges:
            raise ValueError(
                f"{what}: dataset {s.dataset!r} was not given to fit (known: "
                f"{sorted(self.ranges)})"
            )
        a, b = self.ranges[s.dataset]
        keep = np.ones(b - a, bool)
        if s.group is not None:
            if s.dataset not in self.groups:
                raise ValueError(
                    f"{what}: group {s.group!r} needs groups for dataset {s.dataset!r}"
                )
            g = self.groups[s.dataset]
            if not (g == s.group).any():
                raise ValueError(
                    f"{what}: group {s.group!r} is absent from dataset {s.dataset!r} "
                    f"(groups present: {np.unique(g)[:10].tolist()})"
                )
            keep &= g == s.group
        if s.label is not None:
            if s.dataset not in self.labels:
                raise ValueError(
                    f"{what}: needs labels but dataset {s.dataset!r} is unlabeled"
                )
            keep &= self.labels[s.dataset] == s.label
        if s.mask is not None:
            if len(s.mask) != b - a:
                raise ValueError(
                    f"{what}: mask has {len(s.mask)} entries for the {b - a} rows of "
                    f"dataset {s.dataset!r}"
                )
            keep &= s.mask
        if s.baseline is not None:
            pred = np.asarray(s.baseline.decision_function(self.raw[s.dataset])) > 0
            keep &= pred if s.baseline_sign > 0 else ~pred
        return a + np.flatnonzero(keep)


class _Compiled:
    """An expression as non-negative terms (rows, sign, weight) plus a constant."""

    def __init__(self, expr: Expr, data: _Data, what: str):
        self.terms, self.const = [], float(expr.const)
        for t in expr.terms:
            rows = data.rows(t.subset, what)
            if t.scale == "rate":
                if len(rows) == 0:
                    raise ValueError(
                        f"{what}: the rate on [{t.subset.describe()}] has no rows"
                    )
                eff = t.coef
            elif t.scale == "share":
                parent = data.rows(t.parent, what)
                if len(parent) == 0:
                    raise ValueError(f"{what}: [{t.parent.describe()}] has no rows")
                eff = t.coef * len(rows) / len(parent)
            else:
                eff = t.coef * len(rows)
            if len(rows) == 0 or eff == 0.0:
                continue
            sign = 1.0 if t.kind == "p" else -1.0
            if eff < 0:  # eff s = eff (1 - s_mirror) = eff + |eff| s_mirror
                self.const += eff
                sign, eff = -sign, -eff
            self.terms.append((rows, sign, eff))

    def value(self, z, deterministic=False):
        v = self.const
        for rows, sign, w in self.terms:
            t = sign * z[rows]
            v += w * ((t > 0).mean() if deterministic else ramp(t).mean())
        return float(v)

    def bound(self, z_now, n):
        """Majoriser at z_now: per-row hinge weights A (2 x n; row 0 label -1, row 1
        label +1) and the constant from rows on the flat branch."""
        A = np.zeros((2, n))
        c = self.const
        for rows, sign, w in self.terms:
            t = sign * z_now[rows]
            hinge = t <= 0.5
            per = w / len(rows)
            # s_p term: hinge max(0, 1/2 + z) = SVM label -1; s_n: label +1
            lab = 0 if sign > 0 else 1
            np.add.at(A[lab], rows[hinge], per)
            c += per * np.count_nonzero(~hinge)
        return A, c


def _hinge_terms(A, z):
    """sum A[0] max(0, 1/2 + z) + A[1] max(0, 1/2 - z)."""
    return float(A[0] @ np.maximum(0.0, 0.5 + z) + A[1] @ np.maximum(0.0, 0.5 - z))


class RateConstrainedClassifier(ClassifierMixin, BaseEstimator):
    """Linear classifier trained with dataset constraints (Goh et al. 2016, Alg. 1-2).

    Minimises ``alpha/2 ||w||^2 + objective`` subject to every constraint, with rates
    measured by the ramp (equivalently: exactly, for the randomised rule that predicts
    positive with probability ramp(w^T x + b)).

    Parameters
    ----------
    objective : Expr, default error_rate()
    constraints : list of Constraint, default []
    alpha : float > 0, default 1e-3
    mm_iterations : int, default 10
        Majorisation-minimisation steps (it stops earlier when the objective moves by
        less than ``tol``).
    randomized : bool, default False
        ``predict`` with the randomised rule (positive with probability ramp(z));
        otherwise sign(z).
    init : None or a fitted linear model (``coef_``, ``intercept_``)
        The MM starting point (default w = 0: every ramp rate is 1/2 there).
    max_multiplier : float, default 1e4
        Upper end of the multiplier search; a constraint still violated there is
        reported as infeasible.
    intercept_scaling : float, default 1.0
        The bias is a constant feature of this value (regularised like a weight, as
        in LIBLINEAR; a larger value regularises it less but slows the inner solver).
    tol : float, default 1e-6
        Stop MM when the objective moves by less than this (relative).
    inner_tol : float, default 1e-2
        Largest projected gradient of the inner weighted-hinge duals (margin 1/2 units;
        LIBLINEAR's default 0.1 on its max - min gap is about 5x looser). The first MM
        steps, whose majorisers are loose, use up to 8x this.
    random_state : int or None (randomised predictions)

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import RateConstrainedClassifier
    >>> from bigrate.constraints import error_rate, positive_rate
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((400, 3)); g = np.where(rng.random(400) < 0.5, "A", "B")
    >>> X[g == "A", 0] -= 1.0  # group A scores lower
    >>> y = np.where(X[:, 0] + 0.3 * rng.standard_normal(400) > 0, 1, -1)
    >>> clf = RateConstrainedClassifier(
    ...     constraints=[positive_rate(group="A") >= 0.8 * positive_rate(group="B")],
    ... ).fit(X, y, groups=g)
    >>> bool(clf.history_[-1]["constraints"][0] <= 1e-3)
    True
    """

    _parameter_constraints: dict = {
        "objective": [Expr, None],
        "constraints": [list, None],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "mm_iterations": [Interval(Integral, 1, None, closed="left")],
        "randomized": ["boolean"],
        "init": "no_validation",
        "max_multiplier": [Interval(Real, 0, None, closed="neither")],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "inner_tol": [Interval(Real, 0, None, closed="neither")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        *,
        objective=None,
        constraints=None,
        alpha=1e-3,
        mm_iterations=10,
        randomized=False,
        init=None,
        max_multiplier=1e4,
        intercept_scaling=1.0,
        tol=1e-6,
        inner_tol=1e-2,
        random_state=None,
    ):
        self.objective = objective
        self.constraints = constraints
        self.alpha = alpha
        self.mm_iterations = mm_iterations
        self.randomized = randomized
        self.init = init
        self.max_multiplier = max_multiplier
        self.intercept_scaling = intercept_scaling
        self.tol = tol
        self.inner_tol = inner_tol
        self.random_state = random_state

    # ----------------------------------------------------------------- fit
    def fit(self, X, y, groups=None, datasets=None):
        """Parameters: X, y (two classes, the larger positive); ``groups`` (one value
        per row, for ``group=`` in rates); ``datasets``: name -> X or dict(X=, y=,
        groups=) for rates on other, possibly unlabeled, data."""
        from bigrate.constraints import error_rate

        self._validate_params()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
        yy = binary_classes(self, y)
        cons = list(self.constraints or [])
        for j, c in enumerate(cons):
            if not isinstance(c, Constraint):
                raise TypeError(
                    f"constraints[{j}] is {type(c).__name__}; build constraints by "
                    "comparing expressions, e.g. positive_rate(group='a') >= 0.5"
                )
        data = _Data(X, yy, groups, datasets, self.intercept_scaling)
        obj = _Compiled(self.objective or error_rate(), data, "objective")
        comp = [
            _Compiled(c.expr, data, f"constraints[{j}]") for j, c in enumerate(cons)
        ]
        Xc, n, d = data.X, data.n, data.X.shape[1]
        w = np.zeros(d)
        if self.init is not None:
            coef = np.ravel(self.init.coef_)
            if len(coef) != d - 1:
                raise ValueError(
                    f"init has {len(coef)} coefficients; X has {d - 1} features"
                )
            w[:-1] = coef
            w[-1] = float(np.ravel(self.init.intercept_)[0]) / self.intercept_scaling
        self._solver = _InnerSolver(Xc, self.alpha, self.inner_tol)
        self.history_ = []
        prev = None
        v = np.zeros(len(comp))
        for it in range(self.mm_iterations + 1):
            z = np.asarray(Xc @ w).ravel()
            f = 0.5 * self.alpha * (w @ w) + obj.value(z)
            gv = [c.value(z) for c in comp]
            self.history_.append(
                {
                    "iteration": it,
                    "objective": f,
                    "constraints": gv,
                    "multipliers": v.tolist(),
                }
            )
            if it == self.mm_iterations or (
                prev is not None and abs(prev - f) <= self.tol * max(1.0, abs(f))
            ):
                break
            prev = f
            A0, c0 = obj.bound(z, n)
            bounds = [c.bound(z, n) for c in comp]
            # the first majorisers are loose (at w = 0 every ramp is replaced by its
            # hinge), so their inner problems are solved less tightly
            self._solver.tol = self.inner_tol * max(1.0, 8.0 / 2.0**it)
            w, v, self._infeasible = self._outer(A0, c0, bounds, v)
        self._w = w
        self.coef_ = w[:-1].reshape(1, -1)
        self.intercept_ = np.array([w[-1] * self.intercept_scaling])
        self.n_iter_ = len(self.history_) - 1
        self.multipliers_ = v
        last = self.history_[-1]["constraints"]
        self.constraint_values_ = np.array(last)
        self.infeasible_ = bool(self._infeasible) if comp else False
        if comp and max(last) > 1e-3:
            worst = int(np.argmax(last))
            warnings.warn(
                f"RateConstrainedClassifier: constraints[{worst}] is violated by "
                f"{last[worst]:.4g} (the smallest violation reached"
                + (", the relaxed problem is infeasible up to max_multiplier"
                   if self.infeasible_ else "")
                + "); loosen the target, raise mm_iterations or start from a "
                "feasible init",
                BigrateWarning,
                stacklevel=2,
            )  # fmt: skip
        del self._solver
        return self

    def _outer(self, A0, c0, bounds, v_prev):
        """Maximise the dual of the majorised problem over v >= 0; returns (w, v,
        infeasible)."""
        solve = self._solver

        def at(v):
            A = A0 + sum(vj * Aj for vj, (Aj, _) in zip(v, bounds, strict=True))
            w = solve(A)
            z = np.asarray(solve.X @ w).ravel()
            g = np.array([_hinge_terms(Aj, z) + cj for Aj, cj in bounds])
            h = 0.5 * self.alpha * (w @ w) + _hinge_terms(A0, z) + c0 + float(v @ g)
            return w, g, h

        m = len(bounds)
        if m == 0:
            return at(np.zeros(0))[0], np.zeros(0), False
        v0 = np.zeros(m)
        w, g, h = at(v0)
        if (g <= 0).all():
            return w, v0, False
        vmax = float(self.max_multiplier)
        if m == 1:
            return self._root(at, vmax, w, g[0], v_prev)
        return self._cutting_plane(at, m, vmax, (v0, w, g, h))

    def _root(self, at, vmax, w0, g0, v_prev):
        """One constraint: the dual is maximised at the smallest v >= 0 with
        g(v) <= 0 (g is non-increasing in v). Bracket it starting from the previous
        MM step's multiplier, then regula falsi with the Illinois modification, until
        -gtol <= g <= 0 or the bracket is 1e-4 relative."""
        gtol = 1e-3
        lo, g_lo = 0.0, g0
        hi = float(v_prev[0]) if len(v_prev) and v_prev[0] > 0 else 1.0
        hi = min(hi, vmax)
        w_hi, g_hi, _ = at(np.array([hi]))
        while g_hi[0] > 0:
            if hi >= vmax:
                return w_hi, np.array([hi]), True
            lo, g_lo = hi, g_hi[0]
            hi = min(hi * 4.0, vmax)
            w_hi, g_hi, _ = at(np.array([hi]))
        g_hi = g_hi[0]
        side = 0
        for _ in range(60):
            if g_hi >= -gtol or hi - lo <= 1e-4 * hi:
                break
            mid = hi - g_hi * (hi - lo) / (g_hi - g_lo)
            if not lo < mid < hi:
                mid = 0.5 * (lo + hi)
            w_mid, g_mid, _ = at(np.array([mid]))
            if g_mid[0] > 0:
                lo, g_lo = mid, g_mid[0]
                if side == -1:
                    g_hi *= 0.5
                side = -1
            else:
                hi, w_hi, g_hi = mid, w_mid, g_mid[0]
                if side == 1:
                    g_lo *= 0.5
                side = 1
        return w_hi, np.array([hi]), False

    def _cutting_plane(self, at, m, vmax, first):
        """Kelley's cutting planes for max_v h(v) (Algorithm 2)."""
        from scipy.optimize import linprog

        pts = [first]
        best = first
        box = min(vmax, 1.0)  # grown while the LP's answer sits on its edge
        for _ in range(150):
            # maximise t s.t. t <= h_k + g_k^T (v - v_k), 0 <= v <= box
            A_ub = np.array([np.r_[-p[2], 1.0] for p in pts])
            b_ub = np.array([p[3] - p[2] @ p[0] for p in pts])
            res = linprog(
                np.r_[np.zeros(m), -1.0],
                A_ub=A_ub,
                b_ub=b_ub,
                bounds=[(0, box)] * m + [(None, None)],
                method="highs",
            )
            if res.status != 0:
                break
            v = res.x[:m]
            upper = -res.fun
            w, g, h = at(v)
            pts.append((v, w, g, h))
            if h > best[3]:
                best = (v, w, g, h)
            on_edge = (v >= box * (1 - 1e-9)).any()
            if on_edge and box < vmax:
                box = min(4.0 * box, vmax)
                continue
            if upper - best[3] <= 1e-7 * max(1.0, abs(best[3])):
                break
        # the primal answer: the best majorised objective among evaluated points whose
        # w meets every bound (the dual maximiser's w only does so at exact optimum)
        feas = [p for p in pts if (p[2] <= 0).all()]
        if feas:
            best = min(feas, key=lambda p: p[3] - p[0] @ p[2])
        v, w, g, h = best
        infeasible = bool((g > 1e-6).any() and (v >= vmax * (1 - 1e-9)).any())
        return w, v, infeasible

    # ----------------------------------------------------------- predict
    def decision_function(self, X):
        check_is_fitted(self, "coef_")
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return np.asarray(X @ self.coef_.ravel()).ravel() + self.intercept_[0]

    def predict_proba(self, X):
        """Randomised rule: P(positive) = ramp(z)."""
        p = ramp(self.decision_function(X))
        return np.c_[1 - p, p]

    def predict(self, X):
        z = self.decision_function(X)
        if self.randomized:
            rng = np.random.default_rng(
                self.random_state if isinstance(self.random_state, int) else None
            )
            pos = rng.random(len(z)) < ramp(z)
        else:
            pos = z > 0
        return self.classes_[pos.astype(int)]

    def evaluate(self, expr, X, y=None, groups=None, datasets=None, *,
                 deterministic=True) -> float:  # fmt: skip
        """Value of an expression (or a constraint's ``lhs - rhs``) for this model on new
        data: deterministic (sign) rates by default, ramp rates otherwise."""
        check_is_fitted(self, "coef_")
        if isinstance(expr, Constraint):
            expr = expr.expr
        yy = None if y is None else np.where(np.asarray(y) == self.classes_[1], 1, -1)
        data = _Data(X, yy, groups, datasets, self.intercept_scaling)
        z = np.asarray(data.X @ np.r_[self.coef_.ravel(), self._w_bias()]).ravel()
        return _Compiled(expr, data, "expression").value(z, deterministic)

    def _w_bias(self):
        return self.intercept_[0] / self.intercept_scaling


class _InnerSolver:
    """Weighted hinge SVM with margin 1/2 for per-(row, label) weights A (2 x n), by
    exact dual coordinate descent with shrinking, warm-started across calls.

    The design is stacked once as [X; X] with labels -1 then +1, so (label, row) is
    stacked row label * n + row and a call selects rows by index instead of copying
    them. A row carrying both labels (weights a and b) would give two dual variables
    whose effects on w cancel, where coordinate descent zigzags; with c = min(a, b)
    the pair is rewritten exactly as

        a h(1/2 + z) + b h(1/2 - z) = c + c h(z - 1/2) + c h(-z - 1/2)
                                      + (a - c) h(1/2 + z) + (b - c) h(1/2 - z)

    (h = max(0, .)): the two margin -1/2 hinges are never active together, so at most
    one of their dual variables is non-zero at the optimum and nothing cancels. Dual
    variables are keyed by stacked row plus 2n for the margin -1/2 copies."""

    def __init__(self, X: sp.csr_matrix, alpha: float, tol: float):
        self.X, self.alpha, self.tol = X, alpha, tol
        n = X.shape[0]
        Xs = sp.vstack([X, X], format="csr")
        self.design = (
            Xs.indptr.astype(np.int64),
            Xs.indices.astype(np.int64),
            Xs.data,
            np.r_[-np.ones(n), np.ones(n)],
            np.ones(2 * n),
        )
        sqn = np.asarray(X.multiply(X).sum(axis=1)).ravel()
        self.sqn = np.r_[sqn, sqn]
        self.dual = np.zeros(4 * n)
        self.last = (0, 0, 0.0)  # status, epochs, violation of the last solve

    def __call__(self, A):
        n = self.X.shape[0]
        both = np.minimum(A[0], A[1])
        hi_all = np.concatenate([A[0] - both, A[1] - both, both, both])
        key = np.flatnonzero(hi_all > 0)
        hi = hi_all[key]
        z = np.minimum(self.dual[key], hi)
        rows = key % (2 * n)  # stacked design row
        lin = np.where(key < 2 * n, 0.5, -0.5)
        scale = 1.0 / self.alpha
        signed = np.zeros(n)  # sum over dual variables of y z per data row
        np.add.at(signed, rows % n, np.where(rows >= n, z, -z))
        w = scale * np.asarray(self.X.T @ signed).ravel()
        m = len(key)
        self.last = QK.box_cd(
            self.design, rows, m, lin, np.zeros(m), hi, z, w, self.sqn, scale,
            self.tol, 2_000, 0, True,
        )  # fmt: skip
        self.dual[:] = 0.0
        self.dual[key] = z
        return w


def plot_target_vs_achieved(records, path, *, xlabel="target", ylabel="achieved",
                            title=None) -> Path:  # fmt: skip
    """records: dicts with "target" and any of "train", "test" (achieved values);
    draws achieved against target with the y = x line (as in Goh et al., Figs. 2-3)."""
    from bigrate._plot import pyplot, save_png

    t = np.array([r["target"] for r in records])
    fig, ax = pyplot().subplots(figsize=(4.5, 3.5))
    ax.plot(t, t, ":", color="grey", label="target")
    for key in ("train", "test"):
        if all(key in r for r in records):
            ax.plot(t, [r[key] for r in records], "o-", label=key)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend()
    return save_png(fig, path)
