"""Does condensation move away from the images it started from? Leakage against iterations.

For a few clients of DCFL's Table II split (Fashion-MNIST, 20 clients, Dir(0.1), seed 0), DM as a
DCFL client runs it (ipc 10, lr 1.0, 256 real images per class, DSA, the MLP's features) from
real images and from noise, for each iteration count; then, for the shipped set, the share of
images with a real image of the client at Pearson correlation >= 0.95, the median and the
largest nearest correlation (driftfl.common.leakage, on uint8 pixels as `driftfl audit` reads
them), and the seconds it took.

    .venv/bin/python benchmarks/condense_leakage.py --iterations 200,2000
    # paper-grade (20,000 DM iterations) where a GPU is: prepare the clients' data here, run there
    .venv/bin/python benchmarks/condense_leakage.py --prepare clients.npz
    python3 benchmarks/condense_leakage.py --data clients.npz --device cuda --jobs 8 \\
        --iterations 200,2000,20000

``--data`` needs torch, numpy and pydantic only (no flwr): the prepared file holds each chosen
client's images (uint8), labels and the dataset's mean and std.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from driftfl.dcfl.condense import CondenseConfig, condense
from driftfl.common import leakage  # noqa: E402
from driftfl.common.augment import DEFAULT_TRANSFORMS, SiameseAugment, parse_transforms  # noqa: E402,E501
from driftfl.common.models import mlp  # noqa: E402

CLIENTS, ALPHA, SEED = 20, 0.1, 0  # conf/experiment/dcfl_fmnist.yaml on Dir(0.1)


def prepare(path: Path, clients: list[int]) -> None:
    """The chosen clients' training data, as the simulation partitions it."""
    from driftfl.common.datasets import load_dataset
    from driftfl.common.partition import partition

    data = load_dataset({"name": "fmnist"})
    parts = partition(data.train_y, {"name": "dirichlet", "alpha": ALPHA, "min_size": 10},
                      CLIENTS, SEED)
    arrays = {"mean": np.asarray(data.mean), "std": np.asarray(data.std)}
    for c in clients:
        arrays[f"x_{c}"], arrays[f"y_{c}"] = data.train_x[parts[c]], data.train_y[parts[c]]
    np.savez_compressed(path, **arrays)
    print(f"wrote {path}: clients {clients}, {sum(len(parts[c]) for c in clients)} images")


def one(task: tuple) -> dict:
    path, client, init, iterations, device = task
    torch.set_num_threads(1)
    data = np.load(path)
    mean, std = data["mean"], data["std"]
    pixels, y = data[f"x_{client}"], torch.from_numpy(data[f"y_{client}"])
    x = (torch.from_numpy(pixels).float() / 255 - torch.tensor(mean).view(1, -1, 1, 1).float()) \
        / torch.tensor(std).view(1, -1, 1, 1).float()
    x, y = x.to(device), y.to(device)
    config = CondenseConfig(method="dm", init=init, ipc=10, iterations=iterations, lr=1.0,
                            real_per_class=256, log_every=max(1, iterations))
    started = time.perf_counter()
    images, labels = condense(x, y, 10, config,
                              make_network=lambda: mlp(tuple(x.shape[1:]), 10).to(device),
                              augment=SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS)),
                              generator=torch.Generator().manual_seed(client))
    seconds = time.perf_counter() - started
    shipped = leakage.to_pixels(images.cpu().numpy(), mean, std)
    found = leakage.measure(shipped, leakage.to_pixels(x.cpu().numpy(), mean, std))
    return {"client": client, "init": init, "iterations": iterations, "images": found.images,
            "copies": found.copies, "share": found.share, "median": found.median,
            "max": found.max, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="0,1,2,3")
    parser.add_argument("--iterations", default="200,2000")
    parser.add_argument("--init", default="real,noise")
    parser.add_argument("--prepare", type=Path, help="write the clients' data here and stop")
    parser.add_argument("--data", type=Path, help="the prepared clients' data (default: "
                        "prepare it in a temporary file)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    if args.prepare:
        return prepare(args.prepare, clients)
    if args.data is None:
        args.data = Path("/tmp/condense_leakage_clients.npz")
        prepare(args.data, clients)
    tasks = [(str(args.data), c, init, int(n), args.device) for n in args.iterations.split(",")
             for init in args.init.split(",") for c in clients]
    print("client  init   iterations  copies (>= 0.95)  median  max     seconds", flush=True)
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(one, tasks):
            rows.append(row)
            print(f"{row['client']:>6}  {row['init']:<5}  {row['iterations']:>10}  "
                  f"{row['copies']:>4}/{row['images']:<4} {100 * row['share']:5.1f} %  "
                  f"{row['median']:.3f}   {row['max']:.3f}   {row['seconds']:8.1f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
