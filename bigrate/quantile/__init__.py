"""The whole quantile path of the linear SVM (Yu et al. 2009): one fit, the SVM for every
share tau of the cost put on false positives."""

from bigrate.quantile.svc import QuantilePathSVC

__all__ = ["QuantilePathSVC"]
