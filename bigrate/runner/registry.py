"""The one registry of the estimators that jobs and ``bigrate train`` can name: the class,
its rate target, the default sweep selection, and whether it streams shards (and so is
trained by the distributed rounds of :mod:`bigrate.linear.distributed` on a cluster)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    module: str
    cls: str
    target: str  # the rate-target parameter: "rho" or "q"
    select: str  # default sweep selection metric
    streams: (
        bool  # fits a ShardedDataset by streaming (distributed rounds on a cluster)
    )

    def load(self):
        return getattr(importlib.import_module(self.module), self.cls)


ESTIMATORS = {
    "NeymanPearsonSGD": Entry(
        "bigrate.linear", "NeymanPearsonSGD", "rho", "J_val", True
    ),
    "QValueSGD": Entry("bigrate.linear", "QValueSGD", "q", "accepted", True),
    "NeymanPearsonSVC": Entry(
        "bigrate.kernel", "NeymanPearsonSVC", "rho", "J_val", False
    ),
}


def entry(name: str) -> Entry:
    if name not in ESTIMATORS:
        raise ValueError(
            f"estimator must be one of {', '.join(sorted(ESTIMATORS))}; got {name!r}"
        )
    return ESTIMATORS[name]


def estimator_class(name: str):
    return entry(name).load()


def name_of(est) -> str | None:
    """The registry name of an estimator instance (None if it is not registered)."""
    return next((n for n, e in ESTIMATORS.items() if e.cls == type(est).__name__), None)


def make_estimator(name: str, params: dict):
    """``name(**params)``, refusing parameters the estimator does not have."""
    cls = estimator_class(name)
    valid = set(cls().get_params())
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"{name} has no parameter(s) {unknown}; valid: {sorted(valid)}"
        )
    return cls(**params)
