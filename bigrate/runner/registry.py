"""The one registry of the estimators that jobs and ``bigrate train`` can name: every
estimator :mod:`bigrate` exports, with how a job fits it and which job kinds it runs.
What each one promises (its rate target, the metric its sweeps select by) is declared
by the estimator class itself (:class:`bigrate.base.RateClassifierMixin`) and read
from there, here and everywhere else."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    module: str
    cls: str
    #: how a job fits it: "rounds" (the distributed SGD rounds of
    #: :mod:`bigrate.linear.distributed`, checkpointed), "task" (one engine task on the
    #: train split), "search" (BPSP: its (gamma, space, fold) tasks on the engine, each
    #: saved as it finishes, then the refit), "sweep" (NPSearchCV: its job is a sweep
    #: job of the estimator it searches)
    fit: str
    #: the job kinds it runs
    kinds: tuple = ("train", "sweep", "evaluate")
    #: what its fit task is given: "shards" (the ShardedDataset: it streams, or reads
    #: groups from the shards), "sparse" (the train split as CSR), "dense"
    data: str = "sparse"

    def load(self):
        return getattr(importlib.import_module(self.module), self.cls)

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
    "NeymanPearsonSGD": Entry(
        "bigrate.linear", "NeymanPearsonSGD", "rounds", data="shards"
    ),  # fmt: skip
    "QValueSGD": Entry("bigrate.linear", "QValueSGD", "rounds", data="shards"),
    "NeymanPearsonSVC": Entry("bigrate.kernel", "NeymanPearsonSVC", "task"),
    "CostSensitiveSVC": Entry("bigrate.kernel", "CostSensitiveSVC", "task"),
    "AUMLinearClassifier": Entry("bigrate.aum", "AUMLinearClassifier", "task"),
    "QuantilePathSVC": Entry(
        "bigrate.quantile", "QuantilePathSVC", "task", kinds=("train", "evaluate")
    ),
    "RateConstrainedClassifier": Entry(
        "bigrate.constrained",
        "RateConstrainedClassifier",
        "task",
        kinds=("train", "evaluate"),
        data="shards",
    ),  # fmt: skip
    "BPSPSearchCV": Entry(
        "bigrate.model_selection",
        "BPSPSearchCV",
        "search",
        kinds=("train", "evaluate"),
        data="dense",
    ),  # fmt: skip
    "NPSearchCV": Entry("bigrate.model_selection", "NPSearchCV", "sweep", kinds=()),
}


def entry(name: str) -> Entry:
    if name not in ESTIMATORS:
        raise ValueError(
            f"estimator must be one of {', '.join(sorted(ESTIMATORS))}; got {name!r}"
        )
    return ESTIMATORS[name]


def estimator_class(name: str):
    return entry(name).load()


def name_of(est) -> str:
    """The registry name of an estimator instance (every exported estimator has one)."""
    name = type(est).__name__
    if name not in ESTIMATORS:
        raise ValueError(f"{name} is not an estimator jobs can run")
    return name


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
