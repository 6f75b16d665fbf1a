"""The one registry of the estimators that jobs and ``bigrate train`` can name: every
estimator :mod:`bigrate` exports, by name. What each one can do and promises (how a job
fits it, what its fit is given, the job kinds it runs, its rate target, the metric its
sweeps select by) is declared by the estimator class itself
(:class:`bigrate.base.RateClassifierMixin`) and read from there, here and everywhere
else: the runner dispatches on those declarations, never on names."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    module: str
    cls: str

    def load(self):
        return getattr(importlib.import_module(self.module), self.cls)

    @property
    def fit(self) -> str:
        """How a job fits it (``_job_fit``): "rounds", "task", "search" or "sweep"."""
        return self.load()._job_fit

    @property
    def data(self) -> str:
        """What its fit task is given (``_job_data``): "shards", "sparse", "dense"."""
        return self.load()._job_data

    @property
    def kinds(self) -> tuple:
        """The job kinds it runs (``_job_kinds``)."""
        return tuple(self.load()._job_kinds)

    @property
    def streams(self) -> bool:
        """Trained by the checkpointed distributed rounds."""
        return self.fit == "rounds"

    @property
    def target(self) -> str | None:
        """The parameter holding the rate it promises ("rho", "q") or None."""
        return self.load()._rate_target

    @property
    def select(self) -> str:
        """The metric its sweeps select by by default."""
        return self.load()._sweep_select


ESTIMATORS = {
    name: Entry(module, name)
    for module, names in (
        ("bigrate.linear", ("NeymanPearsonSGD", "QValueSGD")),
        ("bigrate.kernel", ("NeymanPearsonSVC", "CostSensitiveSVC")),
        ("bigrate.aum", ("AUMLinearClassifier",)),
        ("bigrate.quantile", ("QuantilePathSVC",)),
        ("bigrate.constrained", ("RateConstrainedClassifier",)),
        ("bigrate.model_selection", ("BPSPSearchCV", "NPSearchCV")),
    )
    for name in names
}


def entry(name: str) -> Entry:
    if name not in ESTIMATORS:
        raise ValueError(
            f"estimator must be one of {', '.join(sorted(ESTIMATORS))}; got {name!r}"
        )
    return ESTIMATORS[name]


def estimator_class(name: str):
    return entry(name).load()


def make_estimator(name: str, params: dict):
    """``name(**params)``, refusing parameters the estimator does not have."""
    cls = estimator_class(name)
    valid = set(cls().get_params()) if entry(name).fit != "sweep" else set()
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"{name} has no parameter(s) {unknown}; valid: {sorted(valid)}"
        )
    return cls(**params)
