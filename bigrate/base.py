"""The shared base of bigrate's binary rate classifiers (as scikit-learn's
``LinearClassifierMixin``): label handling, ``predict`` from ``decision_function``, the
estimator tags, and saving as plain data.

A subclass provides ``fit`` (which calls :func:`binary_classes` to set ``classes_``) and
``decision_function``; the score convention of the whole package holds here: a row is
predicted positive (``classes_[1]``) when its score is >= 0, which is how Pfa counts false
alarms (:mod:`bigrate.metrics`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_is_fitted

from bigrate.io import save_model

__all__ = ["RateClassifierMixin", "binary_classes"]


def binary_classes(est, y) -> np.ndarray:
    """Check that ``y`` holds exactly two class labels, set ``est.classes_`` (sorted; the
    larger is the positive class) and return +1 / -1 as float64."""
    y = np.asarray(y)
    kind = type_of_target(y, input_name="y", raise_unknown=True)
    if kind not in ("binary", "multiclass"):
        raise ValueError(
            f"Unknown label type: y must be two class labels, got target "
            f"type {kind!r} (continuous values are not labels)"
        )
    classes = np.unique(y)
    if len(classes) != 2:
        raise ValueError(
            f"Only binary classification is supported: y must have exactly two classes; "
            f"got {len(classes)} class(es): {classes[:10].tolist()}"
        )
    est.classes_ = classes
    return np.where(y == classes[1], 1.0, -1.0)


class RateClassifierMixin(ClassifierMixin):
    """Mixin of the binary rate classifiers; put it before ``BaseEstimator``.

    Class attributes: ``_accepts_sparse`` (CSR input; the ``input_tags.sparse`` tag),
    ``_persist_private`` (private attributes saved with the model, see :mod:`bigrate.io`)
    and what the estimator promises, declared here once and read by the metrics, the
    job runner, its sweeps, status and reports: ``_rate_target``, the parameter holding
    the rate it promises to hold on new data ("rho": a false-alarm rate, "q": a
    q-value; None: no rate), and ``_sweep_select``, the metric its sweeps select by by
    default (a key of :data:`bigrate.metrics.SELECT`).

    What it can do as a job, read by the job runner (:mod:`bigrate.runner.registry`)
    instead of a list of names: ``_job_fit``, how a job fits it ("task": one engine
    task on the train split; "rounds": it streams, by the checkpointed distributed
    rounds of :func:`bigrate.linear.fit_distributed`, and has ``start_stream``;
    "search": BPSP's tasks, each saved as it finishes; "sweep": its job is a sweep of
    the estimator it searches), ``_job_data``, what its fit is given ("shards": the
    ShardedDataset; "sparse": the split as CSR; "dense") and ``_job_kinds``, the job
    kinds it runs.
    """

    _accepts_sparse = True
    _persist_private: tuple = ()
    _rate_target: str | None = None
    _sweep_select: str = "error_rate"
    _job_fit: str = "task"
    _job_data: str = "sparse"
    _job_kinds: tuple = ("train", "sweep", "crossfit", "evaluate")

    def rate_target(self) -> dict:
        """The rate this estimator promises, as keyword arguments of
        :func:`bigrate.metrics.rate_metrics`: ``{"rho": 0.05}``, ``{"q": 0.01}`` or
        ``{}``."""
        if self._rate_target is None:
            return {}
        value = self.get_params()[self._rate_target]
        return {} if value is None else {self._rate_target: float(value)}

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` (positive) where ``decision_function(X) >= 0``, else
        ``classes_[0]``."""
        check_is_fitted(self)
        f = np.asarray(self.decision_function(X))
        return self.classes_[(f >= 0).astype(int)]

    def save(self, path: str | os.PathLike) -> Path:
        """Save the fitted model as plain data (``model.json`` + ``arrays.npz``) in the
        directory ``path``, atomically; :func:`bigrate.load_model` reads it back."""
        check_is_fitted(self)
        return save_model(self, path)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.input_tags.sparse = self._accepts_sparse
        return tags
