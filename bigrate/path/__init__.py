"""Paths and line searches: the quantile-SVM path (Yu et al.), dataset
constraints (Goh et al.) and the exact AUM/AUC line
search (Fowler and Hocking)."""

from bigrate.path.aum import (
    AUMLinearClassifier,
    Breakpoints,
    LineSearchResult,
    aum_auc,
    aum_gradient,
    line_search,
    plot_line_search,
)
from bigrate.path.quantile import QuantilePathSVC
from bigrate.path.rate_constrained import (
    RateConstrainedClassifier,
    plot_target_vs_achieved,
)

__all__ = [
    "QuantilePathSVC",
    "RateConstrainedClassifier",
    "plot_target_vs_achieved",
    "AUMLinearClassifier",
    "Breakpoints",
    "LineSearchResult",
    "aum_auc",
    "aum_gradient",
    "line_search",
    "plot_line_search",
]
