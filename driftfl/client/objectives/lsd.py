"""FedLSD: L = (1 - beta) CE + beta * L_d, L_d = -sum_k softmax_T(z_g)_k log softmax_T(z)_k.

The teacher is the received global model; no T^2 factor (docs/algorithms.md), so FedCAD with
gamma_min = gamma_max = beta is exactly FedLSD.
"""

from __future__ import annotations

import torch.nn.functional as F

from driftfl.specs import objectives as declared

from .distill import Distillation, soft_cross_entropy


def lsd_loss(logits, teacher_logits, labels, beta: float, temperature: float):
    ce = F.cross_entropy(logits, labels)
    target = F.softmax(teacher_logits.detach() / temperature, dim=1)
    distill = soft_cross_entropy(logits, target, temperature).mean()
    return (1 - beta) * ce + beta * distill


class LSD(Distillation):
    spec = declared.LSD

    def loss(self, batch):
        return lsd_loss(batch.logits, self.teacher(batch), batch.y, self.settings.beta,
                        self.settings.temperature)
