"""What driftfl's simulation costs over the compute floor, measured side by side in one run.

(a) `driftfl run`: real Flower, a simulation SuperLink, Ray actors (1 core each).
(b) the floor: the same clients, samples, model and SGD as a plain PyTorch loop in as many
    worker processes as driftfl has actors (1 torch thread each), clients handed out one at a
    time, then the same weighted average and the same central evaluation.

(c) with --ray-floor, the same floor with its workers as Ray actors (1 CPU each, Ray's
    ActorPool) instead of a process pool: what Ray's worker processes and task dispatch cost
    the same code, apart from Flower and driftfl.

Prints, per model, the steady-round wall time of both (median over rounds 2..R: round 1 holds
Ray's start and the first data load) and their ratio, for the whole round and for the training
phase alone; with the mlp, whose compute is tiny, the difference is driftfl's fixed cost per round.
The floor hands the clients out in partition order, as driftfl's simulation does.

    .venv/bin/python benchmarks/overhead.py                  # cnn and mlp, 4 rounds each
    .venv/bin/python benchmarks/overhead.py --models cnn --rounds 6 --ray-floor
    python benchmarks/overhead.py --models cnn --device cuda --client-gpus 0.25   # on a GPU

With --device cuda, driftfl's clients train on Ray's GPU workers (simulation.client_gpus each)
and the floor trains the same clients one after another on the same GPU in one process (clients
sharing one GPU gain little from more processes).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from driftfl.common.config import ExperimentConfig, compose  # noqa: E402
from driftfl.common.datasets import load_dataset, to_tensors  # noqa: E402
from driftfl.common.evaluation import evaluate  # noqa: E402
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.partition import partition  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import driftfl_rounds, steady  # noqa: E402

_worker: dict = {}


def _init_worker(cfg_json: str, device: str = "cpu") -> None:
    """Each floor worker holds every client's tensors, like a Ray actor serving many nodes."""
    if device == "cpu":
        torch.set_num_threads(1)
    cfg = ExperimentConfig.from_json(cfg_json)
    data = load_dataset(cfg.dataset)
    parts = partition(data.train_y, cfg.partition, cfg.num_clients, cfg.seed)
    _worker.update(cfg=cfg, shape=data.shape, classes=data.num_classes, device=device, clients=[
        tuple(t.to(device) for t in to_tensors(data.train_x[p], data.train_y[p], data.mean,
                                               data.std)) for p in parts])


def _train_client(job):
    """Plain PyTorch: SGD with momentum over shuffled mini-batches, cross-entropy."""
    client, state, server_round = job
    cfg = _worker["cfg"]
    x, y = _worker["clients"][client]
    model = build_model(cfg.model, _worker["shape"], _worker["classes"]).to(_worker["device"])
    model.load_state_dict(state)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(1000 * server_round + client)
    for _ in range(int(cfg.local_epochs)):
        order = torch.randperm(len(y), generator=g).to(_worker["device"])
        for start in range(0, len(y), int(cfg.batch_size)):
            idx = order[start:start + int(cfg.batch_size)]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}, len(y)


class _RayWorker:
    """A floor worker as a Ray actor: the same code as the process pool's."""

    def __init__(self, cfg_json: str):
        sys.path.insert(0, str(REPO))
        _init_worker(cfg_json)

    def train(self, job):
        return _train_client(job)


@contextlib.contextmanager
def _process_pool(cfg, workers: int):
    with mp.get_context("spawn").Pool(workers, initializer=_init_worker,
                                      initargs=(cfg.to_json(),)) as pool:
        yield lambda jobs: list(pool.imap_unordered(_train_client, jobs, chunksize=1))


@contextlib.contextmanager
def _one_gpu(cfg, workers: int):
    _init_worker(cfg.to_json(), "cuda")
    yield lambda jobs: [_train_client(job) for job in jobs]


@contextlib.contextmanager
def _ray_pool(cfg, workers: int):
    import ray
    from ray.util import ActorPool

    warnings.filterwarnings("ignore", message="Tip:")  # Ray's note on a future default
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}})
    try:
        actor = ray.remote(num_cpus=1)(_RayWorker)
        pool = ActorPool([actor.remote(cfg.to_json()) for _ in range(workers)])
        yield lambda jobs: list(pool.map_unordered(lambda a, job: a.train.remote(job), jobs))
    finally:
        ray.shutdown()


