"""The area under the min of FP and FN (AUM), the AUC, and the exact AUM / AUC line
search for linear models (Fowler and Hocking), with a learner built on it."""

from bigrate.aum.classifier import AUMLinearClassifier, min_error_threshold
from bigrate.aum.line_search import (
    Breakpoints,
    LineSearchResult,
    aum_auc,
    aum_gradient,
    line_search,
    plot_line_search,
)

__all__ = [
    "AUMLinearClassifier",
    "Breakpoints",
    "LineSearchResult",
    "aum_auc",
    "aum_gradient",
    "line_search",
    "min_error_threshold",
    "plot_line_search",
]
