"""FedCurv (Shoham et al. 2019): keep each parameter where the other clients' data found it
important, weighting by their diagonal Fisher information.

Client k trains L = CE + lam * sum_i [ P_i w_i^2 - 2 Q_i w_i ], where the server sends
P = sum_{j != k} F_j and Q = sum_{j != k} F_j * w_j (the other clients' latest terms; the server
leaves k's own out, so the node needs no state of its own). Up to a constant that is
lam * sum_j sum_i F_j,i (w_i - w_j,i)^2: an elastic pull towards each other client's model.
After training the client replies F_k, its diagonal Fisher at its trained model w_k.
Reading (docs/algorithms.md): F_k is the mean over the local data's minibatches (in order, the
experiment's batch size) of the squared minibatch gradient of the cross-entropy, as the FedNTD
and OpenFL code compute it; the server forms F_k * w_k itself from the reply's checked model.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord
from pydantic import Field

from driftfl.common.protocol import FISHER, FISHER_PENALTY
from driftfl.common.settings import Settings

from .base import Batch, Objective


def curvature_penalty(params: dict[str, torch.Tensor], penalty: dict[str, torch.Tensor],
                      anchor: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum_i [ P_i w_i^2 - 2 Q_i w_i ] over every parameter tensor."""
    return sum(((penalty[k] * p.pow(2)) - 2 * anchor[k] * p).sum() for k, p in params.items())


def diagonal_fisher(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                    batch_size: int) -> dict[str, torch.Tensor]:
    """Mean over the minibatches of (x, y), in order, of the squared minibatch gradient of the
    cross-entropy, per trainable parameter (model in eval mode; its mode is restored)."""
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    sums = {k: torch.zeros_like(p) for k, p in params.items()}
    was_training = model.training
    model.eval()
    count = 0
    for start in range(0, len(y), batch_size):
        loss = F.cross_entropy(model(x[start:start + batch_size]), y[start:start + batch_size])
        grads = torch.autograd.grad(loss, list(params.values()))
        for key, g in zip(params, grads):
            sums[key] += g.detach().pow(2)
        count += 1
    model.train(was_training)
    return {k: s / max(count, 1) for k, s in sums.items()}


class CurvSettings(Settings):
    lam: float = Field(1.0, ge=0)  # weight of the Fisher penalty (FedNTD's reference config)


class Curv(Objective):
    name = "curv"
    Settings = CurvSettings
    needs = frozenset({FISHER_PENALTY})

    def __init__(self, settings: CurvSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.lam

    def prepare(self, model, x, y) -> None:
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        self.penalty = self.anchor = None
        content = self.job.message.content if self.job is not None else {}
        if FISHER_PENALTY in content:  # none in a node's first round
            record = content[FISHER_PENALTY]
            self.penalty = {k: torch.from_numpy(np.array(record[f"penalty.{k}"].numpy()))
                            .to(x.device) for k in self.params}
            self.anchor = {k: torch.from_numpy(np.array(record[f"anchor.{k}"].numpy()))
                           .to(x.device) for k in self.params}
        self.x, self.y = x, y

    def term(self, batch: Batch) -> torch.Tensor | None:
        if self.penalty is None:
            return None
        return curvature_penalty(self.params, self.penalty, self.anchor)

    def after_training(self, model, stats) -> None:
        batch_size = self.job.experiment.batch_size if self.job is not None else 64
        self.fisher = diagonal_fisher(model, self.x, self.y, batch_size)

    def diagnostics(self) -> dict[str, float]:
        return {"fisher-mean": float(torch.cat([f.flatten() for f in self.fisher.values()])
                                     .mean())}

    def reply_records(self) -> dict:
        return {FISHER: ArrayRecord({k: Array(v.cpu().numpy()) for k, v in self.fisher.items()})}
