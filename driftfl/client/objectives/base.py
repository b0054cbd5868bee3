"""What an objective is: the local loss of one method, given a batch's features and logits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from driftfl.client.job import ClientJob


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor  # the model's features (input to its linear head), with gradient
    logits: torch.Tensor  # the model's logits, with gradient
    index: torch.Tensor  # positions of the batch's samples in the client's local data


class Objective:
    """Plain cross-entropy, FedAvg's local objective; every method refines it.

    A method (1) prepares from the received knowledge before the first epoch (``prepare``),
    (2) returns the batch loss (``loss``; most add ``weight * term`` to the cross-entropy),
    (3) may report diagnostics that travel back in the reply's metrics.
    """

    weight: float = 0.0

    def __init__(self, params: Mapping, job: ClientJob | None = None):
        self.params = params  # the strategy's section of the experiment config
        self.job = job  # the message, its records, the node's context (None in unit tests)

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

    def reply_records(self) -> dict:
        """Further named records for the train reply (statistics the server aggregates)."""
        return {}
