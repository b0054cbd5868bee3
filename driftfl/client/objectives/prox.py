"""FedProx: L = CE + mu * 1/2 ||w - w_G||^2, w_G the global weights the round started from."""

from __future__ import annotations

import torch

from .base import Batch, Objective


class Prox(Objective):
    def __init__(self, params, job=None):
        super().__init__(params, job)
        self.weight = float(params["mu"])

    def prepare(self, model, x, y) -> None:
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.anchor = [p.detach().clone() for p in self.trained]

    def term(self, batch: Batch) -> torch.Tensor:
        return 0.5 * sum((p - a).pow(2).sum() for p, a in zip(self.trained, self.anchor))
