"""FedNova (Wang et al. 2020): average updates normalised by each client's local step count.

Client k reports tau_k local SGD steps; with momentum rho its normaliser is
  a_k = (tau_k - rho (1 - rho^tau_k) / (1 - rho)) / (1 - rho)    (a_k = tau_k when rho = 0),
its normalised update d_k = (w_G - w_k) / a_k, and the server steps
  w_G <- w_G - tau_eff * sum_k gamma_k d_k,   tau_eff = sum_k gamma_k a_k.
The client sends w_k (the common reply), the server forms d_k: w_G is the model it sent.
Buffers (BatchNorm statistics) are not gradient-trained and are averaged as in FedAvg.
Every reply's tau_k is the count its training makes of the examples the data survey found
(local_epochs x ceil(n_k / batch_size)): the common reply check refuses any other.
"""

from __future__ import annotations

import numpy as np

from driftfl.common.protocol import LOCAL_STEPS
from driftfl.common.sgd import nova_normaliser
from driftfl.specs import parts as declared
from driftfl.strategies.parts.aggregation import Aggregation, weighted_average


class FedNovaAggregation(Aggregation):
    """``momentum``: the clients' SGD momentum rho; ``param_keys``: the trained parameters
    (the model's other arrays are buffers)."""

    spec = declared.AGGREGATIONS["fednova"]

    def __init__(self, *, momentum: float, param_keys: frozenset[str]) -> None:
        self.momentum = momentum
        self.param_keys = param_keys

    @classmethod
    def from_config(cls, cfg, model) -> FedNovaAggregation:
        return cls(momentum=cfg.momentum,
                   param_keys=frozenset(name for name, _ in model.named_parameters()))

    def aggregate(self, updates, global_arrays) -> dict[str, np.ndarray]:
        gamma = self.weights(updates)
        a = np.array([nova_normaliser(u.metrics[LOCAL_STEPS], self.momentum) for u in updates])
        tau_eff = float(gamma @ a)
        out = weighted_average(updates, gamma)  # buffers keep the FedAvg average
        for key in self.param_keys:
            w_g = global_arrays[key].astype(np.float64)
            step = sum(g * (w_g - u.arrays[key]) / a_k for g, u, a_k in zip(gamma, updates, a))
            out[key] = np.asarray(w_g - tau_eff * step, dtype=global_arrays[key].dtype)
        return out
