"""Stochastic linear learners: Neyman-Pearson and q-value SGD (Gasso et al. 2011)."""

from bigrate.linear.sgd import KernelConfig, NeymanPearsonSGD, QValueSGD, local_round

__all__ = ["KernelConfig", "NeymanPearsonSGD", "QValueSGD", "local_round"]
