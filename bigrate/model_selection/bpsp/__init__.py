"""Bi-parameter space partition (BPSP, Gu et al. 2015) of the cost-sensitive SVM:
``geometry`` (polygons, clipping, overlays), ``partition`` (critical regions of the
solution path over two parameters), ``eta_path`` (the one-parameter path crossed with a
grid) and ``search`` (the exact CV error over every (C+, C-): BPSPSearchCV)."""

from bigrate.model_selection.bpsp.partition import (
    SPACES,
    Partitioner,
    affine_solution,
    inequalities,
    merge_duplicates,
)
from bigrate.model_selection.bpsp.search import BPSPSearchCV

__all__ = [
    "SPACES",
    "BPSPSearchCV",
    "Partitioner",
    "affine_solution",
    "inequalities",
    "merge_duplicates",
]
