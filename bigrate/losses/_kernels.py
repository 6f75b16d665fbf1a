"""Loss kernels: value and derivative of a surrogate at a margin, by code."""

import numpy as np

from bigrate._jit import njit

SIGMOID = 0
RAMP = 1
LOSS_CODES = {"sigmoid": SIGMOID, "ramp": RAMP}


@njit(cache=True, nogil=True, inline="always")
def loss_and_derivative(code, z, eta):
    """(l(z), dl/dz) of the loss ``code`` with sharpness ``eta``."""
    if code == SIGMOID:
        u = eta * z
        if u >= 0.0:
            e = np.exp(-u)
            l = e / (1.0 + e)
        else:
            l = 1.0 / (1.0 + np.exp(u))
        return l, -eta * l * (1.0 - l)
    # ramp
    if z <= -eta:
        return 1.0, 0.0
    if z >= eta:
        return 0.0, 0.0
    return (eta - z) / (2.0 * eta), -1.0 / (2.0 * eta)
