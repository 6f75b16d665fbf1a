"""Paths and line searches: exact AUM/AUC line search (Fowler and Hocking)."""

from bigrate.path.aum import (
    AUMLinearClassifier,
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
    "plot_line_search",
]