def floor_rounds(cfg, rounds: int, workers: int, in_ray: bool = False,
                 device: str = "cpu") -> list[dict]:
    data = load_dataset(cfg.dataset)
    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg.model, data.shape, data.num_classes)
    test_x, test_y = to_tensors(data.test_x, data.test_y, data.mean, data.std)
    pool = _one_gpu if device == "cuda" else _ray_pool if in_ray else _process_pool
    with pool(cfg, workers) as train_all:
        rows = []
        for server_round in range(1, rounds + 1):
            started = time.perf_counter()
            state = {k: v.clone() for k, v in model.state_dict().items()}
            jobs = [(c, state, server_round) for c in range(int(cfg.num_clients))]
            results = train_all(jobs)
            total = sum(n for _, n in results)
            average = {k: sum(s[k].astype(np.float64) * n / total for s, n in results)
                       for k in results[0][0]}
            model.load_state_dict({k: torch.as_tensor(v, dtype=state[k].dtype)
                                   for k, v in average.items()})
            trained = time.perf_counter()
            _, accuracy, _ = evaluate(model, test_x, test_y, cfg.eval_batch_size,
                                      data.num_classes)
            done = time.perf_counter()
            rows.append({"round": server_round, "train_seconds": trained - started,
                         "seconds": done - started, "test_accuracy": accuracy})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--ray-floor", action="store_true",
                        help="also run the floor's workers as Ray actors")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--client-gpus", type=float, default=0.25,
                        help="with --device cuda: each driftfl client's share of the GPU")
    args = parser.parse_args()
    workers = os.cpu_count() or 1  # driftfl's Ray actors: one per core at client_cpus=1
    on_gpu = ["device=cuda", f"simulation.client_gpus={args.client_gpus}"]
    if args.device == "cuda":
        workers = 1  # the floor: one process on the GPU

    print(f"driftfl overhead: Fashion-MNIST, {args.clients} clients all training, Dirichlet(0.5), "
          f"1 local epoch, {args.rounds} rounds, " + (
              f"{args.device}, driftfl's clients at client_gpus={args.client_gpus}, the floor in "
              "one process" if args.device == "cuda" else
              f"{workers} cores / actors / floor workers"))
    print(f"{'model':<6} {'driftfl round':>14} {'floor round':>12} {'ratio':>6}   "
          f"{'driftfl train':>14} {'floor train':>12} {'ratio':>6}   {'acc driftfl/floor':>18}")
    results = {}
    for name in args.models.split(","):
        overrides = [f"model={name}", f"num_clients={args.clients}", "fraction=1.0",
                     "local_epochs=1", f"rounds={args.rounds}", "seed=0",
                     *(on_gpu if args.device == "cuda" else [])]
        cfg = compose(overrides)
        ours = driftfl_rounds(overrides)
        floor = floor_rounds(cfg, args.rounds, workers, device=args.device)
        if args.ray_floor:
            in_ray = floor_rounds(cfg, args.rounds, workers, in_ray=True)
            print(f"{name:<6} floor in Ray actors: round {steady(in_ray, 'seconds'):.2f} s, train "
                  f"{steady(in_ray, 'train_seconds'):.2f} s "
                  f"({steady(in_ray, 'train_seconds') / steady(floor, 'train_seconds'):.2f}x "
                  "the floor's process pool)")
        row = {"driftfl_round": steady(ours, "seconds"), "floor_round": steady(floor, "seconds"),
               "driftfl_train": steady(ours, "train_seconds"),
               "floor_train": steady(floor, "train_seconds")}
        results[name] = row
        print(f"{name:<6} {row['driftfl_round']:>12.2f} s {row['floor_round']:>10.2f} s "
              f"{row['driftfl_round'] / row['floor_round']:>5.2f}x   "
              f"{row['driftfl_train']:>12.2f} s {row['floor_train']:>10.2f} s "
              f"{row['driftfl_train'] / row['floor_train']:>5.2f}x   "
              f"{100 * ours[-1]['test_accuracy']:>8.2f}/{100 * floor[-1]['test_accuracy']:.2f}%")
    if "mlp" in results:
        r = results["mlp"]
        print(f"fixed cost per round (mlp, driftfl - floor): "
              f"{r['driftfl_round'] - r['floor_round']:.2f} s")


if __name__ == "__main__":
    main()
