"""A small declarative vocabulary of dataset constraints (Goh et al. 2016, Table 2).

Every quantity is a linear combination of *rates* plus a constant: the positive
prediction rate ``s_p(D)`` and negative prediction rate ``s_n(D)`` of the classifier on
a dataset D, where D is a subset of the training rows (by group, label, explicit mask)
or of a separate, possibly unlabeled, dataset passed to ``fit(datasets={...})``.
Comparing two expressions gives a :class:`Constraint`::

    positive_rate(group="Female") >= 0.8 * positive_rate(group="Male")
    churn(baseline=deployed, dataset="traffic") <= 0.03
    recall() >= 0.9

Derived metrics (Table 2, rederived from s_p and s_n):

- coverage(D) = s_p(D); recall(D) = true_positive_rate(D) = s_p(D+);
  false_positive_rate(D) = s_p(D-); true_negative_rate = s_n(D-); false_negative_rate =
  s_n(D+);
- TP / FP / TN / FN counts = |D+| s_p(D+), |D-| s_p(D-), |D-| s_n(D-), |D+| s_n(D+);
- error_rate(D) = (|D+| s_n(D+) + |D-| s_p(D-)) / |D|;
- churn(D, baseline) = (|D_b+| s_n(D_b+) + |D_b-| s_p(D_b-)) / |D| where D_b+- are the
  rows the baseline predicts positive / negative;
- demographic_parity(A, B, kappa): s_p(A) >= kappa s_p(B);
- equal_opportunity(A, B, kappa): s_p(A+) >= kappa s_p(B+);
- egregious(D, max_error): error_rate(D) <= max_error.

Sizes |D+| etc. are only known at fit time, so terms carry a *scale*: "rate" (as is),
"share" (times |D| / |parent|) or "count" (times |D|). :meth:`Expr.normalise` turns an
expression into non-negative combinations of s_p / s_n terms plus a constant, using
s_p = 1 - s_n (exact for the ramp), as the paper's Problem 2 requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Real

import numpy as np

__all__ = [
    "Constraint",
    "Expr",
    "Subset",
    "churn",
    "count_false_negatives",
    "count_false_positives",
    "count_true_negatives",
    "count_true_positives",
    "coverage",
    "demographic_parity",
    "egregious",
    "equal_opportunity",
    "error_rate",
    "false_negative_rate",
    "false_positive_rate",
    "negative_rate",
    "positive_rate",
    "recall",
    "true_negative_rate",
    "true_positive_rate",
]


@dataclass(frozen=True, eq=False)
class Subset:
    """Rows of a dataset: ``dataset`` ("train" = the rows given to fit, or a key of
    ``fit(datasets=...)``), optionally only one ``group`` value, one ``label`` (+1 / -1,
    labeled data only), an explicit boolean ``mask`` over the dataset's rows, and the
    rows a ``baseline`` model predicts as ``baseline_sign``."""

    dataset: str = "train"
    group: object = None
    label: int | None = None
    mask: np.ndarray | None = None
    baseline: object = None
    baseline_sign: int | None = None

    def with_(self, **kw) -> Subset:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(kw)
        return Subset(**d)

    def describe(self) -> str:
        parts = [self.dataset]
        if self.group is not None:
            parts.append(f"group={self.group!r}")
        if self.label is not None:
            parts.append("y=+1" if self.label > 0 else "y=-1")
        if self.mask is not None:
            parts.append(f"mask({int(np.sum(self.mask))} rows)")
        if self.baseline is not None:
            parts.append(f"baseline {'+' if self.baseline_sign > 0 else '-'}")
        return ", ".join(parts)


@dataclass(frozen=True, eq=False)
class Term:
    coef: float
    kind: str  # "p" (positive rate) or "n" (negative rate)
    subset: Subset
    scale: str = "rate"  # "rate", "share" (|subset| / |parent|) or "count" (|subset|)
    parent: Subset | None = None


@dataclass(frozen=True, eq=False)
class Expr:
    """A linear combination of rates plus a constant."""

    terms: tuple = ()
    const: float = 0.0
    name: str = field(default="", compare=False)

    # arithmetic ---------------------------------------------------------------
    def __add__(self, other):
        if isinstance(other, Real):
            return Expr(self.terms, self.const + float(other))
        if isinstance(other, Expr):
            return Expr(self.terms + other.terms, self.const + other.const)
        return NotImplemented

    __radd__ = __add__

    def __mul__(self, k):
        if not isinstance(k, Real):
            return NotImplemented
        k = float(k)
        terms = tuple(
            Term(t.coef * k, t.kind, t.subset, t.scale, t.parent) for t in self.terms
        )
        return Expr(terms, self.const * k)

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1.0

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __le__(self, other) -> Constraint:
        return Constraint(self - other, _bound_of(self, other, "<="))

    def __ge__(self, other) -> Constraint:
        return Constraint(other - self, _bound_of(self, other, ">="))

    @property
    def is_single_rate(self) -> bool:
        return (
            len(self.terms) == 1
            and self.terms[0].coef == 1.0
            and self.terms[0].scale == "rate"
            and self.const == 0.0
        )


def _bound_of(lhs: Expr, rhs, op: str):
    """Check a rate compared with a number: the number must be in [0, 1]."""
    if isinstance(rhs, Real) and lhs.is_single_rate and not 0.0 <= float(rhs) <= 1.0:
        raise ValueError(
            f"a rate is compared with {rhs!r} ({op}): a rate target must be in [0, 1]"
        )
    return f"{op} {rhs!r}" if isinstance(rhs, Real) else op


@dataclass(frozen=True, eq=False)
class Constraint:
    """``expr <= 0`` (comparisons are rewritten so)."""

    expr: Expr
    text: str = ""


# constructors ---------------------------------------------------------------
def _subset(dataset, group, mask, label=None):
    if mask is not None:
        mask = np.asarray(mask, bool)
    return Subset(dataset=dataset, group=group, label=label, mask=mask)


def positive_rate(*, group=None, dataset="train", mask=None, label=None) -> Expr:
    """s_p(D): share of D predicted positive (ramp / randomised rule)."""
    return Expr((Term(1.0, "p", _subset(dataset, group, mask, label)),))


def negative_rate(*, group=None, dataset="train", mask=None, label=None) -> Expr:
    """s_n(D) = 1 - s_p(D)."""
    return Expr((Term(1.0, "n", _subset(dataset, group, mask, label)),))


def coverage(**kw) -> Expr:
    return positive_rate(**kw)


def true_positive_rate(*, group=None, dataset="train", mask=None) -> Expr:
    return positive_rate(group=group, dataset=dataset, mask=mask, label=1)


recall = true_positive_rate


def false_positive_rate(*, group=None, dataset="train", mask=None) -> Expr:
    return positive_rate(group=group, dataset=dataset, mask=mask, label=-1)


def true_negative_rate(*, group=None, dataset="train", mask=None) -> Expr:
    return negative_rate(group=group, dataset=dataset, mask=mask, label=-1)


def false_negative_rate(*, group=None, dataset="train", mask=None) -> Expr:
    return negative_rate(group=group, dataset=dataset, mask=mask, label=1)


def _count(kind, label, group, dataset, mask) -> Expr:
    s = _subset(dataset, group, mask, label)
    return Expr((Term(1.0, kind, s, "count"),))


def count_true_positives(*, group=None, dataset="train", mask=None) -> Expr:
    return _count("p", 1, group, dataset, mask)


def count_false_positives(*, group=None, dataset="train", mask=None) -> Expr:
    return _count("p", -1, group, dataset, mask)


def count_true_negatives(*, group=None, dataset="train", mask=None) -> Expr:
    return _count("n", -1, group, dataset, mask)


def count_false_negatives(*, group=None, dataset="train", mask=None) -> Expr:
    return _count("n", 1, group, dataset, mask)


def error_rate(*, group=None, dataset="train", mask=None) -> Expr:
    """(|D+| s_n(D+) + |D-| s_p(D-)) / |D| on labeled D."""
    parent = _subset(dataset, group, mask)
    return Expr(
        (
            Term(1.0, "n", parent.with_(label=1), "share", parent),
            Term(1.0, "p", parent.with_(label=-1), "share", parent),
        )
    )


def churn(*, baseline, group=None, dataset="train", mask=None) -> Expr:
    """Share of D where the prediction differs from ``baseline`` (any fitted model with
    ``decision_function``; positive when it is > 0). D may be unlabeled."""
    if baseline is None or not hasattr(baseline, "decision_function"):
        raise ValueError(
            "churn needs baseline=<the deployed model> (an object with "
            f"decision_function); got {baseline!r}"
        )
    parent = _subset(dataset, group, mask)
    return Expr(
        (
            Term(1.0, "n", parent.with_(baseline=baseline, baseline_sign=1), "share",
                 parent),
            Term(1.0, "p", parent.with_(baseline=baseline, baseline_sign=-1), "share",
                 parent),
        )
    )  # fmt: skip


def demographic_parity(group_a, group_b, kappa=0.8, *, dataset="train") -> Constraint:
    """s_p(A) >= kappa s_p(B): the positive rate of A at least kappa times B's."""
    _check_kappa(kappa)
    return positive_rate(group=group_a, dataset=dataset) >= kappa * positive_rate(
        group=group_b, dataset=dataset
    )


def equal_opportunity(group_a, group_b, kappa=0.8, *, dataset="train") -> Constraint:
    """recall(A) >= kappa recall(B)."""
    _check_kappa(kappa)
    return recall(group=group_a, dataset=dataset) >= kappa * recall(
        group=group_b, dataset=dataset
    )


def egregious(*, mask=None, dataset="train", max_error=0.0) -> Constraint:
    """These examples must be classified right: error_rate(D) <= max_error."""
    if not 0.0 <= max_error <= 1.0:
        raise ValueError(f"max_error must be in [0, 1]; got {max_error!r}")
    return error_rate(dataset=dataset, mask=mask) <= max_error


def _check_kappa(kappa):
    if not (isinstance(kappa, Real) and kappa >= 0):
        raise ValueError(f"kappa must be a number >= 0; got {kappa!r}")
