"""Where driftfl's own fixed cost per round goes, profiled in one process.

Runs FedAvg rounds of the mlp on full Fashion-MNIST (10 clients, Dirichlet(0.5), 1 epoch, batch
32) with every client called in this process (no Flower transport, no Ray) under cProfile, and
prints the time per round of each stage besides local training: the client's reading of the
message, model building and loading, the logit-shift diagnostic, packing the reply, and the
server's reply checks and aggregation. What `benchmarks/overhead.py` measures as the fixed cost
beyond these is Flower's routing of the messages through Ray.

    .venv/bin/python benchmarks/round_profile.py          # about a minute
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from _runs import cumulative_seconds, in_process_federation  # noqa: E402

# (label, function) pairs read from the profile: cumulative seconds per round
STAGES = [
    ("client: local training (the floor does the same)", "training.py", "train_locally"),
    ("client: read the message (experiment, caps, data)", "job.py", "from_message"),
    ("client: build the model and load the weights", "job.py", "model"),
    ("client: logit-shift diagnostic (2 passes over 32 samples)", "distill.py", "logits_of"),
    ("client: pack the reply's weights", "protocol.py", "model_to_arrays"),
    ("server: check the replies", "base.py", "accept"),
    ("server: aggregate", "aggregation.py", "aggregate"),
]


def main(rounds: int = 3) -> None:
    from flwr.app import ConfigRecord

    from driftfl.common.protocol import model_to_arrays

    torch.set_num_threads(1)  # as in a simulation actor
    _, model, strategy, grid, record = in_process_federation(["model=mlp", "num_clients=10"])

    def run(num_rounds: int) -> None:
        strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=num_rounds,
                       train_config=record, evaluate_config=ConfigRecord(dict(record)))

    import logging
    logging.getLogger("flwr").setLevel(logging.WARNING)
    run(1)  # warm caches: the dataset, the partition, torch's kernels
    profile = cProfile.Profile()
    profile.runcall(run, rounds)
    stats = pstats.Stats(profile).stats
    total = sum(t for (_, _, fn), (_, _, _, t, _) in stats.items() if fn == "start")
    print(f"{rounds} rounds of 10 clients, one process: {total / rounds:.3f} s per round")
    accounted = 0.0
    for label, filename, function in STAGES:
        seconds = cumulative_seconds(stats, filename, function) / rounds
        if "training" not in label:
            accounted += seconds
        print(f"  {label:<62} {seconds:7.3f} s")
    print(f"  {'driftfl beside training, all stages above':<62} {accounted:7.3f} s")


if __name__ == "__main__":
    main()
