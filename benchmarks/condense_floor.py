"""DM condensation against its arithmetic floor, the loop of an earlier commit beside today's.

An iteration of DM (driftfl/dcfl/condense.py) must at least push every held class's real batch
through a freshly initialised network: the floor is that pass's FLOPs (counted layer by layer:
2 x multiply-adds of every Linear and Conv2d) divided by the matmul rate measured in the same
process (the best of a GEMM of the MLP's first-layer shape, 2,560 x 784 x 200, and a 1,024^3
one). Measured on one client-sized set (600 training images of each Fashion-MNIST class), 10
classes, ipc 10, 256 real images per class, DSA as a DCFL client runs DM, one torch thread (a
simulated client's), for the MLP, LeNet-5 and the FedAvg CNN:

- ``pass``: the bare real pass (the model's ``features`` on the 2,560 images, without autograd);
- ``before``: the loop of ``--before`` (default 3370376, the last commit before the batched
  loop), extracted with ``git archive`` and imported in its own process;
- ``after``: the loop of this working tree;
- ``after, no DSA``: the same without augmentation (what DSA's transforms of the 2,560 real
  images cost is the difference).

Each is a fresh process, before and after alternating ``--repeats`` times (median kept), so
that both see the same machine. Ratios are to the floor of the same process.

    .venv/bin/python benchmarks/condense_floor.py                 # mlp, lenet5, cnn
    .venv/bin/python benchmarks/condense_floor.py --models mlp --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = {"mlp": 40, "lenet5": 12, "cnn": 3}  # per timing: a few seconds each


def worker(model: str, iterations: int, real_per_class: int) -> dict:
    """One process's measurements (run with the driftfl of PYTHONPATH)."""
    import torch

    from driftfl.common.augment import DEFAULT_TRANSFORMS, SiameseAugment, parse_transforms
    from driftfl.common.datasets import load_dataset, to_tensors
    from driftfl.common.models import build_model
    from driftfl.dcfl.condense import CondenseConfig, condense

    torch.set_num_threads(1)
    data = load_dataset({"name": "fmnist"})
    x, y = to_tensors(data.train_x, data.train_y, data.mean, data.std)
    keep = torch.cat([torch.nonzero(y == c).flatten()[:600] for c in range(10)])
    x, y = x[keep].contiguous(), y[keep]

    def make():
        return build_model({"name": model}, (1, 28, 28), 10)

    def seconds(run, repeats: int = 1) -> float:
        run()  # warm-up
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        return (time.perf_counter() - started) / repeats

    def gemm_rate() -> float:
        best = 0.0
        for m, k, n in ((10 * real_per_class, 784, 200), (1024, 1024, 1024)):
            a, b = torch.randn(m, k), torch.randn(k, n)
            best = max(best, 2 * m * k * n / min(seconds(lambda: a @ b, 10) for _ in range(3)))
        return best

    real = x[torch.cat([torch.nonzero(y == c).flatten()[:real_per_class] for c in range(10)])]
    net = make().requires_grad_(False)
    flops = _pass_flops(net, real)
    with torch.no_grad():
        pass_s = min(seconds(lambda: net.features(real), 3) for _ in range(2))
    augment = SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS))
    config = CondenseConfig(method="dm", init="noise", ipc=10, iterations=iterations, lr=1.0,
                            real_per_class=real_per_class, log_every=10**9)
    rate_before = gemm_rate()
    loop_s, plain_s = (seconds(lambda: condense(x, y, 10, config, make_network=make,
                                                augment=aug,
                                                generator=torch.Generator().manual_seed(0)))
                       for aug in (augment, None))
    rate = max(rate_before, gemm_rate())
    return {"model": model, "flops": flops, "rate": rate, "floor": flops / rate,
            "pass": pass_s, "iteration": loop_s / iterations,
            "without_dsa": plain_s / iterations}


def _pass_flops(net, images) -> int:
    """2 x the multiply-adds of every Linear and Conv2d in ``net.features`` on ``images``."""
    import torch

    total = [0]

    def count(module, inputs, output):
        if isinstance(module, torch.nn.Linear):
            total[0] += 2 * output.numel() * module.in_features
        elif isinstance(module, torch.nn.Conv2d):
            kernel = module.kernel_size[0] * module.kernel_size[1]
            total[0] += 2 * output.numel() * kernel * module.in_channels // module.groups

    hooks = [m.register_forward_hook(count) for m in net.modules()]
    with torch.no_grad():
        net.features(images)
    for hook in hooks:
        hook.remove()
    return total[0]


def measure(tree: Path, model: str, iterations: int, real_per_class: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", model, "--iterations", str(iterations),
         "--real-per-class", str(real_per_class)],
        env={**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def extract(revision: str, into: Path) -> Path:
    """The driftfl package of ``revision``, from git, in ``into``."""
    archive = into / "before.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), revision, "driftfl"],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,lenet5,cnn")
    parser.add_argument("--before", default="3370376")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--real-per-class", type=int, default=256)
    parser.add_argument("--iterations", type=int, help="per timing (default: by model)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.iterations, args.real_per_class)))
        return
    print(f"DM, 10 classes x {args.real_per_class} real images, ipc 10, DSA, 1 thread; "
          f"before = {args.before}, after = this tree; median of {args.repeats}", flush=True)
    print("model    floor ms   pass ms (x floor)   before ms (x floor)   after ms (x floor)"
          "   speed-up   after, no DSA", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = extract(args.before, Path(tmp))
        for model in args.models.split(","):
            n = args.iterations or ITERATIONS.get(model, 5)
            runs = {"before": [], "after": []}
            for _ in range(args.repeats):
                runs["before"].append(measure(before_tree, model, n, args.real_per_class))
                runs["after"].append(measure(REPO, model, n, args.real_per_class))
            floor = statistics.median(r["floor"] for r in runs["before"] + runs["after"])
            passes = statistics.median(r["pass"] for r in runs["after"])
            before = statistics.median(r["iteration"] for r in runs["before"])
            after = statistics.median(r["iteration"] for r in runs["after"])
            plain = statistics.median(r["without_dsa"] for r in runs["after"])
            rate = statistics.median(r["rate"] for r in runs["after"]) / 1e9
            print(f"{model:<8} {1e3 * floor:8.1f}   {1e3 * passes:7.1f} ({passes / floor:4.2f}x)"
                  f"     {1e3 * before:8.1f} ({before / floor:4.2f}x)"
                  f"       {1e3 * after:8.1f} ({after / floor:4.2f}x)     {before / after:5.2f}x"
                  f"     {1e3 * plain:8.1f} ({plain / floor:4.2f}x)"
                  f"   [{runs['after'][0]['flops'] / 1e9:.2f} GFLOP at {rate:.0f} GFLOP/s]",
                  flush=True)


if __name__ == "__main__":
    main()
