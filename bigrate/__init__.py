"""bigrate: rate-constrained binary classification at scale.

Learners that must hit a target on an error rate (false-alarm rate at most rho, q-value at
most q, ...) rather than minimise plain error, trained on sparse data streamed from Parquet
shards, on one machine or on a Dask or Ray cluster.

The names below are imported on first use (PEP 562), so that ``import bigrate`` and the
``bigrate`` command's light subcommands (``status``, ``runs``, ``info``) do not load
scikit-learn, SciPy and every learner's compiled kernels.
"""

from importlib import import_module

from bigrate._version import __version__

# exported name -> the module that defines it
_EXPORTS = {
    "AUMLinearClassifier": "bigrate.aum",
    "BPSPSearchCV": "bigrate.model_selection",
    "BigrateWarning": "bigrate.errors",
    "CostSensitiveSVC": "bigrate.kernel",
    "ChecksumError": "bigrate.errors",
    "DataError": "bigrate.errors",
    "DatasetExistsError": "bigrate.errors",
    "NeymanPearsonSGD": "bigrate.linear",
    "NeymanPearsonSVC": "bigrate.kernel",
    "NPSearchCV": "bigrate.model_selection",
    "QValueSGD": "bigrate.linear",
    "QuantilePathSVC": "bigrate.quantile",
    "RateConstrainedClassifier": "bigrate.constrained",
    "ShardedDataset": "bigrate.data",
    "load_model": "bigrate.io",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'bigrate' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])
