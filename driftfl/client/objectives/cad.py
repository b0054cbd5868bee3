"""FedCAD: class-wise adaptive self-distillation (docs/algorithms.md, FedCAD).
  L = (1 - alpha_y) CE + alpha_y L_d per sample,  L_d = -sum_k softmax_T(z_g)_k log softmax_T(z)_k
  alpha_y = (gamma_max - gamma_min) / 2 * E_{x|y}[phi] + (gamma_max + gamma_min) / 2,
  phi(y, p_g) = p_g,y - sum_{k != y} p_g,k = 2 p_g,y - 1 (p_g at T = 1), so alpha_y lies in
  [gamma_min, gamma_max]. E_{x|y} is estimated before training with the received global model on
the local data, or taken from the ``class-phi`` record when the server sends one (measured on its
aux set: the strategy's alpha_source=aux).
gamma_min = gamma_max = 0 is FedAvg; gamma_min = gamma_max = beta is FedLSD.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from driftfl.common.protocol import CLASS_ALPHA, CLASS_PHI
from driftfl.specs import objectives as declared

from .distill import Distillation, soft_cross_entropy


def class_phi(global_logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """E_{x|y}[2 p_g,y - 1] per class over the given samples (NaN for a class without any)."""
    p_true = F.softmax(global_logits, dim=1).gather(1, labels[:, None]).squeeze(1)
    sums = torch.zeros(num_classes, device=labels.device).index_add_(0, labels, 2 * p_true - 1)
    counts = torch.bincount(labels, minlength=num_classes)
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan)


def class_alpha(phi: torch.Tensor, gamma_min: float, gamma_max: float) -> torch.Tensor:
    return 0.5 * (gamma_max - gamma_min) * phi + 0.5 * (gamma_max + gamma_min)


def cad_loss(logits, global_logits, labels, alpha: torch.Tensor, temperature: float):
    a = alpha[labels]
    ce = F.cross_entropy(logits, labels, reduction="none")
    target = F.softmax(global_logits.detach() / temperature, dim=1)
    distill = soft_cross_entropy(logits, target, temperature)
    return ((1 - a) * ce + a * distill).mean()


class CAD(Distillation):
    spec = declared.CAD

    def prepare(self, model, x, y) -> None:
        super().prepare(model, x, y)
        classes = self.teacher_logits.shape[1] if len(x) else 0
        if self.job is not None and CLASS_PHI in self.job.message.content:
            phi = torch.from_numpy(np.array(
                self.job.message.content[CLASS_PHI]["phi"].numpy())).to(x.device)
        else:
            phi = class_phi(self.teacher_logits, y, classes)
        self.alpha = class_alpha(phi, self.settings.gamma_min, self.settings.gamma_max)

    def loss(self, batch):
        return cad_loss(batch.logits, self.teacher(batch), batch.y, self.alpha,
                        self.settings.temperature)

    def diagnostics(self) -> dict:
        # alpha_y per class (NaN for classes this client lacks) and its mean over the classes
        return {CLASS_ALPHA: [float(a) for a in self.alpha.tolist()],
                "alpha-mean": float(np.nanmean(self.alpha.cpu().numpy()))}
