"""A trained model together with the features it expects.

A model trained on a standardised dataset only makes sense on rows standardised the
same way. The map is saved with the model (``inputs`` in ``model.json``); a model
scoring another dataset converts its rows: from that dataset's own standardisation (or
raw values) to the model's. So `bigrate predict` and evaluate jobs can score raw data,
data standardised with the same statistics, or data standardised with others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.data.standardize import Standardizer, convert
from bigrate.io import load_model, model_inputs, save_model


def inputs_of(ds: ShardedDataset) -> dict:
    """What a model trained on ``ds`` expects of its rows."""
    std = ds.standardizer
    return {
        "n_features": ds.n_features,
        "standardize": None if std is None else std.to_json(),
    }


def save_trained(est, path: str | Path, ds: ShardedDataset) -> Path:
    return save_model(est, path, inputs=inputs_of(ds))


class TrainedModel:
    """A saved model and its input map; :meth:`decision_function_on` scores rows of a
    given dataset after expressing them in the model's feature space."""

    def __init__(self, model_dir: str | Path):
        self.path = Path(model_dir)
        self.estimator = load_model(self.path)
        inputs = model_inputs(self.path)
        self.n_features = int(inputs.get("n_features", self.estimator.n_features_in_))
        std = inputs.get("standardize")
        self.standardizer = (
            None
            if std is None
            else Standardizer.from_json(
                std, self.n_features, str(self.path / "model.json")
            )
        )

    def scorer(self, ds: ShardedDataset):
        """``X -> scores`` for row blocks of ``ds``."""
        if ds.n_features != self.n_features:
            raise ValueError(
                f"{ds.path} has {ds.n_features} features, the model in {self.path} "
                f"expects {self.n_features}"
            )
        have, want, est = ds.standardizer, self.standardizer, self.estimator

        def score(X) -> np.ndarray:
            return np.asarray(est.decision_function(convert(X, have, want))).ravel()

        return score

    def describe_conversion(self, ds: ShardedDataset) -> str | None:
        """One line saying how rows of ``ds`` are mapped, or None if they are not."""
        have, want = ds.standardizer, self.standardizer
        if want is None and have is None or (want is not None and want.same_as(have)):
            return None
        src = "raw values" if have is None else "its own standardisation"
        dst = "raw values" if want is None else "the model's standardisation"
        return f"{ds.path}: rows mapped from {src} to {dst}"
