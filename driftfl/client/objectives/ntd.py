"""FedNTD: distil only the not-true classes. Drop the true-class logit from the student's and
the global model's logits, then L_reg = KL(softmax_tau(z_g without y) || softmax_tau(z without
y)), batch mean, no tau^2 factor (as in the authors' reference code); L = CE + beta * L_reg."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from driftfl.specs import objectives as declared
from driftfl.specs.objectives import NTDSettings

from .distill import Distillation, kl_to_teacher


def drop_true_class(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, C) -> (B, C - 1): each row without its true class, the others in order."""
    keep = ~F.one_hot(labels, logits.shape[1]).bool()
    return logits[keep].view(logits.shape[0], logits.shape[1] - 1)


def not_true_kl(logits, teacher_logits, labels, tau: float) -> torch.Tensor:
    return kl_to_teacher(drop_true_class(logits, labels),
                         drop_true_class(teacher_logits.detach(), labels), tau).mean()


class NTD(Distillation):
    spec = declared.NTD

    def __init__(self, settings: NTDSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.beta

    def term(self, batch):
        return not_true_kl(batch.logits, self.teacher(batch), batch.y, self.settings.tau)
