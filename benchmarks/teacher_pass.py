"""The teacher's no-grad pass over a client's data at several batch sizes, on one CPU core.

Why `logits_of` batches by 128 on a CPU: one core, the FedAvg CNN, 6,000 Fashion-MNIST-sized
images; median of 3 passes per batch size, beside one training epoch (batch 32) for scale.

    .venv/bin/python benchmarks/teacher_pass.py          # about a minute
"""

from __future__ import annotations

import statistics
import time

import torch

from driftfl.client.objectives import Objective
from driftfl.client.objectives.distill import logits_of
from driftfl.client.train import TrainSettings, train_locally
from driftfl.common.models import cnn


def median_seconds(work, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)  # as in a simulation actor
    torch.manual_seed(0)
    x, y = torch.randn(6000, 1, 28, 28), torch.randint(0, 10, (6000,))
    model = cnn((1, 28, 28), 10)
    settings = TrainSettings(epochs=1, batch_size=32, lr=0.01, momentum=0.0, weight_decay=0.0)
    train_locally(model, x[:1000], y[:1000], settings, Objective({}),  # warm-up
                  torch.Generator().manual_seed(1))
    epoch = median_seconds(lambda: train_locally(model, x, y, settings, Objective({}),
                                                 torch.Generator().manual_seed(0)), repeats=1)
    print(f"one training epoch (batch 32): {epoch:.2f} s")
    for batch in (1024, 512, 256, 128, 64):
        seconds = median_seconds(lambda: logits_of(model, x, batch))
        print(f"teacher pass, batch {batch:>4}: {seconds:.2f} s  ({seconds / epoch:.2f} of an epoch)")


if __name__ == "__main__":
    main()
