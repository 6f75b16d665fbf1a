"""Validation helpers shared by the estimators."""

from __future__ import annotations

import numpy as np
from sklearn.utils.multiclass import type_of_target


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
