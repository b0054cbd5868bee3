"""Distilling a frozen teacher's logits into the local model: what FedCSD, FedLSD, FedNTD and
FedGKD share.

The teacher is a record the server sent (``teacher_record``) or, when there is none, the global
model the round starts from. The student trains, the teacher does not and no augmentation
changes the inputs, so the teacher's logits on the local data are computed once before the first
epoch and looked up per batch: one teacher forward pass per round, not one per batch and epoch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from driftfl.common.evaluation import forward_batch_size

from .base import Batch, Objective


@torch.no_grad()
def logits_of(model: nn.Module, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """``model``'s logits on all of ``x`` in eval mode; the model's mode is restored after."""
    batch_size = batch_size or forward_batch_size(x)
    was_training = model.training
    model.eval()
    out = torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]) \
        if len(x) else torch.zeros(0, 0)
    model.train(was_training)
    return out


def soft_cross_entropy(student: torch.Tensor, target: torch.Tensor, tau: float) -> torch.Tensor:
    """Per sample: -sum_c target_c log softmax(student / tau)_c."""
    return -(target * F.log_softmax(student / tau, dim=1)).sum(dim=1)


def kl_to_teacher(student: torch.Tensor, teacher: torch.Tensor, tau: float) -> torch.Tensor:
    """Per sample: KL(softmax(teacher / tau) || softmax(student / tau))."""
    p_teacher = F.softmax(teacher / tau, dim=1)
    return (p_teacher * (F.log_softmax(teacher / tau, dim=1)
                         - F.log_softmax(student / tau, dim=1))).sum(dim=1)


class Distillation(Objective):
    teacher_record: str | None = None  # None: the received global model is the teacher

    def prepare(self, model, x, y) -> None:
        self.teacher_logits = self.compute_teacher_logits(model, x)

    def compute_teacher_logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """The teacher's logits on all local data (None when this round sends no teacher)."""
        if self.teacher_record is None:
            return logits_of(model, x)  # the model still holds the global weights
        if self.job is None or self.teacher_record not in self.job.message.content:
            return None
        return logits_of(self.job.model(self.teacher_record), x)

    def teacher(self, batch: Batch) -> torch.Tensor:
        """The teacher's (constant, gradient-free) logits for the batch's samples."""
        return self.teacher_logits[batch.index]
