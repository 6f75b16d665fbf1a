"""Dataset constraints (Goh et al. 2016): a vocabulary of rates on datasets (fairness,
coverage, churn, recall, ...) and a linear learner that meets them with ramp losses."""

from bigrate.constrained import vocabulary
from bigrate.constrained.classifier import (
    RateConstrainedClassifier,
    plot_target_vs_achieved,
)
from bigrate.constrained.vocabulary import *  # noqa: F403 (its __all__, named below)

__all__ = [
    "RateConstrainedClassifier",
    "plot_target_vs_achieved",
    *vocabulary.__all__,
]
