"""Rate metrics for rate-constrained classification.

Conventions (Gasso et al. 2011; ``../shared/docs/algorithms.md``): labels y in {+1, -1},
decision values f. A negative is a **false alarm** when f >= 0 and a positive is a
**non-detection** (miss) when f <= 0: a tie at exactly 0 counts as an error for both
rates (the conservative reading), while ``predict`` returns +1 for f >= 0.

Everything here also works streaming: :class:`Confusion` counts are mergeable, and
:func:`evaluate_stream` scores a :class:`~bigrate.ShardedDataset` batch by batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

__all__ = [
    "Confusion",
    "auto_calibration_fraction",
    "best_per_group",
    "calibrated_pfa",
    "evaluate_stream",
    "j_val",
    "np_umbrella_order",
    "np_umbrella_threshold",
    "pfa_pnd",
    "positives_at_q",
    "qvalues",
    "roc_points",
    "umbrella_need",
]


def _check(y, f):
    y = np.asarray(y).ravel()
    f = np.asarray(f, dtype=np.float64).ravel()
    if y.shape != f.shape:
        raise ValueError(f"y and scores differ in length: {y.shape[0]} vs {f.shape[0]}")
    if not np.isin(y, (-1, 1)).all():
        raise ValueError(f"labels must be +1 / -1, got {np.unique(y)[:5]}")
    if not np.isfinite(f).all():
        raise ValueError("scores contain NaN or infinity")
    return y, f


@dataclass
class Confusion:
    """Mergeable counts: negatives, false alarms (f >= 0), positives, misses (f <= 0)."""

    n_neg: int = 0
    false_alarms: int = 0
    n_pos: int = 0
    misses: int = 0

    @classmethod
    def of(cls, y, f) -> Confusion:
        y, f = _check(y, f)
        neg, pos = y < 0, y > 0
        return cls(
            int(neg.sum()),
            int((f[neg] >= 0).sum()),
            int(pos.sum()),
            int((f[pos] <= 0).sum()),
        )

    def __add__(self, o: Confusion) -> Confusion:
        return Confusion(
            self.n_neg + o.n_neg,
            self.false_alarms + o.false_alarms,
            self.n_pos + o.n_pos,
            self.misses + o.misses,
        )

    @property
    def pfa(self) -> float:
        return self.false_alarms / self.n_neg if self.n_neg else float("nan")

    @property
    def pnd(self) -> float:
        return self.misses / self.n_pos if self.n_pos else float("nan")

    def j_val(self, rho: float) -> float:
        return j_val(self.pfa, self.pnd, rho)


def pfa_pnd(y, f) -> tuple[float, float]:
    """(false-alarm rate, non-detection rate) of decision values ``f`` on labels ``y``."""
    c = Confusion.of(y, f)
    return c.pfa, c.pnd


def j_val(pfa: float, pnd: float, rho: float) -> float:
    """The NP model-selection score of Gasso et al. sec. 5.4:
    J = Pnd + max(0, Pfa - rho) / rho (lower is better)."""
    if not 0 < rho < 1:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    return pnd + max(0.0, pfa - rho) / rho


def qvalues(y, f, *, plus_one: bool = False) -> np.ndarray:
    """q-value of every example: for the threshold at its score, (#negatives scoring at
    least as high) / (#positives scoring at least as high), made monotone (Storey:
    the minimum over all lower thresholds). ``plus_one`` uses (#neg + 1) / #pos, the
    conservative target-decoy estimate mokapot and Percolator report.
    Returned in the input order."""
    y, f = _check(y, f)
    order = np.argsort(-f, kind="stable")
    fs, ys = f[order], y[order]
    # group ties: cumulative counts at the end of each run of equal scores
    npos = np.cumsum(ys > 0)
    nneg = np.cumsum(ys < 0)
    last = np.r_[fs[1:] != fs[:-1], True]
    idx = np.flatnonzero(last)
    run_end = np.searchsorted(idx, np.arange(len(fs)))
    p = npos[idx][run_end]
    n = nneg[idx][run_end] + (1 if plus_one else 0)
    fdr = np.where(p > 0, n / np.maximum(p, 1), np.inf)
    q = np.minimum.accumulate(fdr[::-1])[::-1]
    out = np.empty_like(q)
    out[order] = q
    return out


def positives_at_q(y, f, q: float, *, plus_one: bool = False) -> int:
    """Number of positives (targets) with q-value <= q: the accepted discoveries."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    y, f = _check(y, f)
    return int(((qvalues(y, f, plus_one=plus_one) <= q) & (y > 0)).sum())


def best_per_group(f, groups) -> np.ndarray:
    """Boolean mask of the highest-scoring row of each group (target-decoy competition:
    of the PSMs of one spectrum only the best, target or decoy, is kept). ``groups``
    are any hashable labels or integer codes; a tie keeps the first row."""
    f = np.asarray(f, dtype=np.float64)
    g = np.asarray(groups)
    if f.ndim != 1 or g.shape != f.shape:
        raise ValueError(
            f"f and groups must be 1-d of the same length, got {f.shape} and {g.shape}"
        )
    if np.isnan(f).any():
        raise ValueError("f contains NaN")
    if g.dtype.kind not in "iu":
        g = np.unique(g, return_inverse=True)[1]
    order = np.lexsort((-f, g))  # by group, best score first (stable: ties in order)
    first = np.r_[True, g[order][1:] != g[order][:-1]]
    keep = np.zeros(len(f), dtype=bool)
    keep[order[first]] = True
    return keep


def roc_points(y, f) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false-alarm rates, detection rates, thresholds) for thresholds at every distinct
    score, decreasing; a point means 'positive when f >= threshold'."""
    y, f = _check(y, f)
    order = np.argsort(-f, kind="stable")
    fs, ys = f[order], y[order]
    last = np.r_[fs[1:] != fs[:-1], True]
    tp = np.cumsum(ys > 0)[last]
    fp = np.cumsum(ys < 0)[last]
    npos, nneg = max(int((y > 0).sum()), 1), max(int((y < 0).sum()), 1)
    return np.r_[0.0, fp / nneg], np.r_[0.0, tp / npos], np.r_[np.inf, fs[last]]


def umbrella_need(rho: float, delta: float) -> int:
    """The fewest held-out negatives the NP umbrella threshold needs:
    log(delta) / log(1 - rho), rounded up (59 at rho 0.05, delta 0.05)."""
    return math.ceil(math.log(delta) / math.log(1 - rho))


def np_umbrella_order(n: int, rho: float, delta: float) -> int:
    """The rank k (1-based, among n sorted held-out negative scores) of the NP umbrella
    threshold (Tong, Feng and Li 2018): the smallest k with
    P(Binomial(n, 1 - rho) >= k) <= delta. Thresholding at the k-th smallest score
    gives P(Pfa > rho) <= delta over the draw of the held-out negatives.
    Raises when n is too small: n must be at least log(delta) / log(1 - rho)."""
    if not 0 < rho < 1:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    need = umbrella_need(rho, delta)
    if n < need:
        raise ValueError(
            f"the NP umbrella threshold needs at least {need} held-out negatives for "
            f"rho={rho}, delta={delta}; got {n} (hold out more negatives or raise delta)"
        )
    k = np.arange(1, n + 1)
    tail = binom.sf(k - 1, n, 1 - rho)  # P(B >= k)
    ok = np.flatnonzero(tail <= delta)
    return int(k[ok[0]])


def np_umbrella_threshold(neg_scores, rho: float, delta: float = 0.05) -> float:
    """Score threshold t from held-out negatives' scores such that classifying
    'positive when score > t' has false-alarm rate at most ``rho`` with probability at
    least 1 - ``delta`` (the nproc umbrella algorithm, Tong, Feng and Li 2018)."""
    s = np.sort(np.asarray(neg_scores, dtype=np.float64).ravel())
    if not np.isfinite(s).all():
        raise ValueError("neg_scores contain NaN or infinity")
    k = np_umbrella_order(len(s), rho, delta)
    return float(s[k - 1])


def np_quantile_threshold(neg_scores, rho: float, *, expected: bool = True) -> float:
    """Score threshold t from m held-out negatives' scores, to classify 'positive when
    score > t'.

    ``expected=True`` (default): t is the (k+1)-th largest score with the largest k
    such that (k + 1) / (m + 1) <= rho. For continuous scores the false-alarm rate on
    new data of that threshold is Beta(k + 1, m - k) distributed, with mean
    (k + 1) / (m + 1): at most rho on average (no high-probability bound: see
    :func:`np_umbrella_threshold`). Needs m >= 1 / rho - 1.

    ``expected=False``: their empirical (1 - rho) quantile, flagging floor(rho m) of
    them (k = floor(rho m)); on new data its Pfa is rho + (1 - rho) / (m + 1) on average
    (e.g. 0.095 for 20 negatives at rho 0.05), what moving a threshold on held-out data
    usually gives."""
    if not 0 < rho < 1:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    s = np.sort(np.asarray(neg_scores, dtype=np.float64).ravel())[::-1]
    m = len(s)
    if m == 0:
        raise ValueError("no held-out negative scores to set a threshold from")
    if not np.isfinite(s).all():
        raise ValueError("neg_scores contain NaN or infinity")
    if expected:
        k = int(math.floor(rho * (m + 1) + 1e-9)) - 1
        if k < 0:
            need = math.ceil(1.0 / rho - 1.0 - 1e-9)
            raise ValueError(
                f"a threshold with expected false-alarm rate <= rho={rho} needs at "
                f"least {need} held-out negatives; got {m}"
            )
    else:
        k = int(math.floor(rho * m + 1e-9))  # false alarms allowed
    return float(s[k]) if k < m else float(-np.inf)


def calibrated_pfa(m: int, rho: float, delta: float = 0.05,
                   rule: str = "auto") -> float:  # fmt: skip
    """The mean false-alarm rate on new data of the threshold a calibration on ``m``
    held-out negatives will set, known before any of them is scored: for continuous
    scores the j-th largest of m held-out scores lets through a share of new negatives
    distributed Beta(j, m + 1 - j), of mean j / (m + 1).

    ``rule`` "umbrella" (or "auto" where m is enough for it): the umbrella order
    statistic, k-th smallest (:func:`np_umbrella_order`), so (m + 1 - k) / (m + 1),
    well under rho when m is small (1 / 60 at m = 59, rho 0.05); "quantile" (or "auto"
    with fewer): the order statistic of :func:`np_quantile_threshold`, about rho;
    "auto" with too few for that (no threshold is set): rho.
    An NP learner trained for this rate instead of rho is trained for the operating
    point its calibrated threshold will have."""
    need = umbrella_need(rho, delta)
    if rule == "umbrella" or (rule == "auto" and m >= need):
        k = np_umbrella_order(m, rho, delta)
        return (m + 1 - k) / (m + 1)
    if rule not in ("auto", "quantile"):
        raise ValueError(f"rule must be 'auto', 'umbrella' or 'quantile', got {rule!r}")
    j = int(math.floor(rho * (m + 1) + 1e-9))  # the j-th largest score
    if j < 1 and rule == "auto":  # too few for any threshold: the training one stays
        return float(rho)
    return min(max(j, 1), m) / (m + 1)


def auto_calibration_fraction(
    n_neg: int, rho: float, delta: float = 0.05, spare: float = 0.0
) -> float:
    """The share of ``n_neg`` negatives an NP fit holds out to calibrate by default:
    0.3, raised to what the umbrella threshold needs (log(delta) / log(1 - rho)
    held-out negatives, plus ``spare`` binomial standard deviations where each
    negative is held out at random) where at most 60% of them do; else 0.3 (then the
    expected-Pfa threshold, with a warning). nproc holds out half of class 0."""
    need = umbrella_need(rho, delta)
    want = (need + spare * math.sqrt(need)) / max(n_neg, 1)
    return max(0.3, want) if want <= 0.6 else 0.3


def np_threshold(neg_scores, rho: float, delta: float = 0.05) -> tuple:
    """The default calibration of the NP estimators (``calibrate="auto"``): from m
    held-out negatives' scores, ``(t, guarantee)`` with t the threshold ('positive when
    score > t') and ``guarantee`` what it promises on new data, as plain data
    (``kind``, ``rho``, ``delta``, ``n_calibration``, ``text``):

    - "umbrella" where m >= log(delta) / log(1 - rho) (59 at rho 0.05, delta 0.05): the
      NP umbrella order statistic, P(Pfa > rho) <= delta (:func:`np_umbrella_threshold`);
    - "expected" where m >= 1 / rho - 1 only: Pfa <= rho on average
      (:func:`np_quantile_threshold`), with a warning naming the numbers;
    - "none" below that: t is None (no threshold can be set from so few), with a
      warning; the model keeps its training threshold.
    """
    import warnings

    from bigrate.errors import BigrateWarning

    m = len(np.asarray(neg_scores).ravel())
    need = umbrella_need(rho, delta)
    g = {"rho": float(rho), "delta": float(delta), "n_calibration": m}
    if m >= need:
        t = np_umbrella_threshold(neg_scores, rho, delta)
        text = (f"P(Pfa > {rho:g}) <= {delta:g} on new data (the NP umbrella "
                f"threshold of {m:,} held-out negatives)")  # fmt: skip
        return t, {**g, "kind": "umbrella", "text": text}
    short = (
        f"{m} held-out negatives, fewer than the {need} the NP umbrella threshold "
        f"needs for rho={rho:g}, delta={delta:g}"
    )
    if m >= math.ceil(1.0 / rho - 1.0 - 1e-9):
        warnings.warn(
            f"{short}: the threshold holds Pfa <= rho on new data on average only; "
            "more negatives (or a larger calibration_fraction) give the guarantee",
            BigrateWarning,
            stacklevel=3,
        )
        t = np_quantile_threshold(neg_scores, rho)
        text = (f"Pfa <= {rho:g} on new data on average (the order statistic of "
                f"{m:,} held-out negatives; too few for the umbrella threshold)")  # fmt: skip
        return t, {**g, "kind": "expected", "text": text}
    warnings.warn(
        f"{short}, and too few for any threshold on them (at least "
        f"{math.ceil(1.0 / rho - 1.0 - 1e-9)}): the model keeps its training threshold, "
        "which promises nothing on new data",
        BigrateWarning,
        stacklevel=3,
    )
    text = f"none on new data ({m} held-out negatives: too few to set a threshold)"
    return None, {**g, "kind": "none", "text": text}


def evaluate_stream(
    decision_function, dataset, split: str = "test", *, batch_rows: int = 65_536
) -> Confusion:
    """Confusion counts of a model over a whole split of a ShardedDataset, streaming."""
    total = Confusion()
    for b in dataset.iter_batches(split, batch_rows=batch_rows):
        total = total + Confusion.of(b.y, decision_function(b.X))
    return total


#: the metrics sweeps select by, and whether smaller ("min") or larger ("max") is better
SELECT = {
    "J_val": "min",
    "accepted": "max",
    "pnd": "min",
    "error_rate": "min",
    "cost": "min",
    "auc": "max",
}


def auc(y, f) -> float:
    """Area under the ROC curve of scores ``f`` for labels ``y`` (+1 / -1): the chance
    that a random positive scores above a random negative, ties counting one half
    (NaN without both classes)."""
    from scipy.stats import rankdata

    y = np.asarray(y)
    pos = y > 0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(np.asarray(f, dtype=np.float64))
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rate_metrics(
    y,
    f,
    *,
    rho: float | None = None,
    q: float | None = None,
    cost: tuple[float, float] | None = None,
) -> dict:
    """The one evaluation of a rate classifier's scores ``f`` on labels ``y`` (+1 / -1),
    used by training, sweeps and jobs alike, with one spelling of every metric:

    - ``pfa``, ``pnd``, ``n_pos``, ``n_neg``, ``error_rate`` (the share of rows
      misclassified: misses and false alarms as Pnd and Pfa count them) and ``auc``
      (area under the ROC curve) always;
    - with ``rho`` (Neyman-Pearson): ``J_val`` = Pnd + max(0, Pfa - rho) / rho and
      ``pfa_within_rho`` (Pfa <= rho);
    - with ``q`` (q-value): ``accepted``, the positives accepted at q-value <= q, and
      ``fdr``, the estimated false discovery rate of the model's own accepted set
      (f >= 0): negatives (decoys) accepted / positives (targets) accepted;
    - with ``cost = (cost_fn, cost_fp)``: ``cost``, the cost-weighted errors per row,
      (cost_fn FN + cost_fp FP) / n (BPSP's CV error).

    Examples
    --------
    >>> import numpy as np
    >>> m = rate_metrics(np.array([1, 1, -1, -1]), np.array([2.0, -1.0, -3.0, 0.5]),
    ...                  rho=0.5)
    >>> m["pfa"], m["pnd"], m["J_val"], m["pfa_within_rho"], m["error_rate"], m["auc"]
    (0.5, 0.5, 0.5, True, 0.5, 0.75)
    """
    y = np.asarray(y)
    f = np.asarray(f, dtype=np.float64)
    c = Confusion.of(y, f)
    n = max(c.n_pos + c.n_neg, 1)
    out = {"pfa": c.pfa, "pnd": c.pnd, "n_pos": c.n_pos, "n_neg": c.n_neg,
           "error_rate": (c.misses + c.false_alarms) / n, "auc": auc(y, f)}  # fmt: skip
    if rho is not None:
        out["J_val"] = c.j_val(rho)
        out["pfa_within_rho"] = bool(c.pfa <= rho)
    if q is not None:
        out["accepted"] = int(positives_at_q(y, f, q))
        taken = f >= 0
        out["fdr"] = float(
            np.sum(taken & (y < 0)) / max(int(np.sum(taken & (y > 0))), 1)
        )
    if cost is not None:
        out["cost"] = (float(cost[0]) * c.misses + float(cost[1]) * c.false_alarms) / n
    return out


def evaluate_split(decision_function, dataset, split: str, **target) -> dict:
    """:func:`rate_metrics` of a model on one split of a ShardedDataset, streamed (only
    the labels and scores are kept)."""
    ys, fs = [], []
    for b in dataset.iter_batches(split):
        ys.append(np.asarray(b.y))
        fs.append(np.asarray(decision_function(b.X), dtype=np.float64))
    y = np.concatenate(ys) if ys else np.empty(0, np.int8)
    f = np.concatenate(fs) if fs else np.empty(0)
    return rate_metrics(y, f, **target)
