"""How much the order clients are served in costs a round: the makespan of a round's clients
on the simulation's workers, in partition order and in random orders, against the ideal.

Client sizes are the experiment's partition (full Fashion-MNIST, 10 clients, Dirichlet(0.5),
seed 0 by default); each client's time is taken as proportional to its size, and each client
goes to the first worker that is free, as Flower's engine and the floor's pool hand them out.

    .venv/bin/python benchmarks/serving_order.py              # 2 workers, 2,000 random orders
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from driftfl.common.config import compose  # noqa: E402
from driftfl.common.datasets import load_dataset  # noqa: E402
from driftfl.common.partition import partition  # noqa: E402


def makespan(sizes: list[int], order: list[int], workers: int) -> float:
    busy = [0.0] * workers
    for client in order:
        busy[busy.index(min(busy))] += sizes[client]
    return max(busy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--orders", type=int, default=2000)
    args = parser.parse_args()
    cfg = compose([f"num_clients={args.clients}", "seed=0"])
    data = load_dataset(cfg.dataset)
    sizes = [len(p) for p in partition(data.train_y, cfg.partition, args.clients, cfg.seed)]
    ideal = sum(sizes) / args.workers
    rng = random.Random(0)
    shuffled = []
    for _ in range(args.orders):
        order = list(range(args.clients))
        rng.shuffle(order)
        shuffled.append(makespan(sizes, order, args.workers) / ideal)
    shuffled.sort()
    print(f"client sizes {sizes}; round time on {args.workers} workers / the ideal:")
    in_order = makespan(sizes, list(range(args.clients)), args.workers) / ideal
    print(f"  partition order  {in_order:.3f}x")
    print(f"  random orders    median {statistics.median(shuffled):.3f}x, 90th percentile "
          f"{shuffled[int(0.9 * len(shuffled))]:.3f}x, worst {shuffled[-1]:.3f}x")


if __name__ == "__main__":
    main()
