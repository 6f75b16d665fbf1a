"""Training with dataset constraints (Goh et al. 2016), restated in
``../shared/docs/algorithms.md`` sec. 3.

Rates use the ramp sigma(t) = max(0, min(1, 1/2 + t)) of the score z = w^T x + b (this
module keeps the usual ``+ b``; the paper writes ``- b``): s_p(D) = mean sigma(z),
s_n(D) = mean sigma(-z). Problem 2: minimise ``alpha/2 ||w||^2 + objective`` subject to
``constraint_j <= 0``, each a non-negative combination of rates plus a constant
(:mod:`bigrate.constrained` normalises them).

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
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate.base import RateClassifierMixin, binary_classes
from bigrate.constrained.vocabulary import Constraint, Expr, Subset
from bigrate.data.reader import ShardedDataset, is_dataset
from bigrate.errors import BigrateWarning
from bigrate.solvers import dual_cd


def ramp(t):
    return np.clip(0.5 + t, 0.0, 1.0)


def _with_bias(X, scaling: float) -> sp.csr_matrix:
    col = sp.csr_matrix(np.full((X.shape[0], 1), float(scaling)))
    out = sp.hstack([sp.csr_matrix(X, dtype=np.float64), col], format="csr")
    out.sort_indices()
    return out


class _MemoryPart:
    """A dataset held in memory: one block."""

    cached = True

    def __init__(self, name, X, y, groups, scaling):
        X = (
            sp.csr_matrix(X, dtype=np.float64)
            if sp.issparse(X)
            else np.asarray(X, dtype=np.float64)
        )
        if X.ndim != 2 or X.shape[0] == 0:
            raise ValueError(f"dataset {name!r} is empty or not 2-D")
        vals = X.data if sp.issparse(X) else X
        if not np.isfinite(vals).all():
            raise ValueError(f"dataset {name!r} contains NaN or infinity")
        self.raw, self.n, self.n_features = X, X.shape[0], X.shape[1]
        self.labels = None if y is None else np.asarray(y, float)
        self.groups = None if groups is None else np.asarray(groups)
        self.X = _with_bias(X, scaling)

    def blocks(self):
        yield np.arange(self.n), self.X, True

    def baseline_positive(self, model) -> np.ndarray:
        return np.asarray(model.decision_function(self.raw)).ravel() > 0


class _ShardPart:
    """A split of a ShardedDataset, streamed in blocks; its rows are numbered
    positives first, then negatives, each in file order. Per-row labels and groups
    are kept in memory, and the blocks too if all of them (with the solver's copy of
    their indices, 3x their size) fit in ``cache_mb``."""

    cached = False

    def __init__(self, name, ds, split, scaling, batch_rows, cache_mb):
        ds = ds if isinstance(ds, ShardedDataset) else ShardedDataset(ds)
        if not ds.files(split):
            raise ValueError(f"dataset {name!r}: {ds.path} has no rows in split "
                             f"{split!r}")  # fmt: skip
        self.ds, self.split, self.scaling, self.batch = ds, split, scaling, batch_rows
        self.n_features = ds.n_features
        self.budget = cache_mb * 2**20
        self.kept = None  # every block, once they are known to fit in the budget
        self.n_pos = ds.class_counts(split)["pos"]
        ys, gs = [], []
        for cls in ("pos", "neg"):  # the row order of this dataset
            for b in ds.iter_batches(split, cls, batch_rows, with_group=True):
                ys.append(b.y.astype(float))
                gs.append(b.group)
        self.labels = np.concatenate(ys)
        self.groups = np.concatenate(gs) if ds.has_group else None
        self.n = len(self.labels)

    def _class_batches(self, cls):
        first = 0 if cls == "pos" else self.n_pos
        for b in self.ds.iter_batches(self.split, cls, batch_rows=self.batch):
            yield np.arange(first, first + len(b)), b.X
            first += len(b)

    def blocks(self):
        """(row indices, block with the bias column, whether it is held in memory).
        A block joins one batch of positives with one of negatives (the shards are
        partitioned by class, and single-class blocks make block-wise descent zigzag
        between the classes). Blocks are kept after the first pass if all of them fit
        in the budget; then the shards are not read again."""
        if self.kept is not None:
            for rows, Xb in self.kept:
                yield rows, Xb, True
            return
        acc, size = [], 0
        pos, neg = self._class_batches("pos"), self._class_batches("neg")
        while True:
            pieces = [p for p in (next(pos, None), next(neg, None)) if p is not None]
            if not pieces:
                break
            rows = np.concatenate([r for r, _ in pieces])
            Xb = _with_bias(
                sp.vstack([x for _, x in pieces], format="csr", dtype=np.float64),
                self.scaling,
            )
            if acc is not None:
                size += 3 * (Xb.data.nbytes + Xb.indices.nbytes + Xb.indptr.nbytes)
                acc = acc + [(rows, Xb)] if size <= self.budget else None
            yield rows, Xb, False
        if acc is not None:
            self.kept = acc

    def baseline_positive(self, model) -> np.ndarray:
        out = np.empty(self.n, bool)
        for cls in ("pos", "neg"):
            for rows, X in self._class_batches(cls):
                out[rows] = np.asarray(model.decision_function(X)).ravel() > 0
        return out


class _Data:
    """Every dataset as a row range of one index space (bias column appended). The
    rows of in-memory datasets are blocks held in memory; ShardedDataset splits are
    streamed block by block whenever scores or a solve need their features."""

    def __init__(self, X, y, groups, datasets, intercept_scaling, batch_rows=65_536,
                 cache_mb=0.0):  # fmt: skip
        self.parts, self.ranges, self.labels, self.groups = {}, {}, {}, {}
        first = X if isinstance(X, dict) else {"X": X, "y": y, "groups": groups}
        items = [("train", first)]
        for name, spec in (datasets or {}).items():
            if name == "train":
                raise ValueError('datasets: the name "train" is reserved for fit(X, y)')
            if not isinstance(spec, dict):
                spec = {"X": spec}
            unknown = set(spec) - {"X", "y", "groups", "split"}
            if unknown:
                raise ValueError(
                    f"datasets[{name!r}]: unknown keys {sorted(unknown)}; "
                    "expected X and optionally y, groups (arrays) or split (shards)"
                )
            items.append((name, spec))
        start, width = 0, None
        for name, spec in items:
            if is_dataset(spec["X"]):
                for key in ("y", "groups"):
                    if spec.get(key) is not None:
                        raise ValueError(
                            f"dataset {name!r}: {key} comes from the shards; pass "
                            f"{key}=None with a ShardedDataset"
                        )
                part = _ShardPart(name, spec["X"], spec.get("split", "train"),
                                  intercept_scaling, batch_rows, cache_mb)  # fmt: skip
            else:
                part = _MemoryPart(name, spec["X"], spec.get("y"), spec.get("groups"),
                                   intercept_scaling)  # fmt: skip
            if width is not None and part.n_features != width:
                raise ValueError(
                    f"dataset {name!r} has {part.n_features} features; the training "
                    f"data has {width}"
                )
            width = part.n_features
            if part.groups is not None and len(part.groups) != part.n:
                raise ValueError(f"dataset {name!r}: groups has {len(part.groups)} "
                                 f"entries for {part.n} rows")  # fmt: skip
            self.parts[name] = part
            self.ranges[name] = (start, start + part.n)
            if part.labels is not None:
                self.labels[name] = part.labels
            if part.groups is not None:
                self.groups[name] = part.groups
            start += part.n
        self.n, self.d = start, width + 1
        self.streamed = any(not p.cached for p in self.parts.values())
        self._stacked = None

    def blocks(self):
        """(row indices, CSR block with the bias column, whether it stays in memory).
        Datasets all in memory are one block."""
        if not self.streamed:
            if self._stacked is None:
                self._stacked = sp.vstack(
                    [p.X for p in self.parts.values()], format="csr"
                )
            yield np.arange(self.n), self._stacked, True
            return
        for name, part in self.parts.items():
            first = self.ranges[name][0]
            for rows, Xb, keep in part.blocks():
                yield first + rows, Xb, keep

    def scores(self, w) -> np.ndarray:
        z = np.empty(self.n)
        for rows, Xb, _ in self.blocks():
            z[rows] = Xb @ w
        return z

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
            pred = self.parts[s.dataset].baseline_positive(s.baseline)
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


class _Found(Exception):
    """A multiplier meeting the root search's tolerance was evaluated."""


