"""FedDyn (Acar et al. 2021), the server: the state h and the corrected global model.

After the configured aggregation has made m from the accepted models w_k of the global w_G:
  h <- h - (alpha / K) sum_{accepted k} (w_k - w_G),      w_G <- m - h / alpha,
for the trainable parameters (buffers stay as the aggregation made them), K = num_clients,
h = 0 at the start. alpha = 0: no correction, h stays 0 (FedDyn is then FedAvg). The corrected
model passes the same checks as any aggregate (``refuse_aggregate``); if it is refused the
global model stays and h is left as it was.

h is fed by the accepted models only, whose updates the base strategy already screens against
the round's peers (max_peer_ratio). A new h that is not finite or moved more than
max_update_ratio x max(1, ||h||) is refused like a refused corrected model (which depends on it):
h and the global model stay, and the refusal is recorded in ``RoundReport.refused_state``. Under
a robust aggregation the updates feed h through the same rule, uniformly:
  h <- h - alpha (|S|/K) combine_k(w_k - w_G);
under a plain one the sum above is used unchanged.
"""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.supercore import log

from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.parts.aggregation import to_record, update_norm
from driftfl.strategies.parts.guard import move_scale

Arrays = dict[str, np.ndarray]


def next_h(h: Arrays, local_models: list[Arrays], w_global: Arrays, alpha: float,
           num_clients: int) -> Arrays:
    """h - (alpha / K) sum_k (w_k - w_G), float64."""
    return {k: v - alpha / num_clients * sum(w[k].astype(np.float64) - w_global[k]
                                             for w in local_models)
            for k, v in h.items()}


def corrected_model(mean: Arrays, h: Arrays, alpha: float) -> Arrays:
    """m - h / alpha for the arrays h holds (the parameters), the rest of m as it is."""
    return {k: (np.asarray(v.astype(np.float64) - h[k] / alpha, dtype=v.dtype) if k in h
                else v) for k, v in mean.items()}


class FedDyn(DriftStrategy):
    """``param_keys``: the trainable parameters' names; ``num_clients``: K; ``alpha``: the
    clients' alpha."""

    spec = declared.FEDDYN
    server_columns = frozenset({"server_h_norm"})

    def __init__(self, *, param_keys: tuple[str, ...], num_clients: int, alpha: float,
                 **kwargs):
        super().__init__(**kwargs)
        self.param_keys = tuple(param_keys)
        self.num_clients = num_clients
        self.alpha = alpha
        self.h: Arrays | None = None  # float64

    @classmethod
    def arguments(cls, settings, *, model, aux_set, experiment, **_):
        return {"param_keys": tuple(n for n, p in model.named_parameters() if p.requires_grad),
                "num_clients": experiment.num_clients, "alpha": settings.alpha}

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or self.alpha == 0:
            return arrays, metrics
        old = self.h or {k: np.zeros(self.global_arrays[k].shape) for k in self.param_keys}
        if self.aggregation.robust and not self.aggregation.bounds_updates:
            # an outlying model moves h as little as the aggregate (a rule that bounds the
            # models themselves has done so: the paper's formula then takes them)
            moves = [{k: u.arrays[k].astype(np.float64) - self.global_arrays[k] for k in old}
                     for u in self.last_updates]
            combined = self.aggregation.combine(moves, np.ones(len(moves)))
            scale = self.alpha * len(moves) / self.num_clients
            h = {k: v - scale * combined[k] for k, v in old.items()}
        else:
            h = next_h(old, [u.arrays for u in self.last_updates], self.global_arrays,
                       self.alpha, self.num_clients)
        problem = self.guard.state_problem(h, old, scale=move_scale(
            [update_norm(u.arrays, self.global_arrays) for u in self.last_updates],
            self.alpha * len(self.last_updates) / self.num_clients))
        if problem:  # the corrected model would carry it
            self.guard.refuse_state(self.report, server_round, "FedDyn's h", problem)
            return None, None
        corrected = corrected_model(self.last_aggregate, h, self.alpha)
        refused = self.refuse_aggregate(corrected)
        if refused:
            log(WARNING, "round %d: the corrected model: %s; the global model stays as it was",
                server_round, refused)
            self.report.refused_aggregate = f"the corrected model: {refused}"
            return None, None
        self.h, self.last_aggregate = h, corrected
        return to_record(corrected), metrics

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        if self.h is None:
            return {}
        return {"server_h_norm": float(np.sqrt(sum(np.sum(np.square(v))
                                                   for v in self.h.values())))}
