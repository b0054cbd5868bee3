"""What secure aggregation costs a round: real `driftfl run`s in simulation with and without
secagg=secaggplus at 10 and 50 clients per round, side by side: seconds per round (median of
rounds 2..R: round 1 holds Ray's start) and bytes per round each way.

    PYTHONPATH=. .venv/bin/python benchmarks/secagg_cost.py [--model mlp] [--clients 10 50]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics

from _runs import driftfl_rounds, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"model={args.model}, Fashion-MNIST Dir(0.5), every client in every round, "
          f"{args.rounds} rounds")
    print(f"{'clients':>7} {'secagg':>10} {'s / round':>10} {'MB down':>9} {'MB up':>8} "
          f"{'time x':>7} {'bytes x':>8}")
    for clients in args.clients:
        plain = None
        for secagg in ("none", "secaggplus"):
            rows = driftfl_rounds([f"model={args.model}", f"num_clients={clients}",
                                   f"rounds={args.rounds}", f"secagg={secagg}"])
            seconds = steady(rows, "seconds")
            down = statistics.fmean(r["bytes_sent"] for r in rows) / 2**20
            up = statistics.fmean(r["bytes_received"] for r in rows) / 2**20
            plain = plain or (seconds, down + up)
            print(f"{clients:>7} {secagg:>10} {seconds:>10.2f} {down:>9.2f} {up:>8.2f} "
                  f"{seconds / plain[0]:>7.2f} {(down + up) / plain[1]:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