def _worse(f, g, f_old, g_old, slack=1e-6) -> bool:
    """Is (objective f, constraint values g) worse than the previous MM iterate?
    Feasibility first: more violation is worse; between feasible points, a higher
    objective is."""
    viol, viol_old = max(g, default=0.0), max(g_old, default=0.0)
    if viol > max(viol_old, 0.0) + slack:
        return True
    if viol_old > slack and viol < viol_old - slack:
        return False  # closer to feasible
    return f > f_old + slack * max(1.0, abs(f_old))


def _hinge_terms(A, z):
    """sum A[0] max(0, 1/2 + z) + A[1] max(0, 1/2 - z)."""
    return float(A[0] @ np.maximum(0.0, 0.5 + z) + A[1] @ np.maximum(0.0, 0.5 - z))


class RateConstrainedClassifier(RateClassifierMixin, BaseEstimator):
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
        less than ``tol``, or when a step made worse by an inexact inner solve is
        rejected: ``history_[-1]["rejected_next"]`` then records it).
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
    solver : {"auto", "dcd", "blocks"}, default "auto"
        The inner weighted-hinge solver. "dcd": dual coordinate descent on every
        dataset in memory. "blocks": the same duals updated block by block in passes
        over the data, with only O(n) numbers (scores, duals, labels, groups) in
        memory and the features streamed - the solver for ShardedDataset inputs.
        "auto": "blocks" when any dataset is a ShardedDataset, else "dcd".
    split : str, default "train"
        Streaming only: the split of a ShardedDataset passed as X.
    batch_rows : int, default 65536
        Streaming only: rows per block read from the shards.
    cache_mb : float, default 1024
        Streaming only, per streamed dataset: if all its blocks (with the solver's
        copy of their indices, 3x their size) fit in this, they are kept in memory after the
        first pass; otherwise every pass of the block-wise solver reads the shards
        again. 0 always streams.

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import RateConstrainedClassifier
    >>> from bigrate.constrained import error_rate, positive_rate
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

    _job_data = "shards"
    _job_kinds = ("train", "evaluate")

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
        "solver": [StrOptions({"auto", "dcd", "blocks"})],
        "split": [str],
        "batch_rows": [Interval(Integral, 1, None, closed="left")],
        "cache_mb": [Interval(Real, 0, None, closed="left")],
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
        solver="auto",
        split="train",
        batch_rows=65_536,
        cache_mb=1024.0,
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
        self.solver = solver
        self.split = split
        self.batch_rows = batch_rows
        self.cache_mb = cache_mb

    # ----------------------------------------------------------------- fit
    def fit(self, X, y=None, groups=None, datasets=None):
        """Parameters: X, y (two classes, the larger positive) or X a ShardedDataset
        (or its path; y and groups None: labels and groups come from the shards, the
        rows of ``split`` are streamed); ``groups`` (one value per row, for ``group=``
        in rates); ``datasets``: name -> X or dict(X=, y=, groups=) for rates on
        other, possibly unlabeled, data (X may be a ShardedDataset there too, with
        ``split=``)."""
        from bigrate.constrained.vocabulary import error_rate

        self._validate_params()
        if is_dataset(X):
            if y is not None or groups is not None:
                raise ValueError(
                    "y and groups must be None when X is a ShardedDataset or a path "
                    "(they come from the shards' label and group columns)"
                )
            X = {"X": X, "split": self.split}
            self.classes_ = np.array([-1, 1])
            yy = None
        else:
            if y is None:
                raise ValueError(
                    "RateConstrainedClassifier requires y to be passed, but the target "
                    "y is None (y may be omitted only when X is a ShardedDataset or "
                    "its path)"
                )
            X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
            yy = binary_classes(self, y)
        cons = list(self.constraints or [])
        for j, c in enumerate(cons):
            if not isinstance(c, Constraint):
                raise TypeError(
                    f"constraints[{j}] is {type(c).__name__}; build constraints by "
                    "comparing expressions, e.g. positive_rate(group='a') >= 0.5"
                )
        data = _Data(X, yy, groups, datasets, self.intercept_scaling, self.batch_rows,
                     self.cache_mb)  # fmt: skip
        self.n_features_in_ = data.d - 1
        if data.streamed and self.solver == "dcd":
            raise ValueError(
                'solver="dcd" keeps every dataset in memory; use solver="blocks" '
                '(or "auto") with a ShardedDataset'
            )
        blockwise = self.solver == "blocks" or data.streamed
        obj = _Compiled(self.objective or error_rate(), data, "objective")
        comp = [
            _Compiled(c.expr, data, f"constraints[{j}]") for j, c in enumerate(cons)
        ]
        n, d = data.n, data.d
        w = np.zeros(d)
        if self.init is not None:
            coef = np.ravel(self.init.coef_)
            if len(coef) != d - 1:
                raise ValueError(
                    f"init has {len(coef)} coefficients; X has {d - 1} features"
                )
            w[:-1] = coef
            w[-1] = float(np.ravel(self.init.intercept_)[0]) / self.intercept_scaling
        self._slope = None  # of the constraint's bound in v, for the next root search
        self._solver = _InnerSolver(
            data, self.alpha, self.inner_tol, blockwise=blockwise
        )
        self.history_ = []
        prev = None
        v = np.zeros(len(comp))
        kept = None  # the last accepted (w, v, objective, constraint values)
        for it in range(self.mm_iterations + 1):
            z = data.scores(w)
            f = 0.5 * self.alpha * (w @ w) + obj.value(z)
            gv = [c.value(z) for c in comp]
            entry = {
                "iteration": it,
                "objective": f,
                "constraints": gv,
                "multipliers": v.tolist(),
            }
            if kept is not None and _worse(f, gv, kept[2], kept[3]):
                # exact inner solves never get here (MM is monotone); an inexact
                # solve can, and then the previous iterate is kept and MM stops
                self.history_[-1]["rejected_next"] = entry
                w, v = kept[0], kept[1]
                break
            self.history_.append(entry)
            kept = (w, v, f, gv)
            if it == self.mm_iterations or (
                prev is not None and abs(prev - f) <= self.tol * max(1.0, abs(f))
            ):
                break
            prev = f
            A0, c0 = obj.bound(z, n)
            bounds = [c.bound(z, n) for c in comp]
            # the first majorisers are loose (at w = 0 every ramp is replaced by its
            # hinge), so their inner problems are solved less tightly
            loose = max(1.0, 8.0 / 2.0**it)
            self._solver.tol = self.inner_tol * loose
            w, v, self._infeasible = self._outer(A0, c0, bounds, v, 1e-3 * loose)
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
        del self._solver, self._slope
        return self

    def _outer(self, A0, c0, bounds, v_prev, gtol=1e-3):
        """Maximise the dual of the majorised problem over v >= 0; returns (w, v,
        infeasible)."""
        solve = self._solver

        def at(v):
            A = A0 + sum(vj * Aj for vj, (Aj, _) in zip(v, bounds, strict=True))
            w = solve(A)
            z = solve.data.scores(w)
            g = np.array([_hinge_terms(Aj, z) + cj for Aj, cj in bounds])
            h = 0.5 * self.alpha * (w @ w) + _hinge_terms(A0, z) + c0 + float(v @ g)
            return w, g, h

        m = len(bounds)
        if m == 0:
            return at(np.zeros(0))[0], np.zeros(0), False
        if m == 1:
            return self._root(at, float(self.max_multiplier), v_prev, gtol)
        v0 = np.zeros(m)
        w, g, h = at(v0)
        if (g <= 0).all():
            return w, v0, False
        return self._cutting_plane(at, m, float(self.max_multiplier), (v0, w, g, h))

    def _root(self, at, vmax, v_prev, gtol):
        """One constraint: the dual is maximised at the smallest v >= 0 with
        g(v) <= 0 (g is non-increasing in v). The search starts at the previous MM
        step's multiplier (where warm-started solves are cheapest: the duals barely
        move), brackets the root by secant steps (the first by the slope of g seen in
        the previous MM step), then runs Brent's method (scipy's brentq), stopping
        as soon as -gtol <= g <= 0. Returns (w, v, infeasible)."""
        from scipy.optimize import brentq

        seen = {}  # v -> (w, g)

        def g_at(v):
            if v not in seen:
                w, g, _ = at(np.array([v]))
                seen[v] = (w, float(g[0]))
            g = seen[v][1]
            if -gtol <= g <= 0 or (v == 0.0 and g <= 0):
                raise _Found
            return g

        def secant(a, b, fallback):
            """From b, the step that brings g to -gtol/2 along the line through a
            and b (1.5x, so that it rather overshoots), or ``fallback``."""
            ga, gb = seen[a][1], seen[b][1]
            s = (gb - ga) / (b - a) if a != b else self._slope
            if s is None or not s < 0:
                return fallback
            return 1.5 * abs(gb + 0.5 * gtol) / -s

        v0 = min(float(v_prev[0]), vmax) if len(v_prev) else 0.0
        try:
            g0 = g_at(v0)
            # a root search that starts far off (the first, loose majorisers) need
            # not end as close: the next MM step searches again from its answer
            gtol = max(gtol, 0.05 * abs(g0))
            lo = hi = v0
            if g0 > 0:  # the root is above v0: step up until g <= 0
                h = secant(v0, v0, v0 if v0 > 0 else 1.0)
                while True:
                    if lo >= vmax:
                        return seen[lo][0], np.array([lo]), True
                    hi = min(lo + h, vmax)
                    if g_at(hi) <= 0:
                        break
                    h = min(max(secant(lo, hi, 4.0 * h), h), 8.0 * h)
                    lo = hi
            else:  # g0 < -gtol: the root is below v0
                h = secant(v0, v0, 0.5 * v0)
                while True:
                    lo = max(hi - h, 0.0)
                    if g_at(lo) > 0:
                        break
                    h = min(max(secant(hi, lo, 4.0 * h), h), 8.0 * h)
                    hi = lo
            brentq(g_at, lo, hi, xtol=1e-4 * hi, maxiter=60)
        except _Found:
            pass
        feasible = [v for v, (_, g) in seen.items() if g <= 0]
        v = min(feasible)
        below = [u for u, (_, g) in seen.items() if g > 0]
        if below:  # dg/dv across the final bracket, for the next MM step's search
            u = max(below)
            self._slope = (seen[v][1] - seen[u][1]) / (v - u)
        return seen[v][0], np.array([v]), False

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
            pos = z >= 0  # the package's convention (RateClassifierMixin)
        return self.classes_[pos.astype(int)]

    def evaluate(self, expr, X, y=None, groups=None, datasets=None, *,
                 deterministic=True, split="test") -> float:  # fmt: skip
        """Value of an expression (or a constraint's ``lhs - rhs``) for this model on new
        data: deterministic (sign) rates by default, ramp rates otherwise. X may be a
        ShardedDataset (rows of ``split``, streamed)."""
        check_is_fitted(self, "coef_")
        if isinstance(expr, Constraint):
            expr = expr.expr
        yy = None if y is None else np.where(np.asarray(y) == self.classes_[1], 1, -1)
        if is_dataset(X):
            X, yy = {"X": X, "split": split}, None
        data = _Data(X, yy, groups, datasets, self.intercept_scaling, self.batch_rows)
        z = data.scores(np.r_[self.coef_.ravel(), self._w_bias()])
        return _Compiled(expr, data, "expression").value(z, deterministic)

    def _w_bias(self):
        return self.intercept_[0] / self.intercept_scaling


