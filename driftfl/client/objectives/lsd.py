"""FedLSD: L = (1 - beta) CE + beta * L_d, L_d = -sum_k softmax_T(z_g)_k log softmax_T(z)_k.

The teacher is the received global model; no T^2 factor (docs/algorithms.md), so FedCAD with
gamma_min = gamma_max = beta is exactly FedLSD.
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field

from driftfl.common.settings import Settings

from .distill import Distillation, soft_cross_entropy


def lsd_loss(logits, teacher_logits, labels, beta: float, temperature: float):
    ce = F.cross_entropy(logits, labels)
    target = F.softmax(teacher_logits.detach() / temperature, dim=1)
    distill = soft_cross_entropy(logits, target, temperature).mean()
    return (1 - beta) * ce + beta * distill


class LSDSettings(Settings):
    beta: float = Field(0.3, ge=0, le=1, description=(
        "weight of the distillation term L_d; 1 - beta weighs CE"))
    temperature: float = Field(1.0, gt=0, description=(
        "T: the distillation temperature of softmax_T(z_g) and softmax_T(z)"))


class LSD(Distillation):
    name = "lsd"
    Settings = LSDSettings

    def loss(self, batch):
        return lsd_loss(batch.logits, self.teacher(batch), batch.y, self.settings.beta,
                        self.settings.temperature)
