"""Kernel learners on our SMO solver: cost-sensitive SVM, Neyman-Pearson SVM, sweeps."""

from bigrate.kernel.smo import KernelProblem, SMOResult
from bigrate.kernel.svc import CostSensitiveSVC, NeymanPearsonSVC

__all__ = ["CostSensitiveSVC", "KernelProblem", "NeymanPearsonSVC", "SMOResult"]
