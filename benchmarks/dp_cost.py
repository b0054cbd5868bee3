"""What differential privacy's own arithmetic costs a round, beside training: the server's
clip-and-noise of m replies (privacy=central), one client's clip-and-noise share
(privacy=distributed), and the accountant's epsilon, against one client's local epoch. Measured
as driftfl's processes run it, NumPy's BLAS on one thread (driftfl/common/blas.py), and the
central release again with BLAS on every core (NumPy's default), side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/dp_cost.py [--model cnn] [--clients 10 50]

Prints seconds (median of 5) and the ratio to a plain FedAvg mean of the same replies.
"""

from __future__ import annotations

import argparse
import statistics
import time

import os

import numpy as np
from flwr.app import Array, ArrayRecord
from threadpoolctl import threadpool_limits

from driftfl.client.privacy import privatise
from driftfl.common.accounting import released_epsilon
from driftfl.common.blas import one_blas_thread
from driftfl.common.config import compose
from driftfl.common.models import build_model
from driftfl.common.privacy import PrivacySettings
from driftfl.methods import check_experiment
from driftfl.strategies.parts.aggregation import Aggregation, ClientUpdate
from driftfl.strategies.parts.release import CentralRelease, RoundFacts


def timed(work, repeats: int = 5) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    args = parser.parse_args()
    cfg = check_experiment(compose([f"model={args.model}"]))
    model = build_model(cfg.model, (1, 28, 28), 10)
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    d = sum(v.size for v in start.values() if v.dtype.kind == "f")
    rng = np.random.default_rng(0)
    print(f"model={args.model}: {d:,} float coordinates")
    one_blas_thread()
    print(f"{'m':>4} {'FedAvg mean s':>14} {'central DP s':>13} {'ratio':>6}   "
          f"{'client share s':>14} {'epsilon s':>10}   {'central DP, BLAS on all cores s':>31}")
    for m in args.clients:
        updates = [ClientUpdate(n, {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype)
                                    if v.dtype.kind == "f" else v for k, v in start.items()},
                                {"num-examples": 100.0, "local-steps": 4.0}, None)
                   for n in range(m)]
        plain = timed(lambda: Aggregation().aggregate(updates, start))
        central = CentralRelease(PrivacySettings(name="central"), num_clients=10 * m,
                                 per_round=m, rate=0.1)
        facts = RoundFacts(start, list(range(m)), {}, "", list(range(10 * m)))
        private = timed(lambda: central.release(1, facts, updates))
        with threadpool_limits(limits=os.cpu_count(), user_api="blas"):
            threaded = timed(lambda: central.release(1, facts, updates))
        received = ArrayRecord({k: Array(v) for k, v in start.items()})
        trained = ArrayRecord({k: Array(v) for k, v in updates[0].arrays.items()})
        share = timed(lambda: privatise(trained, received, PrivacySettings(name="distributed"),
                                        max(1, int(0.8 * m))))
        released_epsilon.cache_clear()
        accounting = timed(lambda: (released_epsilon.cache_clear(),
                                    released_epsilon(((0.1, (1.0,)),) * 100, 1e-5)))
        print(f"{m:>4} {plain:>14.3f} {private:>13.3f} {private / plain:>6.2f}   "
              f"{share:>14.3f} {accounting:>10.3f}   {threaded:>31.3f}")


if __name__ == "__main__":
    main()
