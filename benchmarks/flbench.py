"""driftfl against FL-bench (github.com/KarhouTam/FL-bench), the same FedAvg job side by side.

The job: FedAvg, full Fashion-MNIST, 10 clients all training every round, Dirichlet(0.5) label
skew, 1 local epoch, batch 32, SGD lr 0.05 momentum 0.9 (a fresh optimizer every round in both),
4 rounds, CPU, on the SAME model: driftfl's `cnn` (FedAvg CNN with padded convs, 1.66 M
parameters), registered in FL-bench as `driftfl_cnn`; FL-bench's own `avgcnn` has unpadded convs
and about a third of the FLOPs. The script checks that both models have the same parameter shapes.
It runs `driftfl run`, then FL-bench in serial mode (one process, torch's default threads), then
in parallel mode (2 Ray workers of 1 CPU each, as driftfl's 2 actors), one after the other, and
prints the steady round (median of rounds 2..R: round 1 holds Ray's start and the first data
load), the training phase alone, the ratios FL-bench / driftfl and the final test accuracies.
A round is timed the same way in both: from the clients' training to after the central test of
the new global model (FL-bench: `train_one_round` up to `display_metrics`, measured by wrapping
those methods of FL-bench's FedAvgServer in its own process).

Setup, once, outside this repository (FL-bench's code never enters driftfl):

    # FL-bench's source (measured at 06e658b) and an environment with driftfl's torch and Ray
    git clone https://github.com/KarhouTam/FL-bench /work/flbench/FL-bench
    python3.11 -m venv /work/flbench/venv
    /work/flbench/venv/bin/pip install torch==2.14.1 torchvision==0.29.1 ray==2.55.1 \\
        hydra-core omegaconf rich pandas scikit-learn matplotlib pynvml pillow scipy flwr-datasets
    # Fashion-MNIST from the files driftfl reads (Debian's dataset-fashion-mnist), split by
    # FL-bench's own script: Dir(0.5), 10 clients, seed 0, 1/7 of each client held out for testing
    cd /work/flbench/FL-bench && mkdir -p data/fmnist/FashionMNIST/raw
    for f in /usr/share/datasets/fashion-mnist/*.gz; do
        gunzip -c $f > data/fmnist/FashionMNIST/raw/$(basename $f .gz); done
    ../venv/bin/python generate_data.py -d fmnist -a 0.5 -cn 10 --seed 0 -tr 0.142857 \\
        -pd 0 --use_cuda 0
    # driftfl's CNN in FL-bench's MODELS as "driftfl_cnn" (src/utils/models.py): the class is
    # in docs/benchmarks.md, "Against FL-bench"

Run (about 20 min on 2 quiet cores; --rounds 2 for a quick check, --modes parallel for one mode):

    .venv/bin/python benchmarks/flbench.py --flbench /work/flbench/FL-bench \\
        --flbench-python /work/flbench/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import driftfl_rounds, steady  # noqa: E402

from driftfl.common.models import build_model  # noqa: E402

# Runs inside FL-bench's environment, cwd = FL-bench's root: argv = [out.json, hydra overrides].
DRIVER = r"""
import json, sys, time
out, sys.argv = sys.argv[1], ["main.py", *sys.argv[2:]]
sys.path.insert(0, ".")
import main
main.main.__wrapped__.__module__ = "__main__"  # Hydra: find config/ beside main.py, as a script
from src.server.fedavg import FedAvgServer
rows, marks = [], {}
train_one_round, display_metrics = FedAvgServer.train_one_round, FedAvgServer.display_metrics
def timed_train(self):
    marks["start"] = time.perf_counter()
    train_one_round(self)
    marks["trained"] = time.perf_counter()
def timed_display(self):
    display_metrics(self)
    done = time.perf_counter()
    test = self.test_results[self.current_epoch + 1]["centralized"]["after"]["test"]
    marks["shapes"] = [list(p.shape) for p in self.model.parameters()]
    rows.append({"round": self.current_epoch + 1, "seconds": done - marks["start"],
                 "train_seconds": marks["trained"] - marks["start"],
                 "test_accuracy": test.accuracy / 100, "test_samples": len(test._targets)})
