"""FedNova (Wang et al. 2020): average updates normalised by each client's local step count.

Client k reports tau_k local SGD steps; with momentum rho its normaliser is
  a_k = (tau_k - rho (1 - rho^tau_k) / (1 - rho)) / (1 - rho)    (a_k = tau_k when rho = 0),
its normalised update d_k = (w_G - w_k) / a_k, and the server steps
  w_G <- w_G - tau_eff * sum_k gamma_k d_k,   tau_eff = sum_k gamma_k a_k.
The client sends w_k (the common reply), the server forms d_k: w_G is the model it sent.
Buffers (BatchNorm statistics) are not gradient-trained and are averaged as in FedAvg.
"""

from __future__ import annotations

import numpy as np

from driftfl.common.protocol import LOCAL_STEPS

from .aggregation import ClientUpdate, example_weights, weighted_average
from .base import DriftStrategy


def nova_normaliser(steps: float, momentum: float) -> float:
    """a_k for ``steps`` local steps of SGD with ``momentum`` (the FedNova paper's ||a||_1)."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


class FedNova(DriftStrategy):
    momentum = 0.0  # the clients' SGD momentum rho
    param_keys: frozenset[str] = frozenset()  # trained parameters; other arrays are buffers

    def aggregate_arrays(self, updates: list[ClientUpdate]) -> dict[str, np.ndarray]:
        updates = [u for u in updates if u.metrics.get(LOCAL_STEPS, 0) > 0]
        gamma = example_weights(updates)
        a = np.array([nova_normaliser(u.metrics[LOCAL_STEPS], self.momentum) for u in updates])
        tau_eff = float(gamma @ a)
        out = weighted_average(updates, gamma)  # buffers keep the FedAvg average
        for key in self.param_keys:
            w_g = self.global_arrays[key].astype(np.float64)
            step = sum(g * (w_g - u.arrays[key]) / a_k for g, u, a_k in zip(gamma, updates, a))
            out[key] = np.asarray(w_g - tau_eff * step, dtype=self.global_arrays[key].dtype)
        return out
