"""What each method costs over FedAvg, measured side by side in one run.

Every strategy runs the same experiment (the FedAvg CNN on all of Fashion-MNIST, 10 clients all
training, Dirichlet(0.5), 1 local epoch, 4 rounds); printed per strategy, relative to FedAvg:
  - the steady training phase (median over rounds 2..4 of the time from sending the round's
    first message to the aggregated model: prototype exchanges, the clients' teacher passes and
    the server's aux-set evaluation are inside; central test evaluation is not);
  - the steady whole round (central test evaluation included: teacher methods also test their
    teacher there, a diagnostic);
  - bytes per client per round, down (server -> client) and up.

    .venv/bin/python benchmarks/method_cost.py                       # about 15 min on 2 cores
    .venv/bin/python benchmarks/method_cost.py --strategies fedavg,fedcsd --epochs 5
    .venv/bin/python benchmarks/method_cost.py \
        --strategies scaffold,feddyn,moon,fedproto,fedcurv,fedcsd_code   # the baselines

A name may also be an experiment of conf/experiment (``fedcsd_code``: ``+experiment=...``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
CONF = Path(__file__).resolve().parent.parent / "conf"
from _runs import driftfl_rounds, steady  # noqa: E402


def per_client(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] / r["clients"] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="fedavg,fedcsd,fedgkd,fedssd,fedcad")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    names = args.strategies.split(",")
    if names[0] != "fedavg":
        names.insert(0, "fedavg")
    print(f"method cost: Fashion-MNIST, {args.model}, 10 clients all training, Dirichlet(0.5), "
          f"{args.epochs} local epoch(s), {args.rounds} rounds; ratios to FedAvg")
    print(f"{'strategy':<11} {'train phase':>12} {'ratio':>6}  {'round':>8} {'ratio':>6}  "
          f"{'MB down/client':>14} {'ratio':>6}  {'MB up/client':>12} {'ratio':>6}  {'acc':>6}")
    base = None
    for name in names:
        method = (f"+experiment={name}" if (CONF / "experiment" / f"{name}.yaml").is_file()
                  else f"strategy={name}")
        rows = driftfl_rounds([method, f"model={args.model}", "num_clients=10",
                               "fraction=1.0", f"local_epochs={args.epochs}",
                               f"rounds={args.rounds}", "seed=0"])
        m = {"train": steady(rows, "train_seconds"), "round": steady(rows, "seconds"),
             "down": per_client(rows, "bytes_sent") / 2**20,
             "up": per_client(rows, "bytes_received") / 2**20}
        base = base or m
        print(f"{name:<11} {m['train']:>10.2f} s {m['train'] / base['train']:>5.2f}x  "
              f"{m['round']:>6.2f} s {m['round'] / base['round']:>5.2f}x  "
              f"{m['down']:>14.2f} {m['down'] / base['down']:>5.2f}x  "
              f"{m['up']:>12.2f} {m['up'] / base['up']:>5.2f}x  "
              f"{100 * rows[-1]['test_accuracy']:>5.2f}%", flush=True)


if __name__ == "__main__":
    main()
