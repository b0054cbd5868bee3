"""What an objective is: the local loss of one method, given a batch's features and logits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from flwr.app import Message
from torch import nn


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor  # the model's features (input to its linear head), with gradient
    logits: torch.Tensor  # the model's logits, with gradient


class Objective:
    """Plain cross-entropy, FedAvg's local objective; every method refines it.

    A method (1) prepares from the received knowledge before the first epoch (``prepare``),
    (2) returns the batch loss (``loss``; most add ``weight * term`` to the cross-entropy),
    (3) may report diagnostics that travel back in the reply's metrics.
    """

    weight: float = 0.0

    def __init__(self, params: Mapping, message: Message):
        self.params = params  # the strategy's section of the experiment config
        self.message = message

    def prepare(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called once before local training, with the model holding the global weights."""

    def term(self, batch: Batch) -> torch.Tensor | None:
        """The method's regulariser for a batch; None for none."""
        return None

    def loss(self, batch: Batch) -> torch.Tensor:
        ce = F.cross_entropy(batch.logits, batch.y)
        term = self.term(batch)
        return ce if term is None else ce + self.weight * term

    def diagnostics(self) -> dict[str, float]:
        return {}
