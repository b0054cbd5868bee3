"""What DCFL costs: condensation time on a client, and bytes and round time against FedAvg.

Measured side by side in one run:
  1. condensation seconds per client for dm, dc and dsa (`driftfl.client.condense`) on one
     client-sized slice of real Fashion-MNIST (600 training images of each of classes 0-4:
     3,000 images, about one client of the Dir(0.5) 20-client split), the MLP, ipc 10, with
     1 torch thread (what a simulated client gets) and with 2; dm at the CPU default (200
     iterations, lr 1.0, DSA as the client runs it), dc and dsa at 20 iterations (outer/inner
     loops 10/50, lr 0.1); seconds per iteration, extrapolated to the paper-grade counts
     (dm 20,000, dc/dsa 1,000 iterations);
  2. `driftfl run +experiment=dcfl_fmnist rounds=R seed=0` (20 clients, 5 a round, the MLP)
     with strategy=fedavg and strategy=dcfl: mean MB per round down (server -> clients) and up
     over the rounds after every client is explored (DCFL's split into model bytes, i.e. the
     total minus the condensed images, and condensed bytes), the pre-training stage's bytes
     (DCFL's round 1 minus its round 2, a round of the same shape: 2 exploited, 3 exploring),
     and the steady round time (mean `seconds` over the last half of the rounds).

    .venv/bin/python benchmarks/dcfl_cost.py            # R = 15
    .venv/bin/python benchmarks/dcfl_cost.py --quick    # R = 6, fewer condensation iterations

On a busy 2-core machine the full run took 51 min, 39 of them condensing with 2 threads (two
threads on oversubscribed cores ran 7-34x slower than one); the rest, one-thread condensation and
both `driftfl run`s, took about 12 min.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import driftfl_rounds  # noqa: E402

from driftfl.dcfl.condense import CondenseConfig, condense
from driftfl.common.augment import (DEFAULT_TRANSFORMS, SiameseAugment,  # noqa: E402
                                    parse_transforms)
from driftfl.common.datasets import load_dataset, to_tensors  # noqa: E402
from driftfl.common.models import DriftModel, mlp  # noqa: E402

CLIENTS = 20  # dcfl_fmnist's num_clients
CLASSES, PER_CLASS = range(5), 600
PAPER = {"dm": 20_000, "dc": 1_000, "dsa": 1_000}  # the condensation authors' iterations
MB = 2**20


def client_data() -> tuple[torch.Tensor, torch.Tensor]:
    """PER_CLASS training images of each of CLASSES, normalised as the clients see them."""
    data = load_dataset({"name": "fmnist"})
    x, y = to_tensors(data.train_x, data.train_y, data.mean, data.std)
    keep = torch.cat([torch.nonzero(y == c).flatten()[:PER_CLASS] for c in CLASSES])
    return x[keep], y[keep]


def condense_seconds(x: torch.Tensor, y: torch.Tensor, config: CondenseConfig,
                     threads: int) -> float:
    """Wall seconds of one `condense` call with `threads` torch threads (after a warm-up)."""
    torch.set_num_threads(threads)
    augment = (SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS))
               if config.method != "dc" else None)  # as the DCFL client passes it

    def make() -> DriftModel:
        return mlp((1, 28, 28), 10)

    warm = CondenseConfig(method=config.method, iterations=1, lr=config.lr)
    condense(x, y, 10, warm, make_network=make, augment=augment,
             generator=torch.Generator().manual_seed(1))
    started = time.perf_counter()
    condense(x, y, 10, config, make_network=make, augment=augment,
             generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - started


def condensation(quick: bool) -> None:
    x, y = client_data()
    iterations = {"dm": 50, "dc": 5, "dsa": 5} if quick else {"dm": 200, "dc": 20, "dsa": 20}
    print(f"1. condensation per client: Fashion-MNIST classes {CLASSES[0]}-{CLASSES[-1]}, "
          f"{len(y)} images, mlp, ipc 10, 256 real images per class per iteration")
    print(f"{'method':<6} {'iters':>5} {'lr':>4}  {'1 thread':>9} {'s/iter':>7}  "
          f"{'2 threads':>9} {'s/iter':>7}  {'paper iters':>11} {'-> 1 thread':>12} "
          f"{'2 threads':>10}")
    for method, n in iterations.items():
        config = CondenseConfig(method=method, ipc=10, iterations=n,
                                lr=1.0 if method == "dm" else 0.1, outer_loop=10,
                                inner_loop=50, log_every=n)
        one, two = (condense_seconds(x, y, config, t) / n for t in (1, 2))
        paper = PAPER[method]
        print(f"{method:<6} {n:>5} {config.lr:>4}  {one * n:>7.2f} s {one:>7.4f}  "
              f"{two * n:>7.2f} s {two:>7.4f}  {paper:>11,} {one * paper / 60:>8.1f} min "
              f"{two * paper / 60:>6.1f} min", flush=True)


def mean_mb(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows) / MB


def runs(rounds: int) -> None:
    common = ["+experiment=dcfl_fmnist", f"rounds={rounds}", "seed=0"]
    print(f"\n2. driftfl run +experiment=dcfl_fmnist rounds={rounds} seed=0 ({CLIENTS} clients, "
          "5 a round, mlp, 2 local epochs): MB per round, all 5 clients together", flush=True)
    fedavg = driftfl_rounds(["strategy=fedavg", *common])
    dcfl = driftfl_rounds(["strategy=dcfl", *common])
    done = next((i for i, r in enumerate(dcfl) if r["explored_total"] >= CLIENTS), None)
    if done is None or done + 1 >= len(dcfl):
        sys.exit(f"not every client explored before the last round "
                 f"(explored: {dcfl[-1]['explored_total']}); run more rounds")
    steady = [r["round"] for r in dcfl[done + 1:]]
    print(f"every client explored after round {done + 1}: bytes are means over rounds "
          f"{steady[0]}..{steady[-1]}")
    pick = {"fedavg": [r for r in fedavg if r["round"] in steady], "dcfl": dcfl[done + 1:]}
    half = {"fedavg": fedavg[len(fedavg) // 2:], "dcfl": dcfl[len(dcfl) // 2:]}
    got: dict[str, dict[str, float]] = {}
    print(f"{'strategy':<8} {'down':>8} {'model':>8} {'condensed':>9}  {'up':>8} {'model':>8} "
          f"{'condensed':>9}  {'down+up':>8} {'ratio':>6}  {'round':>8} {'ratio':>6}")
    for name, rows in pick.items():
        down, up = mean_mb(rows, "bytes_sent"), mean_mb(rows, "bytes_received")
        c_down = mean_mb(rows, "condensed_bytes_sent") if name == "dcfl" else 0.0
        c_up = mean_mb(rows, "condensed_bytes_received") if name == "dcfl" else 0.0
        got[name] = {"total": down + up, "round": statistics.fmean(r["seconds"]
                                                                   for r in half[name])}
        base = got["fedavg"]
        print(f"{name:<8} {down:>8.3f} {down - c_down:>8.3f} {c_down:>9.3f}  {up:>8.3f} "
              f"{up - c_up:>8.3f} {c_up:>9.3f}  {down + up:>8.3f} "
              f"{got[name]['total'] / base['total']:>5.2f}x  {got[name]['round']:>6.2f} s "
              f"{got[name]['round'] / base['round']:>5.2f}x", flush=True)
    first, second = dcfl[0], dcfl[1]
    pre = {k: (first[k] - second[k]) / MB
           for k in ("bytes_sent", "bytes_received", "condensed_bytes_received")}
    print(f"DCFL pre-training stage (round 1 - round 2): {pre['bytes_sent']:.3f} MB down, "
          f"{pre['bytes_received']:.3f} MB up ({pre['condensed_bytes_received']:.3f} condensed); "
          f"round 1 {first['seconds']:.1f} s, round 2 {second['seconds']:.1f} s")
    print(f"round = mean `seconds` over rounds {half['dcfl'][0]['round']}..{rounds}; "
          f"DCFL explored clients per round: "
          f"{' '.join(str(r['explored_total']) for r in dcfl)}")
    print(f"final accuracy: fedavg {100 * fedavg[-1]['test_accuracy']:.2f} %, "
          f"dcfl {100 * dcfl[-1]['test_accuracy']:.2f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="R = 6, fewer iterations")
    args = parser.parse_args()
    print(f"note: timings on a shared {os.cpu_count()}-core machine are noisy; compare rows "
          f"of one run, not across runs (load average now {os.getloadavg()[0]:.1f})\n")
    condensation(args.quick)
    runs(6 if args.quick else 15)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min), "
          f"{os.getloadavg()[2]:.1f} (15 min)")


if __name__ == "__main__":
    main()
