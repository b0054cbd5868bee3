"""What one hostile client inside every bound does to a run, under trusted and untrusted clients.

    .venv/bin/python benchmarks/containment.py --seeds 0 1 2 --out c.jsonl   # docs/security.md's
    .venv/bin/python benchmarks/containment.py --cost --out cost.jsonl      # ... two tables
    .venv/bin/python benchmarks/containment.py --markdown c.jsonl           # ... as markdown
    .venv/bin/python benchmarks/containment.py --methods fedavg --clients 5 --seeds 0

For each method: the final test accuracy of the honest run, and of the same run with partition 0
replaced by an adaptive attacker, under ``trust=clients`` (each paper's formula) and
``trust=none`` (strategies/parts/bounded.py). The attacker reads the bounds from the experiment
(max_update_ratio, max_peer_ratio: it does not know the others' replies, so it takes its own
honest update as the round's median) and, every round, sends the largest reply the checks accept,
pointed against learning:

- the model: its honest update reversed, at 0.9 x min(max_update_ratio x max(1, ||w_G||),
  max_peer_ratio x its own update's norm);
- SCAFFOLD: Delta c_k exactly as the server recomputes it from that model (consistent);
- FedCurv: its Fisher term x 0.9 max_peer_ratio^2 (within the 1e6 element bound);
- FedProto, FedCSD: each held class's prototype reversed, at 0.9 x the peer bound and within
  0.9 x the bound around the last global prototype it was sent;
- DCFL: a condensed set with its labels rotated among its classes and its images at 0.9 x the
  peer bound, and a classifier that is the head it was sent (so its CKA row is 0: the most
  complementary client of every group).

``--attack alie|alie-own|ipm|radius`` replaces that attacker by ones that read the round's
honest replies (benchmarks/_attacks.py: "a little is enough" with the colluding and the own
view, inner-product manipulation, a vector just inside trust=none's bound); ``--attackers``
makes partitions 0 .. A-1 attack together (default 1 of 5, 2 of 10 for those), ``--cases``
runs some columns only (``absent_none``: trust=none with the attackers silent, what the others
reach without their data, the reference for a bound that cannot use it):

    .venv/bin/python benchmarks/containment.py --attack alie --clients 5 10 --seeds 0 1 2 \
        --cases after honest_none --methods scaffold fedavg --out alie.jsonl

Under ``privacy=distributed`` (``--set privacy=distributed ...``) the model push is 0.95 x
what the server lets a client send (its clip plus its noise share's reach), skipping both.

``--cost`` measures instead what trust=none costs honest runs: Dirichlet(0.1) and #C=2, over
seeds. Every client runs the real ClientApp in this process (benchmarks/_runs.py), the strategy is
the real one, and the accuracy is the final model's on the test set.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _attacks import RoundAttacker  # noqa: E402
from _runs import in_process_federation  # noqa: E402

METHODS = ["fedavg", "scaffold", "feddyn", "fedcurv", "fedproto", "fedcsd", "dcfl"]
BASE = ["model=mlp", "dataset.subset=4000", "dataset.test_subset=2000", "rounds=5",
        "logit_shift_samples=8"]
EXTRA = {"dcfl": ["strategy.condense_iterations=20", "strategy.pretrain_epochs=2"]}
ATTACKER = 100  # the node holding partition 0 (the next attackers: 101, ...)
ATTACKS = ["push", "alie", "alie-own", "ipm", "radius"]


def arrays_of(record) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record.keys()}


def norm(arrays) -> float:
    return math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64)))
                         for v in arrays.values() if v.dtype.kind == "f"))


class Attacker:
    """Forges partition 0's replies (see the module's docstring) from its honest ones."""

    def __init__(self, cfg, strategy):
        self.cfg, self.strategy = cfg, strategy
        self.global_prototypes = {}  # record name -> the last P_G the attacker was sent

    def forge(self, message, reply):
        from flwr.app import Array, ArrayRecord
        from driftfl.common.protocol import (ARRAYS, CLASSIFIER, CONDENSED, CONTROL,
                                             CONTROL_DELTA, FEATURE_PROTOTYPES, FISHER,
                                             PROTOTYPES)
        if reply.has_error():
            return reply
        sent, content = message.content, reply.content
        for name in (PROTOTYPES, FEATURE_PROTOTYPES):  # the global prototypes it was sent
            if name in sent.array_records and "prototypes" in sent.array_records[name]:
                self.global_prototypes[name] = sent.array_records[name]["prototypes"].numpy()
        if ARRAYS in content.array_records and ARRAYS in sent.array_records:
            g = arrays_of(sent.array_records[ARRAYS])
            own = arrays_of(content.array_records[ARRAYS])
            w = self.push(g, own)
            content[ARRAYS] = ArrayRecord({k: Array(v) for k, v in w.items()})
            if CONTROL_DELTA in content.array_records:  # consistent with the pushed model
                from driftfl.common.protocol import LOCAL_STEPS, METRICS
                from driftfl.strategies.methods.scaffold import expected_delta
                control = arrays_of(sent.array_records[CONTROL])
                steps = content.metric_records[METRICS][LOCAL_STEPS]
                delta, _ = expected_delta({k: v.astype(np.float64) for k, v in control.items()},
                                          {k: g[k] for k in control}, w,
                                          self.strategy.scale(steps))
                content[CONTROL_DELTA] = ArrayRecord({k: Array(v.astype(g[k].dtype))
                                                      for k, v in delta.items()})
        if FISHER in content.array_records:
            fisher = arrays_of(content.array_records[FISHER])
            peak = max(float(v.max(initial=0)) for v in fisher.values())
            factor = min(0.9 * self.cfg.max_peer_ratio ** 2, 0.9 * 1e6 / max(peak, 1e-30))
            content[FISHER] = ArrayRecord({k: Array((v * factor).astype(v.dtype))
                                           for k, v in fisher.items()})
        for name in (PROTOTYPES, FEATURE_PROTOTYPES):
            if name in content.array_records:
                record = content.array_records[name]
                rows = record["prototypes"].numpy()
                counts = record["counts"].numpy()
                content[name] = ArrayRecord({
                    "prototypes": Array(self.reversed_rows(rows, counts,
                                                           self.global_prototypes.get(name))),
                    "counts": Array(counts)})
        if CONDENSED in content.array_records:
            images = content.array_records[CONDENSED]["images"].numpy()
            labels = content.array_records[CONDENSED]["labels"].numpy()
            held = np.unique(labels)
            rotated = held[(np.searchsorted(held, labels) + 1) % len(held)]
            scale = 0.9 * self.cfg.max_peer_ratio
            content[CONDENSED] = ArrayRecord({"images": Array((images * scale).astype(
                images.dtype)), "labels": Array(rotated.astype(labels.dtype))})
        if CLASSIFIER in content.array_records and ARRAYS in sent.array_records:
            head = sent.array_records[ARRAYS]["head.weight"].numpy()
            content[CLASSIFIER] = ArrayRecord({"weight": Array(head.copy())})
        return reply

    def push(self, g, own):
        """Its own update reversed, at 0.9 x the smaller bound it can see (under
        privacy=distributed, where no peer screen runs: 0.95 x what the server lets a client
        send, its clip plus its noise share's reach, skipping both)."""
        cfg = self.cfg
        u = {k: own[k].astype(np.float64) - g[k] for k in g if g[k].dtype.kind == "f"}
        size = norm(u)
        length = 0.9 * min(cfg.max_update_ratio * max(1.0, norm(g)), cfg.max_peer_ratio * size)
        if cfg.privacy.name == "distributed":
            length = 0.95 * self.strategy.release.reply_bound(self.strategy.facts())
        return {k: (g[k] - length * u[k] / size).astype(g[k].dtype) if k in u and size > 0
                else own[k] for k in own}

    def reversed_rows(self, rows, counts, global_rows):
        cfg, out = self.cfg, rows.astype(np.float64).copy()
        for c in np.flatnonzero(counts > 0):
            p = out[c]
            if not np.linalg.norm(p):
                continue
            direction = -p / np.linalg.norm(p)
            length = 0.9 * cfg.max_peer_ratio * np.linalg.norm(p)
            if global_rows is not None and np.abs(global_rows[c]).sum():
                old = global_rows[c].astype(np.float64)
                bound = 0.9 * cfg.max_update_ratio * max(1.0, np.linalg.norm(old))
                while length > 1e-9 and np.linalg.norm(length * direction - old) > bound:
                    length *= 0.9
            out[c] = length * direction
        return out.astype(rows.dtype)


class AttackedGrid:
    """The in-process grid with the replies of the nodes ``attackers`` (partitions 0, 1, ...)
    forged (``attacker``: an Attacker, per reply, or a _attacks.RoundAttacker, after the round's
    replies are all in; None: honest; "absent": they never answer)."""

    def __init__(self, grid, attacker, attackers=frozenset({ATTACKER})):
        self.grid, self.attacker, self.attackers = grid, attacker, attackers

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = self.grid.send_and_receive(messages, timeout)
        if self.attacker is None:
            return replies
        if self.attacker == "absent":  # the attackers never answer: the run without them
            return [r for r in replies if r.metadata.src_node_id not in self.attackers]
        sent = {m.metadata.dst_node_id: m for m in messages}
        if hasattr(self.attacker, "forge_round"):  # forged from the round's honest replies
            return self.attacker.forge_round(sent, replies)
        return [self.attacker.forge(sent[r.metadata.src_node_id], r)
                if r.metadata.src_node_id in self.attackers else r for r in replies]

    def __getattr__(self, name):
        return getattr(self.grid, name)


def final_accuracy(overrides: list[str], attacked: bool | str, attack: str = "push",
                   attackers: int = 1) -> tuple[float, dict]:
    """(test accuracy of the final model, what the run's reports said) for one run; partitions
    0 .. ``attackers`` - 1 honest (``attacked`` False), hostile (True: ``attack``) or silent
    ("absent")."""
    import torch
    from flwr.app import ConfigRecord
    from driftfl.common.datasets import load_dataset, to_tensors
    from driftfl.common.evaluation import evaluate
    from driftfl.common.protocol import model_to_arrays
    from driftfl.strategies.parts.aggregation import to_numpy

    cfg, model, strategy, grid, record = in_process_federation(overrides)
    nodes = frozenset(range(ATTACKER, ATTACKER + attackers))
    hostile = (Attacker(cfg, strategy) if attack == "push"
               else RoundAttacker(cfg, strategy, attack, nodes))
    grid = AttackedGrid(grid, hostile if attacked is True else attacked or None, nodes)
    seen = {"rejected": 0, "refused_state": 0, "not_updated": 0, "accuracy_by_round": [],
            "state_norm_by_round": []}
    data = load_dataset(cfg.dataset)  # test_subset applies to the test set
    x, y = to_tensors(data.test_x, data.test_y, data.mean, data.std)
    tester = copy.deepcopy(model)

    def accuracy(arrays) -> float:
        if not all(np.isfinite(v).all() for v in arrays.values() if v.dtype.kind == "f"):
            return 0.0
        tester.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in arrays.items()})
        return evaluate(tester, x, y, 1000, data.num_classes)[1]

    def count(server_round, arrays):  # Flower's evaluate_fn: after every round's aggregation
        report = strategy.report
        seen["rejected"] += len(report.rejected)
        seen["refused_state"] += len(report.refused_state)
        seen["not_updated"] += server_round > 0 and not report.model_updated
        seen["accuracy_by_round"].append(round(accuracy(to_numpy(arrays)), 4))
        state = getattr(strategy, "control", None) or getattr(strategy, "h", None)
        if state:  # SCAFFOLD's c, FedDyn's h: how far an attacker walks them
            seen["state_norm_by_round"].append(round(norm(state), 4))
        return None

    result = strategy.start(grid=grid, initial_arrays=model_to_arrays(model),
                            num_rounds=cfg.rounds, train_config=record,
                            evaluate_config=ConfigRecord(dict(record)), evaluate_fn=count)
    seen["excluded"] = list(strategy.clients.excluded)
    return accuracy(to_numpy(result.arrays)), seen


