"""The one training loop every model is trained with: batches -> forward -> objective -> step.

Clients run it with their method's objective (driftfl.client.objectives); DCFL's server runs it
with plain cross-entropy to pre-train the initial model on condensed images. An optional
``augment`` (DSA, driftfl.common.augment) transforms each batch before the forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.sgd import sgd


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor  # the model's features (input to its linear head), with gradient
    logits: torch.Tensor  # the model's logits, with gradient
    index: torch.Tensor  # positions of the batch's samples in the training data


class LocalObjective(Protocol):
    def prepare(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None: ...

    def loss(self, batch: Batch) -> torch.Tensor: ...

    def before_step(self, model: nn.Module) -> None: ...


class CrossEntropy:
    """Plain cross-entropy (what a client's ``ce`` objective is, without its registry)."""

    def prepare(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        pass

    def loss(self, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(batch.logits, batch.y)

    def before_step(self, model: nn.Module) -> None:
        pass


@dataclass(frozen=True)
class TrainSettings:
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    max_steps: int | None = None  # a straggler's step budget (heterogeneity=stragglers)

    @classmethod
    def local_stage(cls, experiment) -> TrainSettings:
        """How a client trains on its own data: ``local_epochs`` in batches of ``batch_size``
        (the client trains with it, the server checks a reply's step count against it)."""
        return cls(experiment.local_epochs, experiment.batch_size, experiment.lr,
                   experiment.momentum, experiment.weight_decay)

    @classmethod
    def finetune_stage(cls, dcfl, experiment) -> TrainSettings:
        """DCFL's fine-tuning on the received condensed images: E_s epochs in batches of B_s."""
        return cls(dcfl.finetune_epochs, dcfl.finetune_batch_size, dcfl.finetune_lr,
                   experiment.momentum, experiment.weight_decay)

    def steps(self, num_examples: float) -> int:
        """The SGD steps ``train_locally`` takes on this many examples: a step per batch, the
        last batch of an epoch smaller; no more than a straggler's budget."""
        full = self.epochs * math.ceil(num_examples / self.batch_size)
        return full if self.max_steps is None else min(full, self.max_steps)

    def in_words(self, data: str) -> str:
        """'3 epochs of <data> in batches of 64', for messages."""
        budget = "" if self.max_steps is None else f", stopped after {self.max_steps} steps"
        return (f"{self.epochs} epoch{'s' * (self.epochs != 1)} of {data} in batches of "
                f"{self.batch_size}{budget}")


@dataclass(frozen=True)
class TrainStats:
    steps: int
    mean_loss: float
    num_examples: int


# augment(x, seed, per_sample=True): a transformed copy of the batch x
Augment = Callable[..., torch.Tensor]


def batches(n: int, batch_size: int, generator: torch.Generator,
            device: torch.device | str = "cpu") -> Iterator[torch.Tensor]:
    """Indices of one shuffled pass over n samples; the last batch may be smaller."""
    order = torch.randperm(n, generator=generator).to(device)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


class LocalSGD:
    """``torch.optim.SGD(params, lr, momentum, weight_decay)``'s steps, made by torch's own update
    function (``torch.optim.sgd.sgd``, which the class calls) with the class's defaults and
    state: the parameters with a gradient, a momentum buffer each, the same choice of kernels.
    Not the class itself: its constructor and its step import ``torch._dynamo`` (1.3 s of CPU),
    in every process that trains, and a deployed node trains in a fresh process per message.
    A test pins the same bytes as ``torch.optim.SGD`` over several steps."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: dict[int, torch.Tensor | None] = {}  # by parameter: its momentum buffer

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        stepped = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in stepped]
        buffers = [self.buffers.get(id(p)) for p in stepped] if self.momentum else []
        sgd(stepped, grads, buffers, weight_decay=self.weight_decay, momentum=self.momentum,
            lr=self.lr, dampening=0.0, nesterov=False, maximize=False,
            has_sparse_grad=any(g.is_sparse for g in grads), foreach=None, fused=None)
        for p, buffer in zip(stepped, buffers):
            self.buffers[id(p)] = buffer


def train_locally(model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings,
                  objective: LocalObjective, generator: torch.Generator, *,
                  augment: Augment | None = None, prepare: bool = True) -> TrainStats:
    """Run ``settings.epochs`` epochs of SGD on (x, y) minimising ``objective``. ``prepare``
    False: the objective was prepared by an earlier stage of the same round (its anchor, its
    teacher) and keeps that."""
    model.train()
    optimizer = LocalSGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                         weight_decay=settings.weight_decay)
    if prepare:
        objective.prepare(model, x, y)
    steps, seen = 0, 0
    loss_sum = torch.zeros((), device=x.device)
    budget = math.inf if settings.max_steps is None else settings.max_steps
    for _ in range(settings.epochs):
        if steps >= budget:
            break
        for idx in batches(len(y), settings.batch_size, generator, x.device):
            if steps >= budget:  # a straggler stops where its budget ends
                break
            xb, yb = x[idx], y[idx]
            if augment is not None:  # a seed per batch, drawn from the run's generator
                seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
                xb = augment(xb, seed, per_sample=True)
            features = model.features(xb)
            loss = objective.loss(Batch(xb, yb, features, model.head(features), idx))
            optimizer.zero_grad()
            loss.backward()
            objective.before_step(model)  # a method may correct the gradients (SCAFFOLD)
            optimizer.step()
            steps += 1
            seen += len(yb)
            loss_sum += loss.detach() * len(yb)
    return TrainStats(steps, float(loss_sum) / max(seen, 1), len(y))
