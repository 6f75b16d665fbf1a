"""Stochastic linear learners: Neyman-Pearson and q-value SGD (Gasso et al. 2011), in
one process or distributed over an engine's workers (:mod:`bigrate.linear.distributed`)."""

from bigrate.linear.distributed import fit_distributed
from bigrate.linear.sgd import (
    KernelConfig,
    NeymanPearsonSGD,
    QValueSGD,
    SGDState,
    StateSum,
    StreamPlan,
    add_state_sums,
    merge_states,
    steps_from,
)

__all__ = [
    "KernelConfig",
    "NeymanPearsonSGD",
    "QValueSGD",
    "SGDState",
    "StateSum",
    "StreamPlan",
    "add_state_sums",
    "fit_distributed",
    "merge_states",
    "steps_from",
]
