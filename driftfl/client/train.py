"""The one local-training loop every method shares: batches -> forward -> objective -> step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .objectives import Batch, Objective


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


def batches(x: torch.Tensor, y: torch.Tensor, batch_size: int,
            generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One shuffled pass over (x, y); the last batch may be smaller."""
    order = torch.randperm(len(y), generator=generator).to(y.device)
    for start in range(0, len(y), batch_size):
        idx = order[start:start + batch_size]
        yield x[idx], y[idx]


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
        for xb, yb in batches(x, y, settings.batch_size, generator):
            features = model.features(xb)
            loss = objective.loss(Batch(xb, yb, features, model.head(features)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            seen += len(yb)
            loss_sum += loss.detach() * len(yb)
    return TrainStats(steps, float(loss_sum) / max(seen, 1), len(y))
