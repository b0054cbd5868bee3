"""Forward passes without gradients at several batch sizes on a CPU: a teacher's pass over a
client's data (one core, as in a simulation actor) and the server's central test.

Why `forward_batch_size` is 128 on a CPU: the FedAvg CNN, 6,000 Fashion-MNIST-sized images on
one core, median of 3 passes per batch size, beside one training epoch (batch 32) for scale;
then the central test (`evaluate`, 10,000 images) with 1 and 2 torch threads.

    .venv/bin/python benchmarks/teacher_pass.py          # about two minutes
"""

from __future__ import annotations

import statistics
import time

import torch

from driftfl.client.objectives import Objective
from driftfl.client.objectives.distill import logits_of
from driftfl.client.train import TrainSettings, train_locally
from driftfl.common.evaluation import evaluate
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
    test_x, test_y = torch.randn(10_000, 1, 28, 28), torch.randint(0, 10, (10_000,))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for batch in (1000, 256, 128, 32):
            seconds = median_seconds(lambda: evaluate(model, test_x, test_y, batch, 10))
            print(f"central test of 10,000 images, {threads} thread(s), batch {batch:>4}: "
                  f"{seconds:.2f} s")


if __name__ == "__main__":
    main()
