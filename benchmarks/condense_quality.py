"""How much do condensed sets teach a fresh model? DM's sets against the condensation papers.

Condensed sets are built with DM (distribution matching, Zhao & Bilen) from noise, with DSA
augmentation, as DCFL's clients run it (`driftfl.dcfl.condense`: ipc 10, lr 1.0, 256 real images
per class, the MLP's features unless --net), from one of three sources:
  central  the whole training set at once, as the papers condense (ipc images per class);
  clients  each of the 20 clients of `+experiment=dcfl_fmnist`'s split (Dir(0.5), seed 0, or
           --partition pathological: two classes a client) condenses its own data (seed = its
           index); the union of the 20 sets, as a DCFL run's clients ship them;
  --run    a DCFL run directory: the union of its shipped sets, images/client_*.npz.
Beside each set, `random`: as many real images of each class as the set holds, drawn (seeded) from
the real images that produced it (central: the training set; clients and --run: each client's
own data, as the run's config.yaml partitions it; a client holding fewer gives all it has).
Each set alone trains fresh evaluators, scored on the 10,000 test images, with the papers'
protocol (VICO-UoE/DatasetCondensation `evaluate_synset`): SGD lr 0.01, momentum 0.9, weight
decay 5e-4, batch 256, lr x0.1 at half the epochs, DSA on every batch (a transform per image),
--epochs (default 300: the DC/DSA papers' count; the DM paper trains 1000) and --evals seeds:
mean ± std. Evaluators: `mlp` (driftfl's 200-200 MLP) and `convnet`, the papers' ConvNet
(`model=convnet`), the one their figures are for.

    .venv/bin/python benchmarks/condense_quality.py --quick                 # a smoke run, ~1 min
    .venv/bin/python benchmarks/condense_quality.py --dataset fmnist --out results/quality.jsonl
    .venv/bin/python benchmarks/get_mnist.py --dir /tmp/mnist                # MNIST, once
    .venv/bin/python benchmarks/condense_quality.py --dataset mnist --mnist-root /tmp/mnist
    .venv/bin/python benchmarks/condense_quality.py --run outputs/2024-01-01/12-00-00
    .venv/bin/python benchmarks/condense_quality.py --markdown results/quality.jsonl

The papers condense with the ConvNet for 20,000 (DM) or 1,000 (DC/DSA) iterations; `--net convnet
--iterations 20000` is their setting: a GPU's (--device cuda). Measured on one busy CPU thread:
the ConvNet as condensation network takes about 16 s per DM iteration; as evaluator, 3.3 s per
batch of 256 and 58 s per pass over the test set, so 300 epochs cost some 17 min per seed on the
central set (100 images) and 2 h on the clients' union (about 2,000 images); with the MLP the
whole --quick run (both sources: 21 condensations of 20 iterations) took 20 s.
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
import torch.nn.functional as F
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from driftfl.common.augment import DEFAULT_TRANSFORMS, SiameseAugment, parse_transforms  # noqa: E402,E501
from driftfl.common.datasets import load_dataset, to_tensors  # noqa: E402
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.partition import partition  # noqa: E402
from driftfl.dcfl.condense import CondenseConfig, condense  # noqa: E402

CLIENTS, SEED = 20, 0  # conf/experiment/dcfl_fmnist.yaml, seed 0
# ConvNet evaluators, 10 condensed images per class, test accuracy % (mean ± std).
# DC: Zhao, Mopuri & Bilen, "Dataset Condensation with Gradient Matching", ICLR 2021, Table 1
# (also its random-real-images baseline); DSA: Zhao & Bilen, "Dataset Condensation with
# Differentiable Siamese Augmentation", ICML 2021; DM: Zhao & Bilen, "Dataset Condensation with
# Distribution Matching", WACV 2023 (no Fashion-MNIST figure).
PAPERS = {"fmnist": {"random": (73.8, 0.7), "DC": (82.3, 0.4), "DSA": (84.6, 0.3)},
          "mnist": {"random": (94.8, 0.2), "DC": (97.4, 0.2), "DSA": (97.8, 0.1),
                    "DM": (97.5, 0.1)}}
QUICK = {"iterations": 20, "epochs": 20, "evals": 1, "evaluators": "mlp"}
FULL = {"iterations": 200, "epochs": 300, "evals": 3, "evaluators": "mlp,convnet"}


def dm(x, y, args, seed: int, shape) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(x, y) condensed as a DCFL client does it, with DM from noise; and its seconds."""
    config = CondenseConfig(method="dm", init="noise", ipc=args.ipc, iterations=args.iterations,
                            lr=args.lr, optimizer=args.optimizer,
                            real_per_class=args.real_per_class, min_class=args.ipc,
                            log_every=args.iterations)
    started = time.perf_counter()
    images, labels = condense(
        x.to(args.device), y.to(args.device), 10, config,
        make_network=lambda: build_model({"name": args.net}, shape, 10).to(args.device),
        augment=SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS)),
        generator=torch.Generator().manual_seed(seed))
    return images.detach().cpu(), labels.cpu(), time.perf_counter() - started