FedAvgServer.train_one_round, FedAvgServer.display_metrics = timed_train, timed_display
main.main()
json.dump({"rows": rows, "shapes": marks["shapes"]}, open(out, "w"))
"""


def flbench_rounds(flbench: Path, python: str, mode: str, rounds: int) -> tuple[list, list]:
    """FL-bench's FedAvg on the job: its rows per round and its model's parameter shapes."""
    overrides = [
        "method=fedavg", "dataset.name=fmnist", "model.name=driftfl_cnn",
        "model.use_torchvision_pretrained_weights=false",
        "optimizer.name=sgd", "optimizer.lr=0.05", "optimizer.momentum=0.9",
        f"mode={mode}", "parallel.num_workers=2", "parallel.num_cpus=2",
        "parallel.num_gpus=1",  # a placeholder: FL-bench's parallel mode reads Ray's GPU count
        "common.seed=0", "common.join_ratio=1.0", f"common.global_epoch={rounds}",
        "common.local_epoch=1", "common.batch_size=32", "common.use_cuda=false",
        "common.reset_optimizer_on_global_epoch=true",
        # evaluate as driftfl does: the global model on the central test set after every round,
        # no client-side evaluation before and after local training
        "common.client_side_evaluation=false", "common.test.client.interval=-1",
        "common.test.server.interval=1", "common.test.server.test=true",
        "common.save_learning_curve_plot=false", "common.save_metrics=false"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        run = subprocess.run([python, "-c", DRIVER, str(out), *overrides,
                              f"hydra.run.dir={tmp}/run"],
                             cwd=flbench, capture_output=True, text=True)
        if run.returncode or not out.exists():
            sys.exit(f"FL-bench ({mode}) failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        result = json.loads(out.read_text())
    return result["rows"], result["shapes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flbench", type=Path, required=True, help="FL-bench's checkout")
    parser.add_argument("--flbench-python", required=True, help="python of FL-bench's venv")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", default="serial,parallel", help="FL-bench's modes to run")
    args = parser.parse_args()
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

    print(f"driftfl vs FL-bench: FedAvg, Fashion-MNIST, 10 clients all training, Dirichlet(0.5), "
          f"1 local epoch, batch 32, SGD lr 0.05 momentum 0.9, driftfl's cnn, {args.rounds} "
          f"rounds, CPU ({os.cpu_count()} cores)", flush=True)
    load = {}  # 1-minute load average before and after each run: this machine may be shared
    before = os.getloadavg()[0]
    runs = {"driftfl (2 Ray actors)": driftfl_rounds([
        "model=cnn", "partition=dirichlet", "partition.alpha=0.5", "num_clients=10",
        "fraction=1.0", f"rounds={args.rounds}", "local_epochs=1", "batch_size=32",
        "lr=0.05", "momentum=0.9", "seed=0"])}
    load["driftfl (2 Ray actors)"] = (before, os.getloadavg()[0])
    ours = [list(p.shape) for p in build_model({"name": "cnn"}, (1, 28, 28), 10).parameters()]
    for mode in args.modes.split(","):
        label = {"serial": "FL-bench serial", "parallel": "FL-bench parallel (2 Ray)"}[mode]
        print(f"  {label} ...", flush=True)
        before = os.getloadavg()[0]
        rows, shapes = flbench_rounds(args.flbench, args.flbench_python, mode, args.rounds)
        if shapes != ours:
            sys.exit(f"FL-bench's driftfl_cnn is not driftfl's cnn: {shapes} != {ours}")
        runs[label], load[label] = rows, (before, os.getloadavg()[0])

    base = runs["driftfl (2 Ray actors)"]
    base_round, base_train = steady(base, "seconds"), steady(base, "train_seconds")
    print(f"\n{'run':<27} {'steady round':>12} {'ratio':>6}   {'train phase':>11} {'ratio':>6}   "
          f"{'round 1':>8}   {'final accuracy':>14}   {'load before/after':>17}")
    for label, rows in runs.items():
        r, t = steady(rows, "seconds"), steady(rows, "train_seconds")
        print(f"{label:<27} {r:>10.2f} s {r / base_round:>5.2f}x   {t:>9.2f} s "
              f"{t / base_train:>5.2f}x   {rows[0]['seconds']:>6.2f} s   "
              f"{100 * rows[-1]['test_accuracy']:>13.2f}%   "
              f"{load[label][0]:>8.2f}/{load[label][1]:.2f}")
    print("per-round seconds: " + "; ".join(
        f"{label}: " + ", ".join(f"{row['seconds']:.1f}" for row in rows)
        for label, rows in runs.items()))


if __name__ == "__main__":
    main()
