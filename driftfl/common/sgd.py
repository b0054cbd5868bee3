"""What a run of local SGD amounts to, for the methods that rescale a client's update by it
(FedNova's normalised averaging, SCAFFOLD's control variate); the client and the strategies
both use it, so it lives here.

With momentum rho, tau steps of SGD move the weights by lr times a sum of gradients whose
coefficients add up to
  a = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)      (a = tau when rho = 0),
the "effective" step count (FedNova's ||a||_1).
"""

from __future__ import annotations


def nova_normaliser(steps: float, momentum: float) -> float:
    """a_k for ``steps`` local steps of SGD with ``momentum`` (the FedNova paper's ||a||_1)."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)
