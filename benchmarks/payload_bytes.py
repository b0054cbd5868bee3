"""What each method's clients send, measured: every method (conf/strategy) and its notable
variants run the data survey and 2 rounds in this process (each node a ClientApp call with its
own context, as in tests/strategies/test_methods.py; every client also evaluates) on real Fashion-MNIST, IID so that every client holds
every class (the largest per-class payloads), and every reply's records are counted with
Flower's ``count_bytes``, as a run's MeteredGrid counts them (driftfl/server/traffic.py).

    PYTHONPATH=. .venv/bin/python benchmarks/payload_bytes.py            # the default model, cnn
    PYTHONPATH=. .venv/bin/python benchmarks/payload_bytes.py --model mlp --only dcfl

Prints a markdown table: the case, the message it answers, each record of the reply with what
it holds (an array's shape and dtype, a config or metric record's keys) and its bytes (the
largest over the replies). docs/disclosure.md's figures come from it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import time
from collections import defaultdict

import sys
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.supercore.task_identity import TaskIdentity

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_methods import InProcessGrid  # noqa: E402

from driftfl.common.config import compose  # noqa: E402
from driftfl.common.protocol import DATASET_META, EXPERIMENT, model_to_arrays  # noqa: E402
from driftfl.methods import build_strategy  # noqa: E402
from driftfl.server.experiment import prepare_experiment  # noqa: E402
from driftfl.server.rounds import run_rounds  # noqa: E402
from driftfl.server.survey import survey_clients  # noqa: E402
from driftfl.server.traffic import payload_kind  # noqa: E402

CLIENTS = 3
QUICK = ["dataset.subset=1500", "dataset.test_subset=100", f"num_clients={CLIENTS}",
         "fraction=1.0", "fraction_evaluate=1.0", "rounds=2", "partition=iid", "local_epochs=1", "seed=0"]
DCFL_QUICK = ["strategy.condense_iterations=5", "strategy.pretrain_epochs=1"]
# replies alike for every method: the data survey's and federated evaluation's, shown once
SHARED = ("query.data_summary", "evaluate")
CASES = {  # every method, and the variants that send something else
    "fedavg": ["strategy=fedavg"], "fedprox": ["strategy=fedprox"],
    "fedavgm": ["strategy=fedavgm"], "fednova": ["strategy=fednova"],
    "feddisco": ["strategy=feddisco"], "feddyn": ["strategy=feddyn"], "moon": ["strategy=moon"],
    "fedlsd": ["strategy=fedlsd"], "fedntd": ["strategy=fedntd"], "fedgkd": ["strategy=fedgkd"],
    "fedssd": ["strategy=fedssd"], "fedcad": ["strategy=fedcad"],
    "fedcad (alpha_source=aux)": ["strategy=fedcad", "strategy.alpha_source=aux"],
    "fedcsd": ["strategy=fedcsd"],
    "fedcsd (prototypes=previous)": ["strategy=fedcsd", "strategy.prototypes=previous"],
    "fedcsd (prototypes=local)": ["strategy=fedcsd", "strategy.prototypes=local"],
    "fedproto": ["strategy=fedproto"], "scaffold": ["strategy=scaffold"],
    "fedcurv": ["strategy=fedcurv"], "dcfl": ["strategy=dcfl", *DCFL_QUICK],
}


class RecordingGrid(InProcessGrid):
    """tests/strategies/test_methods.py's in-process grid (each node a ClientApp call with its own
    Context); ``seen`` keeps, per (message type, record), the largest reply record and what it
    holds. An error reply stops the case."""

    def __init__(self, node_configs: dict[int, dict]):
        super().__init__(node_configs)
        self.seen: dict[tuple[str, str], tuple[int, str]] = {}

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"{reply.metadata.message_type}: {reply.error.reason}")
            for name, record in reply.content.items():
                key = (reply.metadata.message_type, name)
                size = record.count_bytes()
                if size >= self.seen.get(key, (-1, ""))[0]:
                    self.seen[key] = (size, holds(record))
        return replies


def holds(record) -> str:
    """What a record holds: its arrays' shapes and dtype (a count past three), or its keys."""
    if not isinstance(record, ArrayRecord):
        return ", ".join(record.keys())
    arrays = {key: array for key, array in record.items()}
    if len(arrays) > 3:  # one array per parameter or buffer: the model's layout
        values = sum(int(np.prod(a.shape)) for a in arrays.values())
        dtypes = sorted({a.dtype for a in arrays.values()})
        return f"{len(arrays)} arrays, {values:,} values ({'/'.join(dtypes)})"
    return ", ".join(f"{k} {tuple(a.shape)} {a.dtype}" for k, a in arrays.items())


def measure(overrides: list[str]) -> dict[tuple[str, str], tuple[int, str]]:
    """Run the survey and the rounds of one case; each reply record's bytes and contents."""
    experiment = prepare_experiment(compose([*overrides, *QUICK]))
    cfg = experiment.cfg
    model = experiment.initial_model()
    strategy = build_strategy(cfg, model, experiment.aux_set(model))
    grid = RecordingGrid({100 + i: {"dataset": cfg.dataset.name, "partition-id": i,
                                    "num-partitions": CLIENTS} for i in range(CLIENTS)})
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, CLIENTS, node_wait=5, timeout=600))
    run_rounds(strategy, grid, model_to_arrays(model), first_round=1, num_rounds=cfg.rounds,
               timeout=600, train_config=record, evaluate_config=ConfigRecord(dict(record)),
               evaluate_fn=lambda *_: None, after_round=lambda *_: None)
    return grid.seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", help="conf/model/<name>.yaml (default: cnn)")
    parser.add_argument("--only", default="", help="comma-separated cases, e.g. fedcsd,dcfl")
    args = parser.parse_args()
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        setattr(TaskIdentity, name, value)  # Flower stamps messages with a task's identity
    only = [c for c in args.only.split(",") if c]
    print(f"model={args.model}, Fashion-MNIST, {CLIENTS} IID clients, 2 rounds; the bytes are "
          "each record's count_bytes, the largest over the replies\n")
    print("| case | reply to | record (column kind) | holds | bytes |\n|---|---|---|---|---|")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    shared_done = False
    for case, overrides in CASES.items():
        if only and case not in only and case.split(" ")[0] not in only:
            continue
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the clients' progress lines
            seen = measure([*overrides, f"model={args.model}"])
        lines = defaultdict(list)
        for (message_type, record), (size, what) in sorted(seen.items()):
            shared = message_type in SHARED
            if shared and shared_done:
                continue
            shown = "(every method)" if shared else case
            lines[shown].append(f"| {shown} | {message_type} | {record} "
                                f"({payload_kind(message_type, record)}) | {what} | {size:,} |")
        shared_done = True
        print("\n".join(line for group in lines.values() for line in group), flush=True)
        print(f"<!-- {case}: {time.perf_counter() - started:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
