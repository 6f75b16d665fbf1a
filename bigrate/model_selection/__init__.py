"""Model selection for rate-constrained learners: sweeps scored by J_val, and the exact
bi-parameter cross-validation of the cost-sensitive SVM (BPSP)."""

from bigrate.model_selection.bpsp import BPSPSearchCV
from bigrate.model_selection.search import NPSearchCV

__all__ = ["BPSPSearchCV", "NPSearchCV"]
