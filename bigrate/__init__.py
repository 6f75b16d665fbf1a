"""bigrate: rate-constrained binary classification at scale.

Learners that must hit a target on an error rate (false-alarm rate at most rho, q-value at
most q, ...) rather than minimise plain error, trained on sparse data streamed from Parquet
shards, on one machine or on a Dask or Ray cluster.
"""

from bigrate._version import __version__
from bigrate.aum import AUMLinearClassifier
from bigrate.constrained import RateConstrainedClassifier
from bigrate.data import ShardedDataset
from bigrate.errors import BigrateWarning, ChecksumError, DataError, DatasetExistsError
from bigrate.io import load_model
from bigrate.kernel import CostSensitiveSVC, NeymanPearsonSVC
from bigrate.linear import NeymanPearsonSGD, QValueSGD
from bigrate.model_selection import BPSPSearchCV, NPSearchCV
from bigrate.quantile import QuantilePathSVC

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