def random_like(pool_y: np.ndarray, labels: torch.Tensor, seed: int) -> np.ndarray:
    """Indices into pool_y: as many of each class as ``labels`` holds (all there are if fewer)."""
    rng = np.random.default_rng(seed)
    counts = np.bincount(labels.numpy(), minlength=10)
    picks = [rng.choice(np.flatnonzero(pool_y == c), min(n, int((pool_y == c).sum())),
                        replace=False) for c, n in enumerate(counts) if n]
    return np.concatenate(picks)


def sets_central(data, args, shape):
    x, y = to_tensors(data.train_x, data.train_y, data.mean, data.std)
    images, labels, seconds = dm(x, y, args, SEED, shape)
    keep = random_like(data.train_y, labels, SEED)
    return [("dm", images, labels, seconds), ("random", x[keep], y[keep], None)]


def sets_clients(data, parts, args, shape, shipped=None):
    """Each client condenses its own data (or, from a run, what it shipped); the unions."""
    dm_sets, real, seconds = [], [], 0.0
    for client, part in enumerate(parts):
        x, y = to_tensors(data.train_x[part], data.train_y[part], data.mean, data.std)
        if shipped is None:
            images, labels, took = dm(x, y, args, client, shape)
            seconds += took
            print(f"  client {client}: {len(part)} real images, {len(labels)} condensed, "
                  f"{took:.1f} s", file=sys.stderr, flush=True)
        elif client in shipped:
            images, labels = shipped[client]
        else:
            continue
        dm_sets.append((images, labels))
        keep = random_like(data.train_y[part], labels, client)
        real.append((x[keep], y[keep]))
    cat = [torch.cat(t) for t in zip(*dm_sets)], [torch.cat(t) for t in zip(*real)]
    if shipped is not None:  # the run's condensation may be dc or dsa: its config.yaml says
        return [("shipped", *cat[0], None), ("random", *cat[1], None)]
    return [("dm", *cat[0], seconds), ("random", *cat[1], None)]


def read_run(run: Path):
    """A DCFL run's dataset spec, partition and shipped sets (normalised), by client index."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    data = load_dataset(cfg["dataset"])
    parts = partition(data.train_y, cfg["partition"], cfg["num_clients"], cfg["seed"])
    shipped = {}
    for path in sorted((run / "images").glob("client_*.npz")):
        with np.load(path, allow_pickle=False) as arrays:
            pixels, y = arrays["x"], arrays["y"]
        pixels = pixels[:, None] if pixels.ndim == 3 else pixels.transpose(0, 3, 1, 2)
        shipped[int(path.stem.removeprefix("client_"))] = to_tensors(pixels, y, data.mean,
                                                                     data.std)
    if not shipped:
        sys.exit(f"{run} holds no images/client_*.npz: not a DCFL run that shipped its sets")
    return cfg["dataset"]["name"], data, parts, shipped


def train_and_test(name, x, y, test, args, seed: int, shape) -> float:
    """The papers' evaluate_synset: a fresh ``name`` trained on (x, y) alone; test accuracy %."""
    torch.manual_seed(seed)  # the evaluator's initial weights
    net = build_model({"name": name}, shape, 10).to(args.device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    augment = SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS))
    gen = torch.Generator().manual_seed(seed)
    x, y = x.to(args.device), y.to(args.device)
    net.train()
    for epoch in range(args.epochs):
        if epoch == args.epochs // 2:
            for group in opt.param_groups:
                group["lr"] *= 0.1
        order = torch.randperm(len(x), generator=gen).to(args.device)
        for batch in order.split(256):
            xb = augment(x[batch], int(torch.randint(2**31, (1,), generator=gen)),
                         per_sample=True)
            opt.zero_grad()
            F.cross_entropy(net(xb), y[batch]).backward()
            opt.step()
    net.eval()
    test_x, test_y = test
    with torch.no_grad():
        right = sum(int((net(xb.to(args.device)).argmax(1).cpu() == yb).sum())
                    for xb, yb in zip(test_x.split(1000), test_y.split(1000)))
    return 100.0 * right / len(test_y)


