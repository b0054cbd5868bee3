"""Local training: the shared loop (driftfl.common.training) and the logit-shift diagnostic."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from driftfl.common.training import Batch, TrainSettings, TrainStats, batches, train_locally

from .objectives.distill import logits_of

__all__ = ["Batch", "TrainSettings", "TrainStats", "batches", "logit_shift", "train_locally"]


def logit_shift(before: torch.Tensor, model: nn.Module, x: torch.Tensor) -> float:
    """Mean KL(softmax(local logits) || softmax(global logits)) on x: how far local training
    moved the model's predictions away from the global model's (``before``)."""
    if not len(x):
        return 0.0
    after = logits_of(model, x)
    return float(F.kl_div(F.log_softmax(before, dim=1), F.log_softmax(after, dim=1),
                          reduction="batchmean", log_target=True))
