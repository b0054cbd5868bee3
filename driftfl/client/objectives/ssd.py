"""FedSSD: selective self-distillation, weighted by the credibility matrix (docs/algorithms.md,
FedSSD, reconstructed). With A the global model's row-normalised confusion on the server's aux
set, p_g = softmax(z_g) and psi(p) = 1 - sqrt(1 - p) (or the identity):
  w_c(x, y) = lam * A_cc * (1 - A_yc) * psi(p_g,y)   for c != y
  w_y(x, y) = lam * A_yy * psi(p_g,y)
  L_SSD = batch mean of sum_c w_c (z_g,c - z_c)^2;   L = CE + L_SSD.
The ablation replaces the weights by the constant lam: plain MSE, or KL(p_g || p) (mse, kl).
lam's default follows the class count: 0.1 / |Y| (the paper's 0.01 for 10 classes, 0.001 for 100).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from driftfl.common.protocol import CREDIBILITY
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import SSDSettings

from .distill import Distillation, kl_to_teacher

PSI = {"sqrt": lambda p: 1 - torch.sqrt((1 - p).clamp(min=0)), "identity": lambda p: p}


def ssd_weights(credibility: torch.Tensor, global_probs: torch.Tensor, labels: torch.Tensor,
                lam: float, psi: str = "sqrt") -> torch.Tensor:
    """(B, C) per-sample, per-class weights; every weight lies in [0, lam]."""
    recall = torch.diagonal(credibility)  # A_cc
    mistaken = credibility[labels]  # A_yc: how often class y is taken for c
    sample = PSI[psi](global_probs.gather(1, labels[:, None]))  # psi(p_g,y), (B, 1)
    weights = lam * recall[None, :] * (1 - mistaken) * sample
    true = lam * recall[labels][:, None] * sample  # w_y drops the (1 - A_yy) factor
    return weights.scatter(1, labels[:, None], true)


def ssd_loss(logits, global_logits, labels, credibility, lam: float, psi: str = "sqrt"):
    global_logits = global_logits.detach()
    weights = ssd_weights(credibility, F.softmax(global_logits, dim=1), labels, lam, psi)
    return (weights * (global_logits - logits) ** 2).sum(dim=1).mean()


class SSD(Distillation):
    """The teacher is the received global model; the loss is CE + the distillation term."""

    spec = declared.SSD

    def __init__(self, settings: SSDSettings, job=None):
        super().__init__(settings, job)
        self.weight = 1.0  # lam is inside the weights (for mse/kl: their constant factor)
        self.kind = settings.distill_loss

    def prepare(self, model, x, y) -> None:
        super().prepare(model, x, y)
        matrix = self.job.message.content[CREDIBILITY]["matrix"].numpy()
        self.credibility = torch.from_numpy(np.array(matrix)).to(x.device)
        self.lam = self.settings.for_classes(len(self.credibility)).lam

    def term(self, batch):
        teacher = self.teacher(batch)
        if self.kind == "selective":
            return ssd_loss(batch.logits, teacher, batch.y, self.credibility, self.lam,
                            self.settings.psi)
        if self.kind == "mse":
            return self.lam * ((teacher - batch.logits) ** 2).sum(dim=1).mean()
        return self.lam * kl_to_teacher(batch.logits, teacher, 1.0).mean()