def markdown(path: Path) -> None:
    """The rows of a --out file as a markdown table, beside the papers' ConvNet figures."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("| dataset | source | split | set | images | DM iterations | evaluator | epochs | "
          "accuracy % | papers (ConvNet, 10 per class) |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        paper = PAPERS.get(r["dataset"], {})
        wanted = ["random"] if r["set"] == "random" else [k for k in paper if k != "random"]
        anchors = ", ".join(f"{k} {paper[k][0]} ± {paper[k][1]}" for k in wanted if k in paper)
        split = r.get("partition") or r.get("run") or "-"
        print(f"| {r['dataset']} | {r['source']} | {split} | {r['set']} | {r['images']} | "
              f"{r.get('iterations') if r['set'] == 'dm' else '-'} | {r['evaluator']} | {r['epochs']} | {r['mean']:.1f} ± {r['std']:.1f} | "
              f"{anchors or '-'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["fmnist", "mnist"], default="fmnist")
    parser.add_argument("--mnist-root", help="MNIST's IDX files (benchmarks/get_mnist.py)")
    parser.add_argument("--source", default="central,clients", help="central,clients")
    parser.add_argument("--run", type=Path, help="a DCFL run directory: score its shipped sets")
    parser.add_argument("--iterations", type=int, help="DM iterations (default 200)")
    parser.add_argument("--lr", type=float, default=1.0, help="DM's lr on the pixels")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                        help="DM's optimiser on the pixels")
    parser.add_argument("--real-per-class", type=int, default=256)
    parser.add_argument("--ipc", type=int, default=10)
    parser.add_argument("--net", default="mlp", help="the condensation network (a model name)")
    parser.add_argument("--evaluators", help="mlp,convnet (default both)")
    parser.add_argument("--epochs", type=int, help="evaluator epochs (default 300)")
    parser.add_argument("--evals", type=int, help="evaluator seeds (default 3)")
    parser.add_argument("--partition", choices=["dirichlet", "pathological"],
                        default="dirichlet")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet's alpha")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="20 iterations, 20 epochs, 1 eval, mlp only: a smoke run")
    parser.add_argument("--out", type=Path, help="append a JSON row per result here")
    parser.add_argument("--markdown", type=Path, help="print an --out file as markdown; stop")
    args = parser.parse_args()
    if args.markdown:
        return markdown(args.markdown)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)

    if args.run:
        args.dataset, data, parts, shipped = read_run(args.run)
        sources = ["run"]
    else:
        spec = {"name": args.dataset}
        if args.dataset == "mnist" and args.mnist_root:
            spec["root"] = args.mnist_root
        data = load_dataset(spec)
        sources = args.source.split(",")
        split = ({"name": "dirichlet", "alpha": args.alpha, "min_size": 10}
                 if args.partition == "dirichlet" else  # conf/partition/*.yaml's settings
                 {"name": "pathological", "classes_per_client": 2, "assignment": "covering"})
        parts = partition(data.train_y, split, CLIENTS, SEED) if "clients" in sources else None
    shape = data.shape
    condensed = {"net": args.net, "iterations": args.iterations, "lr": args.lr, "ipc": args.ipc,
                 "real_per_class": args.real_per_class, "threads": args.threads,
                 "device": args.device}
    skew = args.partition + (f"({args.alpha})" if args.partition == "dirichlet" else "")
    settings = {"central": {**condensed, "partition": None},
                "clients": {**condensed, "partition": skew},
                "run": {"run": str(args.run)}}  # its config.yaml says how it condensed
    test = to_tensors(data.test_x, data.test_y, data.mean, data.std)
    print(f"{'dataset':<7} {'source':<8} {'set':<7} {'images':>6}  {'evaluator':<9} "
          f"{'accuracy %':>13}  {'condense s':>10}", flush=True)
    for source in sources:
        if source == "central":
            sets = sets_central(data, args, shape)
        elif source == "clients":
            sets = sets_clients(data, parts, args, shape)
        elif source == "run":
            sets = sets_clients(data, parts, args, shape, shipped)
        else:
            sys.exit(f"unknown source {source!r}; valid: central, clients (or --run DIR)")
        for kind, x, y, seconds in sets:
            for evaluator in args.evaluators.split(","):
                accs = [train_and_test(evaluator, x, y, test, args, seed, shape)
                        for seed in range(args.evals)]
                std = statistics.stdev(accs) if len(accs) > 1 else 0.0
                took = f"{seconds:10.1f}" if seconds is not None else f"{'-':>10}"
                print(f"{args.dataset:<7} {source:<8} {kind:<7} {len(y):>6}  {evaluator:<9} "
                      f"{statistics.mean(accs):6.2f} ± {std:4.2f}  {took}", flush=True)
                row = {"dataset": args.dataset, "source": source, "set": kind, "images": len(y),
                       "per_class": np.bincount(y.numpy(), minlength=10).tolist(),
                       "evaluator": evaluator, "mean": statistics.mean(accs), "std": std,
                       "accuracies": accs, "epochs": args.epochs, "condense_seconds": seconds,
                       **settings[source]}
                if args.out:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
