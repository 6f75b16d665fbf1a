"""bigrate: rate-constrained binary classification at scale.

Learners that must hit a target on an error rate (false-alarm rate at most rho, q-value at
most q, ...) rather than minimise plain error, trained on sparse data streamed from Parquet
shards, on one machine or on a Dask or Ray cluster.
"""

from bigrate.data import ShardedDataset
from bigrate.errors import BigrateWarning, ChecksumError, DataError, DatasetExistsError
from bigrate.io import load_model
from bigrate.kernel import CostSensitiveSVC, NeymanPearsonSVC
from bigrate.linear import NeymanPearsonSGD, QValueSGD
from bigrate.model_selection import BPSPSearchCV, NPSearchCV
from bigrate.path import (
    AUMLinearClassifier,
    QuantilePathSVC,
    RateConstrainedClassifier,
)

__version__ = "0.1.0"

__all__ = [
    "AUMLinearClassifier",
    "BPSPSearchCV",
    "BigrateWarning",
    "CostSensitiveSVC",
    "ChecksumError",
    "DataError",
    "DatasetExistsError",
    "NeymanPearsonSGD",
    "NeymanPearsonSVC",
    "NPSearchCV",
    "QValueSGD",
    "QuantilePathSVC",
    "RateConstrainedClassifier",
    "ShardedDataset",
    "load_model",
    "__version__",
]
