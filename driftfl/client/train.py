"""The one local-training loop every method shares: batches -> forward -> objective -> step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .objectives import Batch, Objective
from .objectives.distill import logits_of


@dataclass(frozen=True)
class TrainSettings:
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float


@dataclass(frozen=True)
class TrainStats:
    steps: int
    mean_loss: float
    num_examples: int


def batches(n: int, batch_size: int, generator: torch.Generator,
            device: torch.device | str = "cpu") -> Iterator[torch.Tensor]:
    """Indices of one shuffled pass over n samples; the last batch may be smaller."""
    order = torch.randperm(n, generator=generator).to(device)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def train_locally(model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings,
                  objective: Objective, generator: torch.Generator) -> TrainStats:
    """Run ``settings.epochs`` epochs of SGD on (x, y) minimising ``objective``."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                                weight_decay=settings.weight_decay)
    objective.prepare(model, x, y)
    steps, seen = 0, 0
    loss_sum = torch.zeros((), device=x.device)
    for _ in range(settings.epochs):
        for idx in batches(len(y), settings.batch_size, generator, x.device):
            xb, yb = x[idx], y[idx]
            features = model.features(xb)
            loss = objective.loss(Batch(xb, yb, features, model.head(features), idx))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            seen += len(yb)
            loss_sum += loss.detach() * len(yb)
    return TrainStats(steps, float(loss_sum) / max(seen, 1), len(y))


def logit_shift(before: torch.Tensor, model: nn.Module, x: torch.Tensor) -> float:
    """Mean KL(softmax(local logits) || softmax(global logits)) on x: how far local training
    moved the model's predictions away from the global model's (``before``)."""
    if not len(x):
        return 0.0
    after = logits_of(model, x)
    return float(F.kl_div(F.log_softmax(before, dim=1), F.log_softmax(after, dim=1),
                          reduction="batchmean", log_target=True))
