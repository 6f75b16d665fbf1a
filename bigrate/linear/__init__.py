"""Stochastic linear learners: Neyman-Pearson and q-value SGD (Gasso et al. 2011), in
one process or distributed over an engine's workers (:mod:`bigrate.linear.distributed`).

The names load on first use: a worker that imports :mod:`bigrate.linear.distributed`
or :mod:`bigrate.linear.steps` for its rounds does not import the estimators (and
scikit-learn with them)."""

import importlib

_WHERE = {
    "fit_distributed": "bigrate.linear.distributed",
    "NeymanPearsonSGD": "bigrate.linear.sgd",
    "QValueSGD": "bigrate.linear.sgd",
    "KernelConfig": "bigrate.linear.steps",
    "SGDState": "bigrate.linear.steps",
    "StateSum": "bigrate.linear.steps",
    "StreamPlan": "bigrate.linear.steps",
    "add_state_sums": "bigrate.linear.steps",
    "merge_states": "bigrate.linear.steps",
    "steps_from": "bigrate.linear.steps",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'bigrate.linear' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