CASES = (("honest", "clients", False), ("absent", "clients", "absent"),
         ("before", "clients", True), ("after", "none", True), ("honest_none", "none", False),
         ("absent_none", "none", "absent"))


def containment(methods, clients, seeds, out: Path, attack: str = "push",
                attackers: list[int] | None = None, cases=None) -> None:
    """The table's runs; ``attackers``: how many of each ``clients`` count attack (default:
    one for push, one in five for the others); ``cases``: the columns to run (default all)."""
    if attackers is None:
        attackers = [1 if attack == "push" else max(1, k // 5) for k in clients]
    chosen = [c for c in CASES if cases is None or c[0] in cases]
    print(f"attack={attack}\n{'method':10s} {'K':>3s} {'A':>2s} " + " ".join(
        f"{name:>12s}" for name, _, _ in chosen), flush=True)
    for method in methods:
        for k, a in zip(clients, attackers, strict=True):
            cells = {}
            for name, trust, attacked in chosen:
                accs = []
                for seed in seeds:
                    overrides = [f"strategy={method}", *BASE, *EXTRA.get(method, []),
                                 f"num_clients={k}", f"seed={seed}", f"trust={trust}"]
                    started = time.perf_counter()
                    acc, seen = final_accuracy(overrides, attacked, attack, a)
                    accs.append(acc)
                    record(out, {"method": method, "clients": k, "attackers": a,
                                 "attack": attack, "seed": seed, "case": name,
                                 "trust": trust, "attacked": attacked, "accuracy": acc,
                                 "seconds": time.perf_counter() - started, **seen})
                cells[name] = statistics.mean(accs)
            print(f"{method:10s} {k:3d} {a:2d} " + " ".join(
                f"{cells[name]:12.1%}" for name, _, _ in chosen), flush=True)


def cost(methods, seeds, out: Path) -> None:
    partitions = {"Dir(0.1)": ["partition=dirichlet", "partition.alpha=0.1"],
                  "#C=2": ["partition=pathological", "partition.classes_per_client=2"]}
    print(f"{'method':10s} {'partition':10s} {'trust=clients':>14s} {'trust=none':>11s} "
          f"{'difference':>11s}", flush=True)
    for method in methods:
        for label, partition in partitions.items():
            means = {}
            for trust in ("clients", "none"):
                accs = []
                for seed in seeds:
                    overrides = [f"strategy={method}", *BASE, *EXTRA.get(method, []),
                                 "num_clients=10", *partition, f"seed={seed}", f"trust={trust}"]
                    acc, seen = final_accuracy(overrides, attacked=False)
                    accs.append(acc)
                    record(out, {"method": method, "partition": label, "seed": seed,
                                 "trust": trust, "accuracy": acc, **seen})
                means[trust] = accs
            a, b = statistics.mean(means["clients"]), statistics.mean(means["none"])
            print(f"{method:10s} {label:10s} {a:14.1%} {b:11.1%} {100 * (b - a):+10.1f}p",
                  flush=True)


def markdown(path: Path) -> None:
    """The tables of docs/security.md from a run's JSON lines (``--out``): containment rows
    (method, clients) or cost rows (method, partition), means over the seeds."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cells: dict[tuple, dict[str, list[float]]] = {}
    for row in rows:
        key = (row["method"], row.get("clients", row.get("partition")))
        if "attack" in row:  # a table per attack: its rows named by it
            key = (f"{row['method']}, {row['attack']}", f"{row['clients']} "
                   f"({row['attackers']} attacking)")
        case = row.get("case", row["trust"])
        cells.setdefault(key, {}).setdefault(case, []).append(100 * row["accuracy"])
    mean = statistics.mean
    if "case" in rows[0]:
        print("| method | clients | honest | without it | attacked, trust=clients | "
              "attacked, trust=none | honest, trust=none |\n|---|---|---|---|---|---|---|")
        for (method, k), c in cells.items():
            print(f"| {method} | {k} | " + " | ".join(
                f"{mean(c[name]):.1f} %" if name in c else "-" for name in (
                    "honest", "absent", "before", "after", "honest_none")) + " |")
    else:
        print("| method | partition | trust=clients | trust=none | difference |\n"
              "|---|---|---|---|---|")
        for (method, partition), c in cells.items():
            a, b = mean(c["clients"]), mean(c["none"])
            print(f"| {method} | {partition} | {a:.1f} % | {b:.1f} % | {b - a:+.1f} |")


def record(out: Path, row: dict) -> None:
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--clients", nargs="+", type=int, default=[5, 10])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--attack", default="push", choices=ATTACKS,
                        help="the attacker: push (the module's docstring), or one that reads "
                             "the round's replies (benchmarks/_attacks.py)")
    parser.add_argument("--attackers", nargs="+", type=int, metavar="A",
                        help="attackers per --clients entry (default: 1 for push, K // 5 else)")
    parser.add_argument("--cases", nargs="+", choices=[c[0] for c in CASES],
                        help="the columns to run (default: all)")
    parser.add_argument("--cost", action="store_true",
                        help="the honest cost of trust=none (Dir(0.1), #C=2) instead")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="further overrides for every run (e.g. clip_ratio=1.5)")
    parser.add_argument("--markdown", type=Path, metavar="JSONL",
                        help="print the markdown table of an earlier run's --out file, and stop")
    parser.add_argument("--out", type=Path, default=Path("containment.jsonl"),
                        help="every run's figures, one JSON line each (appended)")
    args = parser.parse_args()
    if args.markdown:
        return markdown(args.markdown)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    BASE.extend(args.set)
    if args.cost:
        cost(args.methods, args.seeds if args.seeds != [0] else [0, 1, 2], args.out)
    else:
        containment(args.methods, args.clients, args.seeds, args.out, args.attack,
                    args.attackers, args.cases)


if __name__ == "__main__":
    main()
