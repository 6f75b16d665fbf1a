"""Paths and line searches: the quantile-SVM path (Yu et al.) and the exact AUM/AUC line
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

__all__ = [
    "QuantilePathSVC",
    "AUMLinearClassifier",
    "Breakpoints",
    "LineSearchResult",
    "aum_auc",
    "aum_gradient",
    "line_search",
    "plot_line_search",
]
