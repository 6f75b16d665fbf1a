"""Surrogates of the 0-1 loss, as numba functions selected by an integer code.

Each loss is a function of the margin z = y f(x):

* ``sigmoid``: l(z) = 1 / (1 + exp(eta z)), l'(z) = -eta l(z) (1 - l(z)).
* ``ramp``: l(z) = clip((eta - z) / (2 eta), 0, 1), l'(z) = -1 / (2 eta) for |z| < eta
  and 0 outside; at the kinks z = +-eta the gradient is taken as 0 (Gasso et al. 2011,
  sec. 3.3: "skip the stochastic update"). Its DC split is l = l1 - l2 with
  l1(z) = max(0, (eta - z) / (2 eta)) and l2(z) = max(0, -(eta + z) / (2 eta)).
"""

from bigrate.losses._kernels import LOSS_CODES, loss_and_derivative

__all__ = ["LOSS_CODES", "loss_and_derivative", "loss_code"]


def loss_code(name: str) -> int:
    try:
        return LOSS_CODES[name]
    except KeyError:
        raise ValueError(
            f"loss must be one of {sorted(LOSS_CODES)}, got {name!r}"
        ) from None
