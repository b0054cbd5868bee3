"""DCFL's condensation default, chosen by measurement: quality against cost over a grid of DM
settings (iterations, optimiser and learning rate, real images per class per iteration).

For each setting, clients of DCFL's Table II split (Fashion-MNIST, 20 clients, Dirichlet(0.5),
seed 0; the first ``--clients`` of them) condense their own data as a DCFL client does (DM from
noise, ipc 10 of each class holding at least 10 images, DSA, the MLP's features, one torch
thread, seed = the client's index), and the
union of their sets, what such a run ships, is scored:
  - ``dm``: a fresh MLP trained on the union alone (the papers' protocol, benchmarks/
    condense_quality.py: 300 epochs, DSA), tested on the 10,000 test images, mean ± std over
    ``--evals`` evaluator seeds;
  - ``random``: the same, trained on as many random real images of each client's classes as its
    set holds (the baseline a condensed set must beat to be worth shipping);
  - ``copies``: the share of shipped images with a real image of their client at Pearson
    correlation >= 0.95 (driftfl.common.leakage, as `driftfl audit` measures), and the median
    nearest correlation;
  - ``s/client``: condensation seconds per client (mean).
The default rule (docs/algorithms.md, DCFL): the cheapest setting whose ``dm`` is at least its
``random`` with copies at most 5 %; the table marks the settings that pass.

    .venv/bin/python benchmarks/condense_default.py --out results/condense-default/grid.jsonl
    .venv/bin/python benchmarks/condense_default.py --grid "adam:0.05:64:1000" --clients 4
    .venv/bin/python benchmarks/condense_default.py --markdown results/condense-default/grid.jsonl

A grid entry is ``optimizer:lr:real_per_class:iterations``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from condense_quality import random_like, train_and_test  # noqa: E402

from driftfl.common import leakage  # noqa: E402
from driftfl.common.augment import DEFAULT_TRANSFORMS, SiameseAugment, parse_transforms  # noqa: E402,E501
from driftfl.common.datasets import load_dataset, to_tensors  # noqa: E402
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.partition import partition  # noqa: E402
from driftfl.dcfl.condense import CondenseConfig, condense  # noqa: E402

GRID = ("sgd:1:256:200", "sgd:1:256:1000", "sgd:1:64:1000", "sgd:1:64:3000",
        "adam:0.01:64:200", "adam:0.01:64:1000", "adam:0.05:64:200", "adam:0.05:64:1000",
        "adam:0.05:32:1000")
SHAPE = (1, 28, 28)


def condensed_union(data, parts, clients, setting: str):
    """Each client's set under ``setting``, the union, the random baseline's union, what leaks,
    and the seconds per client."""
    optimizer, lr, per_class, iterations = setting.split(":")
    config = CondenseConfig(method="dm", init="noise", ipc=10, iterations=int(iterations),
                            lr=float(lr), optimizer=optimizer, real_per_class=int(per_class),
                            min_class=10, log_every=10**9)  # as DCFL: condense_min_class = ipc
    sets, randoms, found, seconds = [], [], [], []
    for client in clients:
        part = parts[client]
        x, y = to_tensors(data.train_x[part], data.train_y[part], data.mean, data.std)
        started = time.perf_counter()
        images, labels = condense(x, y, 10, config,
                                  make_network=lambda: build_model({"name": "mlp"}, SHAPE, 10),
                                  augment=SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS)),
                                  generator=torch.Generator().manual_seed(client))
        seconds.append(time.perf_counter() - started)
        sets.append((images, labels))
        keep = random_like(data.train_y[part], labels, client)
        randoms.append((x[keep], y[keep]))
        found.append(leakage.nearest_real(leakage.to_pixels(images.numpy(), data.mean, data.std),
                                          leakage.channels_last(data.train_x[part]))[1])
    union = [torch.cat(t) for t in zip(*sets)]
    baseline = [torch.cat(t) for t in zip(*randoms)]
    nearest = np.concatenate(found)
    copies, median = float((nearest >= leakage.THRESHOLD).mean()), float(np.median(nearest))
    return union, baseline, copies, median, statistics.mean(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default=",".join(GRID))
    parser.add_argument("--clients", type=int, default=4, help="the first N of the 20")
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=300, help="evaluator epochs")
    parser.add_argument("--evals", type=int, default=3, help="evaluator seeds")
    parser.add_argument("--out", type=Path, help="append a JSON row per setting")
    parser.add_argument("--markdown", type=Path, help="print an --out file as markdown; stop")
    args = parser.parse_args()
    if args.markdown:
        return markdown(args.markdown)
    torch.set_num_threads(1)
    data = load_dataset({"name": "fmnist"})
    parts = partition(data.train_y, {"name": "dirichlet", "alpha": args.alpha, "min_size": 10},
                      20, 0)
    test = to_tensors(data.test_x, data.test_y, data.mean, data.std)
    evaluator = argparse.Namespace(epochs=args.epochs, device="cpu")
    clients = list(range(args.clients))
    print(f"clients {clients} of Dir({args.alpha}), {sum(len(parts[c]) for c in clients)} "
          "images; MLP evaluator", flush=True)
    print("setting                 s/client  images  dm %          random %      copies  "
          "median r  passes", flush=True)
    for setting in args.grid.split(","):
        union, baseline, copies, median, seconds = condensed_union(data, parts, clients, setting)
        scores = {name: [train_and_test("mlp", *sample, test, evaluator, seed, SHAPE)
                         for seed in range(args.evals)]
                  for name, sample in (("dm", union), ("random", baseline))}
        row = {"setting": setting, "clients": clients, "alpha": args.alpha,
               "seconds_per_client": seconds, "images": len(union[1]), "copies": copies,
               "median_r": median, "epochs": args.epochs,
               **{f"{k}_mean": statistics.mean(v) for k, v in scores.items()},
               **{f"{k}_std": statistics.pstdev(v) for k, v in scores.items()}}
        print(line(row), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as out:
                out.write(json.dumps(row) + "\n")


def passes(row: dict) -> bool:
    return row["dm_mean"] >= row["random_mean"] and row["copies"] <= 0.05


def line(row: dict) -> str:
    return (f"{row['setting']:<22} {row['seconds_per_client']:8.1f}  {row['images']:6d}  "
            f"{row['dm_mean']:5.1f} ± {row['dm_std']:3.1f}   {row['random_mean']:5.1f} ± "
            f"{row['random_std']:3.1f}   {100 * row['copies']:4.1f} %  {row['median_r']:.3f}"
            f"     {'yes' if passes(row) else 'no'}")


def markdown(path: Path) -> None:
    rows = [json.loads(r) for r in path.read_text().splitlines() if r.strip()]
    print("| optimizer | lr | real per class | iterations | s / client | images | DM set % | "
          "random % | copies | median r | passes |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r["seconds_per_client"]):
        optimizer, lr, per_class, iterations = r["setting"].split(":")
        print(f"| {optimizer} | {lr} | {per_class} | {iterations} | "
              f"{r['seconds_per_client']:.1f} | {r['images']} | {r['dm_mean']:.1f} ± "
              f"{r['dm_std']:.1f} | {r['random_mean']:.1f} ± {r['random_std']:.1f} | "
              f"{100 * r['copies']:.1f} % | {r['median_r']:.3f} | "
              f"{'yes' if passes(r) else 'no'} |")


if __name__ == "__main__":
    main()