class _InnerSolver:
    """Weighted hinge SVM with margin 1/2 for per-(row, label) weights A (2 x n), by
    exact dual coordinate descent with shrinking, warm-started across calls.

    A solve runs over the block's (row, kind) duals with a positive weight, sorted
    by row, each with its label as a sign on the row (one copy of X; visiting rows
    in short runs in order keeps the memory-bound loop fast). A row
    carrying both labels (weights a and b) as two hinges at margin 1/2 gives dual
    variables whose effects on w cancel, where coordinate descent zigzags without
    end; such a row is rewritten exactly (h = max(0, .)) as

        a h(1/2 + z) + b h(1/2 - z) = (a + b)/2 + (a - b) z
                                      + a h(-1/2 - z) + b h(-1/2 + z),

    a linear term (a constant offset of w: w = (sum_k y_k d_k x_k - sum_i l_i x_i) /
    alpha) plus two hinges at margin -1/2 that are never active together, whose
    gradients sum to 1, so at most one of their duals is non-zero and nothing
    cancels. The duals are kept as D (4 x n): kind 0 = label -1 and kind 1 = label
    +1 at margin 1/2 (rows with one label), kind 2 = label +1 (weight a) and kind 3
    = label -1 (weight b) at margin -1/2 (rows with both).

    In memory the whole problem is one block solved to ``tol``. Block-wise (datasets
    streamed from shards; Yu, Hsieh, Chang and Lin 2010, "Large linear classification
    when data cannot fit in memory") each pass reads every block once and runs a few
    epochs on its duals with w shared; only w, the duals and the scores (O(n)
    numbers) stay in memory. The solve ends after a pass in which every coordinate
    of every block already met ``tol`` (its first epoch, before any shrinking)."""

    BLOCK_EPOCHS = 3  # epochs on a block per visit (more zigzags between class blocks)
    MAX_PASSES = 1000  # a solve that has not settled by then returns its iterate
    SHRINK = True
    CHUNK = 32  # rows visited in order before a random jump (see dual_cd.box_cd_signed)
    _SIGN = np.array([-1.0, 1.0, 1.0, -1.0])  # label of each kind of dual
    _MARGIN = np.array([0.5, 0.5, -0.5, -0.5])

    def __init__(self, data: _Data, alpha: float, tol: float, blockwise: bool):
        self.data, self.alpha, self.tol, self.blockwise = data, alpha, tol, blockwise
        self.D = np.zeros((4, data.n))
        self._designs = {}
        self.last = (0, 0, 0.0)  # status, epochs (passes when block-wise), violation

    def _design(self, rows, Xb, cached):
        if cached and rows[0] in self._designs:
            return self._designs[rows[0]]
        nb = Xb.shape[0]
        out = (
            (
                Xb.indptr.astype(np.int64),
                Xb.indices.astype(np.int64),
                Xb.data,
                np.ones(nb),
                np.ones(nb),
            ),
            np.asarray(Xb.multiply(Xb).sum(axis=1)).ravel(),
        )
        if cached:
            self._designs[rows[0]] = out
        return out

    def __call__(self, A):
        two = (A[0] > 0) & (A[1] > 0)
        one = ~two
        H = np.stack([A[0] * one, A[1] * one, A[0] * two, A[1] * two])
        D = self.D
        np.minimum(D, H, out=D)
        signed = -D[0] + D[1] + D[2] - D[3] - np.where(two, A[0] - A[1], 0.0)
        scale = 1.0 / self.alpha
        w = np.zeros(self.data.d)
        for rows, Xb, _ in self.data.blocks():
            w += Xb.T @ signed[rows]
        w *= scale
        epochs = self.BLOCK_EPOCHS if self.blockwise else 2_000
        for passes in range(1, self.MAX_PASSES + 1):
            settled, worst = True, 0.0
            for rows, Xb, cached in self.data.blocks():
                design, sqn = self._design(rows, Xb, cached)
                # the block's (row, kind) duals with a positive weight, by row
                local, kind = np.divmod(np.flatnonzero(H[:, rows].T.ravel() > 0), 4)
                m = len(local)
                at = (kind, rows[local])
                z = D[at]
                status, used, viol = dual_cd.box_cd_signed(
                    design, local, self._SIGN[kind], m, self._MARGIN[kind],
                    np.zeros(m), H[at], z, w, sqn, scale, self.tol, epochs, 1,
                    self.SHRINK, self.CHUNK,
                )  # fmt: skip
                D[at] = z
                settled &= status == dual_cd.CONVERGED and used == 1
                worst = max(worst, viol)
            self.last = (
                (int(not settled), passes, worst)
                if self.blockwise
                else (status, used, viol)
            )
            if not self.blockwise or settled:
                break
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
