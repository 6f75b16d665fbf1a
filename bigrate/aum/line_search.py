"""AUM (area under the min of FP and FN), AUC, and the exact AUM/AUC line search of
Fowler and Hocking for linear models; restated in ``../shared/docs/algorithms.md`` sec. 4.

Error functions are breakpoints (v_b, dFP_b, dFN_b, example I_b). For binary labels each
example has one breakpoint at v = 0: (dFP, dFN) = (0, -1/n+) for a positive and (1/n-, 0)
for a negative. With predictions yhat, breakpoint b sits at threshold T_b = v_b - yhat_{I_b};
along a direction, yhat(s) = pred + s * pred_direction makes every T_b a line in s.

The line search returns the pieces on which the AUM is linear and the AUC constant, so
both can be read at any step size; ``variant`` is where it stops: "first-min" (when the
AUM slope turns non-negative: the exact minimiser, AUM being convex in s), "linear" (B
intersections), "quadratic" (all of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigrate.aum import _kernels as K

VARIANTS = {"first-min": K.FIRST_MIN, "linear": K.LINEAR, "quadratic": K.QUADRATIC}


@dataclass
class Breakpoints:
    """Label error functions as breakpoints: threshold offset v, the FP and FN changes,
    and the example each belongs to."""

    v: np.ndarray
    dfp: np.ndarray
    dfn: np.ndarray
    example: np.ndarray

    @classmethod
    def binary(cls, y) -> Breakpoints:
        y = np.asarray(y)
        if not np.isin(y, (-1, 1)).all():
            raise ValueError("labels must be +1 / -1")
        n_pos, n_neg = int((y > 0).sum()), int((y < 0).sum())
        if n_pos == 0 or n_neg == 0:
            raise ValueError(
                f"AUM needs both classes; got {n_pos} positive and {n_neg} "
                "negative labels"
            )
        n = len(y)
        return cls(
            v=np.zeros(n),
            dfp=np.where(y < 0, 1.0 / n_neg, 0.0),
            dfn=np.where(y > 0, -1.0 / n_pos, 0.0),
            example=np.arange(n),
        )

    @classmethod
    def from_error_functions(cls, example, threshold, fp, fn) -> Breakpoints:
        """From piecewise-constant error functions: row r says that example[r] has
        (fp[r], fn[r]) errors for thresholds from threshold[r] up to the next row of the
        same example. Each example's first row must be at -inf with FP = 0 and its last
        row must have FN = 0 (the aum package's convention)."""
        example = np.asarray(example)
        threshold = np.asarray(threshold, float)
        fp = np.asarray(fp, float)
        fn = np.asarray(fn, float)
        order = np.lexsort((threshold, example))
        example, threshold, fp, fn = (
            example[order],
            threshold[order],
            fp[order],
            fn[order],
        )
        v, dfp, dfn, ex = [], [], [], []
        for e in np.unique(example):
            rows = np.flatnonzero(example == e)
            if not (np.isneginf(threshold[rows[0]]) and fp[rows[0]] == 0):
                raise ValueError(
                    f"example {e}: FP does not start at 0 (its first error-"
                    "function row must be at threshold -inf with fp = 0)"
                )
            if fn[rows[-1]] != 0:
                raise ValueError(
                    f"example {e}: FN does not end at 0 (its last row has "
                    f"fn = {fn[rows[-1]]})"
                )
            for a, b in zip(rows[:-1], rows[1:], strict=True):
                v.append(threshold[b])
                dfp.append(fp[b] - fp[a])
                dfn.append(fn[b] - fn[a])
                ex.append(e)
        return cls(np.array(v), np.array(dfp), np.array(dfn), np.array(ex))

    def is_binary(self) -> bool:
        """One breakpoint per example at v = 0, each a positive's FN step or a
        negative's FP step (as :meth:`binary` makes them)."""
        one_each = len(np.unique(self.example)) == len(self.example)
        steps = ((self.dfp > 0) & (self.dfn == 0)) | ((self.dfp == 0) & (self.dfn < 0))
        return bool(one_each and np.all(self.v == 0) and np.all(steps))

    def lines(self, pred, pred_direction):
        pred = np.asarray(pred, float)
        d = np.asarray(pred_direction, float)
        if not (np.isfinite(pred).all() and np.isfinite(d).all()):
            raise ValueError("predictions and their direction must be finite")
        return self.v - pred[self.example], -d[self.example]


def _bracket_first_min(c, m, dfp, dfn, max_evals=64) -> float:
    """A step size before the minimum of a convex piecewise-linear AUM along the lines,
    close to it: the last one found with a negative slope (0 if the slope at 0 is >= 0).
    """

    def at(s):  # one sort: O(B log B)
        q = np.argsort(c + m * s)
        return K.aum_slope_at(c, m, dfp, dfn, s, q)

    f_lo, g_lo = at(0.0)
    lo = 0.0
    if g_lo >= 0.0:
        return 0.0
    rate = float(np.ptp(m))
    hi = float(np.ptp(c)) / rate if rate > 0 and np.ptp(c) > 0 else 1.0
    evals = 1
    while True:  # the slope is >= 0 past the last crossing (the AUM is >= 0)
        f_hi, g_hi = at(hi)
        evals += 1
        if g_hi >= 0.0 or evals >= max_evals:
            break
        lo, f_lo, g_lo = hi, f_hi, g_hi
        hi *= 4.0
    while evals < max_evals and g_hi >= 0.0:
        # where the tangents at lo and hi meet: on the minimising kink when lo and hi
        # lie on its two pieces
        s = (f_hi - f_lo + g_lo * lo - g_hi * hi) / (g_lo - g_hi)
        if not lo < s < hi:
            break
        f, g = at(s)
        evals += 1
        kink = abs(f - (f_lo + g_lo * (s - lo))) <= 1e-10 * max(abs(f), 1e-300)
        if g < 0.0:
            lo, f_lo, g_lo = s, f, g
        else:
            hi, f_hi, g_hi = s, f, g
            if kink:
                break  # s is the minimiser; [lo, s] is one linear piece
    return lo


def aum_auc(pred, breakpoints: Breakpoints):
    """(AUM, AUC) of predictions (brute force: sort and sum; tied thresholds make one
    ROC segment)."""
    c, m = breakpoints.lines(pred, np.zeros_like(np.asarray(pred, float)))
    return K.aum_auc_at(c, m, breakpoints.dfp, breakpoints.dfn, 0.0)


def aum_gradient(pred, breakpoints: Breakpoints) -> np.ndarray:
    """A subgradient of the AUM with respect to the predictions (Hillman and Hocking
    2023): dAUM/dT at sorted position b is M_b - M_{b+1} (M_0 = M_B = 0), dT/dyhat = -1."""
    c, _ = breakpoints.lines(pred, np.zeros_like(np.asarray(pred, float)))
    order = np.argsort(c, kind="mergesort")
    dfp, dfn = breakpoints.dfp[order], breakpoints.dfn[order]
    FP = np.r_[0.0, np.cumsum(dfp)]
    FN = np.r_[np.cumsum((-dfn)[::-1])[::-1], 0.0]
    M = np.minimum(FP, FN)  # gaps 0..B
    g_sorted = M[:-1] - M[1:]  # dAUM / dT at each sorted breakpoint
    g = np.zeros(len(pred))
    np.add.at(g, breakpoints.example[order], -g_sorted)
    return g


@dataclass
class LineSearchResult:
    """Pieces of the AUM / AUC along the step size: on [step_sizes[i], step_sizes[i+1])
    the AUM is aum[i] + aum_slope[i] (s - step_sizes[i]) and, on the open interval, the
    AUC is auc[i] (exactly at an intersection tied thresholds make one diagonal ROC
    segment: :func:`aum_auc` gives that value). For "first-min" and "linear" the last
    piece is known only up to its start."""

    step_sizes: np.ndarray
    aum: np.ndarray
    aum_slope: np.ndarray
    auc: np.ndarray
    intersections: int
    variant: str

    def _piece(self, s) -> np.ndarray:
        s = np.asarray(s, float)
        if np.any(s < self.step_sizes[0]):
            raise ValueError(
                f"step sizes must be >= {self.step_sizes[0]:g} (where this search's "
                "pieces start)"
            )
        return np.searchsorted(self.step_sizes, s, side="right") - 1

    def aum_at(self, s):
        i = self._piece(s)
        return self.aum[i] + self.aum_slope[i] * (
            np.asarray(s, float) - self.step_sizes[i]
        )

    def auc_at(self, s):
        return self.auc[self._piece(s)]

    def best_step(self) -> float:
        """The step size of least AUM among the pieces explored."""
        return float(self.step_sizes[int(np.argmin(self.aum))])


def line_search(
    labels_or_breakpoints,
    pred,
    pred_direction,
    variant: str = "first-min",
    max_intersections: int | None = None,
    bracket: bool = False,
) -> LineSearchResult:
    """Exact line search of the AUM and AUC of ``pred + s * pred_direction``, s >= 0.

    ``bracket=True`` (variant "first-min" only; the AUM must be convex in s, as it is
    for binary labels): first narrow down where the minimum lies by evaluating the AUM
    and its slope at a few step sizes (one sort each, O(B log B)): doubling until the
    slope is >= 0, then the intersection of the tangents at the bracket's ends, which
    lands on the minimising kink after a few rounds. The path is then followed exactly
    from the last step size with a negative slope, so the result (the same minimiser)
    has pieces only from ``step_sizes[0] > 0`` on, and ``intersections`` counts only
    those followed. Path-following from 0 processes every crossing before the minimum,
    up to B^2 / 2."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    if bracket and variant != "first-min":
        raise ValueError(f'bracket=True needs variant="first-min", got {variant!r}')
    bp = (
        labels_or_breakpoints
        if isinstance(labels_or_breakpoints, Breakpoints)
        else Breakpoints.binary(labels_or_breakpoints)
    )
    if bracket and not bp.is_binary():
        raise ValueError(
            "bracket=True needs binary-classification breakpoints (one per example "
            "at v = 0), where the AUM is convex in the step size; general error "
            "functions can have several local minima: use bracket=False"
        )
    c, m = bp.lines(pred, pred_direction)
    start = _bracket_first_min(c, m, bp.dfp, bp.dfn) if bracket else 0.0
    if start > 0.0:
        c = c + m * start  # the same lines, from s = start
    # identical lines tie at every step size: merge them into one breakpoint (np.unique
    # also sorts the lines by (intercept, slope), the kernel's starting order)
    # (numpy orders complex numbers by real part, then imaginary: a 1-D sort, several
    # times faster than np.unique(axis=0) on the pairs)
    uniq, inv = np.unique(c + 1j * m, return_inverse=True)
    inv = inv.ravel()
    dfp = np.bincount(inv, weights=bp.dfp, minlength=len(uniq))
    dfn = np.bincount(inv, weights=bp.dfn, minlength=len(uniq))
    c, m = uniq.real.copy(), uniq.imag.copy()
    B = len(c)
    most = B * (B - 1) // 2 + 2  # pieces cannot outnumber intersections
    if max_intersections is not None:
        most = min(most, max_intersections + 2)
    cap = min(most, 4 * B + 8)
    max_events = (
        max_intersections if max_intersections is not None else np.iinfo(np.int64).max
    )
    while True:  # grow the outputs if the search needs more pieces than guessed
        out = [np.empty(cap) for _ in range(4)]
        n, events, full = K.line_search(
            c, m, dfp, dfn, VARIANTS[variant], max_events, *out
        )
        if not full or cap >= most:
            break
        cap = min(most, 4 * cap)
    s, a, sl, au = (o[:n].copy() for o in out)
    return LineSearchResult(
        step_sizes=s + start,
        aum=a,
        aum_slope=sl,
        auc=au,
        intersections=int(events),
        variant=variant,
    )


def plot_line_search(
    result: LineSearchResult, path, breakpoints=None, pred=None, pred_direction=None
):
    """AUM and AUC against the step size for one line search (PNG), like the paper's
    Figures 3-4; with the breakpoints and predictions, a brute-force check is overlaid."""
    from bigrate._plot import pyplot, save_png

    plt = pyplot()
    s = result.step_sizes
    top = s[-1] * 1.2 if s[-1] > 0 else 1.0
    grid = np.linspace(0, top, 400)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    a1.plot(grid, result.aum_at(grid), label="line search (exact)")
    a2.step(np.r_[s, top], np.r_[result.auc, result.auc[-1]], where="post")
    if breakpoints is not None:
        c, m = breakpoints.lines(pred, pred_direction)
        bf = np.array(
            [K.aum_auc_at(c, m, breakpoints.dfp, breakpoints.dfn, x) for x in grid]
        )
        a1.plot(grid, bf[:, 0], ":", label="brute force")
    for x in s:
        a1.axvline(x, color="grey", lw=0.3)
    a1.set_ylabel("AUM")
    a1.legend(fontsize=8)
    a2.set_ylabel("AUC")
    a2.set_xlabel("step size")
    a1.set_title(
        f"line search ({result.variant}): {result.intersections} intersections"
    )
    return save_png(fig, path)
