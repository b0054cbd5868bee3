"""The server's aux set: labelled samples carved from the training data before partitioning
(so no client holds them), on which the server measures the global model (FedSSD, FedCAD)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from driftfl.common.protocol import load_numpy


class AuxSet:
    def __init__(self, x: torch.Tensor, y: torch.Tensor, model: nn.Module, num_classes: int):
        self.x, self.y = x, y
        self.model = copy.deepcopy(model).eval()
        self.num_classes = num_classes

    @torch.no_grad()
    def probabilities(self, arrays: dict[str, np.ndarray]) -> torch.Tensor:
        """softmax of the model holding ``arrays``, on every sample of the aux set."""
        load_numpy(self.model, arrays)
        return torch.softmax(self.model(self.x), dim=1)

    def confusion(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """A[i, j] = share of class-i samples predicted as j (rows sum to 1; zero for a class
        the set does not hold)."""
        predicted = self.probabilities(arrays).argmax(dim=1).cpu()
        counts = torch.zeros(self.num_classes, self.num_classes)
        counts.index_put_((self.y.cpu(), predicted), torch.ones(len(self.y)), accumulate=True)
        return (counts / counts.sum(dim=1, keepdim=True).clamp(min=1)).numpy().astype(np.float32)

    def class_phi(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """E_{x|y}[p_y - sum_{k != y} p_k] = E_{x|y}[2 p_y - 1] per class (NaN for no samples)."""
        p_true = self.probabilities(arrays).gather(1, self.y[:, None]).squeeze(1).cpu()
        y = self.y.cpu()
        sums = torch.zeros(self.num_classes).index_add_(0, y, 2 * p_true - 1)
        counts = torch.bincount(y, minlength=self.num_classes)
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan).numpy()
