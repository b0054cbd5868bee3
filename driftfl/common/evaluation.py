"""Accuracy and loss of a model on labelled data, for the server and the clients alike."""

from __future__ import annotations

import torch
from torch import nn


def forward_batch_size(x: torch.Tensor) -> int:
    """The batch for forward passes without gradients (tests, teachers) on x's device. On a
    CPU big batches make the convolutions memory-bound: one core runs the FedAvg CNN's forward
    pass over 6,000 images in 2.4 s at batch 128 and 3.4 s at batch 1024
    (benchmarks/teacher_pass.py); a GPU wants big ones."""
    return 1024 if x.is_cuda else 128


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None,
             num_classes: int, progress=None) -> tuple[float, float, list[float]]:
    """(mean cross-entropy, accuracy, per-class accuracy) of ``model`` on (x, y), in batches
    of ``batch_size`` (None: ``forward_batch_size``); ``progress(done, total)`` after each."""
    batch_size = batch_size or forward_batch_size(x)
    model.eval()
    loss_sum = 0.0
    correct = torch.zeros(num_classes, dtype=torch.long)
    total = torch.zeros(num_classes, dtype=torch.long)
    for start in range(0, len(y), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        hits = (logits.argmax(1) == yb).long().cpu()
        correct += torch.bincount(yb.cpu(), weights=hits, minlength=num_classes).long()
        total += torch.bincount(yb.cpu(), minlength=num_classes)
        if progress:
            progress(start + len(yb), len(y))
    per_class = torch.where(total > 0, correct.double() / total.clamp(min=1), torch.nan).tolist()
    n = max(len(y), 1)
    return loss_sum / n, float(correct.sum()) / n, per_class
