"""How driftfl's simulation scales with the client count, side by side in one invocation.

For each client count it runs the same `driftfl run` (FedAvg, the mlp, full Fashion-MNIST, IID,
10 clients training per round) and reports:

- start-up: from the command's start to the round-0 line (the SuperLink and Ray started, the
  dataset loaded, the clients partitioned and surveyed, the initial model tested), i.e. until
  the first round can start training;
- steady round: median `seconds` over rounds 2..R of metrics.csv;
- peak memory: the largest sum of RSS over the whole process tree (driftfl, the SuperLink,
  flwr-simulation, Ray and its workers), sampled every 0.25 s.

    .venv/bin/python benchmarks/scale.py                          # 10, 100, 1000, 10000 clients
    .venv/bin/python benchmarks/scale.py --sizes 10,100 --rounds 3
    .venv/bin/python benchmarks/scale.py --checkout /tmp/old      # another checkout's code

``--checkout`` runs the code of another checkout of driftfl (e.g. ``git worktree add /tmp/old
<commit>``) with this environment, to measure before and after a change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def tree_rss(root: psutil.Process) -> int:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(clients: int, rounds: int, checkout: Path, extra: list[str]) -> dict:
    fraction = 10 / clients
    overrides = [f"num_clients={clients}", f"fraction={fraction:.10g}", "partition=iid",
                 "model=mlp", f"rounds={rounds}", *extra]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "driftfl.cli", "run", *overrides, f"hydra.run.dir={run_dir}"],
            cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak, done = [0], threading.Event()

        def sample() -> None:
            root = psutil.Process(proc.pid)
            while not done.is_set():
                peak[0] = max(peak[0], tree_rss(root))
                time.sleep(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        startup, tail = None, []
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            if startup is None and line.startswith("round   0/"):
                startup = time.monotonic() - started
        proc.wait()
        done.set()
        sampler.join()
        if proc.returncode:
            sys.exit(f"driftfl run with {clients} clients failed:\n{''.join(tail)}")
        rows = [r for r in json.loads((run_dir / "metrics.json").read_text())["rounds"]
                if r["round"] > 0]
    return {"clients": clients, "startup_s": startup,
            "steady_round_s": statistics.median(r["seconds"] for r in rows[1:]),
            "total_s": time.monotonic() - started, "peak_rss_gb": peak[0] / 2**30,
            "final_accuracy": rows[-1]["test_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkout", type=Path, default=REPO, help="driftfl code to run")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="further driftfl overrides")
    args = parser.parse_args()
    results = []
    print(f"{'clients':>8} {'start-up':>10} {'steady round':>13} {'peak memory':>12} "
          f"{'accuracy':>9}   (code: {args.checkout})", flush=True)
    for clients in map(int, args.sizes.split(",")):
        r = measure(clients, args.rounds, args.checkout.resolve(), args.overrides)
        results.append(r)
        print(f"{clients:>8} {r['startup_s']:>8.1f} s {r['steady_round_s']:>11.2f} s "
              f"{r['peak_rss_gb']:>9.2f} GB {100 * r['final_accuracy']:>8.2f}%", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
