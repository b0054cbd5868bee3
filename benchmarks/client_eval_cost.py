"""What per-client evaluation costs a round: `driftfl run` (real Flower, Ray simulation) with
every client measuring its held-out split before and after local training, against the same
runs without the measurement, at 10 and 100 clients.

Both runs of a pair hold out the same client_test_fraction (so they train on the same data);
the one without measurement sets eval_every past the last round but one, so that its rounds
2..R-1 measure nothing (the last round always measures). A third run without a held-out split
(client_test_fraction=0, the default) shows the main job's round for reference. Prints the
median round and training-phase seconds over rounds 2..R-1 (round 1 holds Ray's start).

    .venv/bin/python benchmarks/client_eval_cost.py                 # 10 and 100 clients
    .venv/bin/python benchmarks/client_eval_cost.py --clients 10 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import driftfl_rounds  # noqa: E402


def middle(rows: list[dict], key: str) -> float:
    """Median over rounds 2..R-1: round 1 holds Ray's start, round R always measures."""
    return statistics.median(r[key] for r in rows[1:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="10,100", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=4, help="at least 3")
    parser.add_argument("--subset", type=int, default=6000, help="training samples in all")
    parser.add_argument("--fraction", type=float, default=0.2, help="client_test_fraction")
    args = parser.parse_args()
    if args.rounds < 3:
        sys.exit("--rounds must be at least 3 (rounds 2..R-1 are measured)")
    base = ["model=mlp", f"dataset.subset={args.subset}", "dataset.test_subset=1000",
            f"rounds={args.rounds}", "seed=0"]
    print(f"mlp, Fashion-MNIST subset {args.subset}, Dir(0.5), every client every round, "
          f"client_test_fraction={args.fraction}; median over rounds 2..{args.rounds - 1}")
    print("| clients | held-out split, measured | s / round | training phase s | "
          "client acc after mean |")
    print("|---|---|---|---|---|")
    for clients in (int(c) for c in args.clients.split(",")):
        for label, extra in (
                ("no split (default)", ["client_test_fraction=0"]),
                ("split, not measured", [f"client_test_fraction={args.fraction}",
                                         f"eval_every={args.rounds + 1}"]),
                ("split, measured by all", [f"client_test_fraction={args.fraction}",
                                            "eval_every=1"])):
            rows = driftfl_rounds([*base, f"num_clients={clients}", *extra])
            acc = rows[-1].get("client_acc_after_mean")
            print(f"| {clients} | {label} | {middle(rows, 'seconds'):.2f} | "
                  f"{middle(rows, 'train_seconds'):.2f} | "
                  f"{'-' if acc is None else f'{100 * acc:.1f} %'} |", flush=True)


if __name__ == "__main__":
    main()
