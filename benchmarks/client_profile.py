"""One simulated train message, profiled: where a client's time goes besides training.

Builds round 1's real train messages with the experiment's strategy (FedAvg by default; full
Fashion-MNIST, 10 clients, Dirichlet(0.5), 1 local epoch, batch 32), then answers one client's
message with driftfl's ClientApp in this process, with 1 torch thread as a simulation actor has.
Side by side on the same client and weights it times the floor of benchmarks/overhead.py: the
plain PyTorch loop. It prints what happens between the message arriving and the reply leaving,
per stage: Ray's pickling of the message and the reply, reading the message (experiment, caps,
node config), data and partition loading (the first message only: a process keeps them),
building the model and loading the weights, the objective, the training loop, the logit-shift
diagnostic, the objective's diagnostics, and packing the reply.

    .venv/bin/python benchmarks/client_profile.py                 # cnn, the median client
    .venv/bin/python benchmarks/client_profile.py --model mlp --client 4 --repeats 5
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pickle
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from _runs import cumulative_seconds, in_process_federation  # noqa: E402

# (label, file, function): the stage's cumulative seconds in the profile
STAGES = [
    ("read the message (experiment, caps, node config)", "job.py", "from_message"),
    ("  of which data and partition loading", "data.py", "local_data"),
    ("build the model", "models.py", "build_model"),
    ("load the weights", "protocol.py", "load_arrays"),
    ("build the objective", "base.py", "build_objective"),
    ("the training loop (what the floor does)", "training.py", "train_locally"),
    ("logit-shift diagnostic: the global model's logits", "train.py", "__init__"),
    ("logit-shift diagnostic: the trained model's", "train.py", "measure"),
    ("the objective after training", "base.py", "after_training"),
    ("pack the reply's weights", "protocol.py", "model_to_arrays"),
]


def train_messages(overrides: list[str]):
    """Round 1's train messages, as the strategy builds them, and each node's Context."""
    from flwr.app import ConfigRecord

    from driftfl.common.protocol import model_to_arrays

    cfg, model, strategy, grid, record = in_process_federation(overrides)
    captured = []

    def capture(messages, timeout=None):  # keeps the train messages, answers nothing
        captured.extend(messages)
        return []

    grid.send_and_receive = capture
    logging.getLogger("flwr").setLevel(logging.CRITICAL)
    strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=1,
                   train_config=record, evaluate_config=ConfigRecord(dict(record)))
    trains = [m for m in captured if m.metadata.message_type == "train"]
    return cfg, model, trains, grid.contexts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--client", type=int, default=None,
                        help="partition id (default: the client of median size)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a simulation actor

    import overhead
    from driftfl.client.app import app

    overrides = [f"model={args.model}", f"strategy={args.strategy}", "num_clients=10",
                 "fraction=1.0", "local_epochs=1", "seed=0"]
    cfg, model, messages, contexts = train_messages(overrides)
    overhead._init_worker(cfg.to_json())
    sizes = {c: len(y) for c, (_, y) in enumerate(overhead._worker["clients"])}
    client = args.client if args.client is not None else \
        sorted(sizes, key=sizes.get)[len(sizes) // 2]
    msg = next(m for m in messages
               if contexts[m.metadata.dst_node_id].node_config["partition-id"] == client)
    context = contexts[msg.metadata.dst_node_id]
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def answer():
        return app(msg, context)

    started = time.perf_counter()
    answer()  # the first message reads the data and cuts the partition
    first = time.perf_counter() - started
    handler, floor, transport = [], [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        reply = answer()
        handler.append(time.perf_counter() - started)
        started = time.perf_counter()
        overhead._train_client((client, state, 1))
        floor.append(time.perf_counter() - started)
        started = time.perf_counter()  # Ray pickles what an actor receives and returns
        pickle.loads(pickle.dumps((msg, context)))
        pickle.loads(pickle.dumps((reply, context)))
        transport.append(time.perf_counter() - started)
    profile = cProfile.Profile()
    profile.runcall(answer)
    stats = pstats.Stats(profile).stats

    def stage(filename: str, function: str) -> float:
        return cumulative_seconds(stats, filename, function)

    ours, plain = statistics.median(handler), statistics.median(floor)
    print(f"{args.strategy}, {args.model}, client {client} ({sizes[client]} samples, "
          f"{-(-sizes[client] // cfg.batch_size)} steps), 1 torch thread; "
          f"median of {args.repeats}")
    print(f"  {'driftfl ClientApp, message in to reply out':<52} {ours:8.3f} s")
    print(f"  {'floor: the plain PyTorch loop on the same client':<52} {plain:8.3f} s")
    print(f"  {'difference':<52} {ours - plain:8.3f} s  ({ours / plain:.3f}x)")
    print(f"  {'first message (reads the dataset, cuts the partition)':<52} {first:8.3f} s")
    print("stages of one message (cProfile, whose own cost inflates the loop a little):")
    total = stage("client_app.py", "__call__")
    print(f"  {'Ray: pickle the message and the reply (not profiled)':<52} "
          f"{statistics.median(transport):8.3f} s")
    for label, filename, function in STAGES:
        print(f"  {label:<52} {stage(filename, function):8.3f} s")
    accounted = stage("job.py", "from_message") + sum(
        stage(f, fn) for _, f, fn in STAGES[2:])
    print(f"  {'the rest of the handler':<52} {total - accounted:8.3f} s")
    print(f"  {'the handler, profiled':<52} {total:8.3f} s")


if __name__ == "__main__":
    main()
