"""Local training: the shared loop (driftfl.common.training) and the logit-shift diagnostic."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from driftfl.common.training import Batch, TrainSettings, TrainStats, batches, train_locally

from .objectives.distill import logits_of

__all__ = ["Batch", "LogitShift", "TrainSettings", "TrainStats", "batches", "logit_shift",
           "train_locally"]


class LogitShift:
    """The logit-shift diagnostic of one client's round: the global model's logits on a fixed
    random sample of the local data, kept before training and compared after it. Two forward
    passes over ``samples`` images are all it costs (32 by default: a tenth of a second per
    client on the FedAvg CNN at 256, benchmarks/client_profile.py)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, samples: int,
                 generator: torch.Generator):
        probe = torch.randperm(len(x), generator=generator)[:samples]
        self.x = x[probe.to(x.device)]
        self.before = logits_of(model, self.x)

    def measure(self, model: nn.Module) -> float:
        return logit_shift(self.before, model, self.x)


def logit_shift(before: torch.Tensor, model: nn.Module, x: torch.Tensor) -> float:
    """Mean KL(softmax(local logits) || softmax(global logits)) on x: how far local training
    moved the model's predictions away from the global model's (``before``)."""
    if not len(x):
        return 0.0
    after = logits_of(model, x)
    return float(F.kl_div(F.log_softmax(before, dim=1), F.log_softmax(after, dim=1),
                          reduction="batchmean", log_target=True))
