"""Model selection for rate-constrained learners: sweeps scored by J_val."""

from bigrate.model_selection.search import NPSearchCV

__all__ = ["NPSearchCV"]
