"""Several `driftfl run`s side by side on one machine, as a sweep with joblib or a busy shared
machine starts them: each must complete on a Ray instance of its own, none joining, stopping or
crashing another's.

Each repetition starts ``--runs`` small runs at once (methods and seeds differ, each its own
hydra.run.dir under a scratch folder in /tmp) and waits for all of them; a run counts as
completed when it exits 0 and its summary.json says ``completed``. It prints one line per
repetition, then how many of how many completed, the wall time and how many consoles showed a
Ray crash line. The consoles of the runs that did not complete or showed a crash line are kept
(with the run directories of the former), and their paths printed.

    .venv/bin/python benchmarks/concurrent_runs.py       # 4 runs x 10: about 28 min on 2 cores
    .venv/bin/python benchmarks/concurrent_runs.py --runs 2 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=1000", "num_clients=4",
         "rounds=2"]
METHODS = ["fedavg", "scaffold", "fedprox", "moon"]
CRASH_LINE = "driftfl: a Ray process crashed"


def start(run_dir: Path, method: str, seed: int) -> subprocess.Popen:
    """`driftfl run` of this checkout (PYTHONPATH first), its console to run_dir.txt."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    console = open(f"{run_dir}.txt", "w")
    return subprocess.Popen([sys.executable, "-m", "driftfl.cli", "run", *SMALL,
                             f"strategy={method}", f"seed={seed}", f"hydra.run.dir={run_dir}"],
                            cwd=run_dir.parent, env=env, stdout=console,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def completed(run_dir: Path, code: int) -> bool:
    summary = run_dir / "summary.json"
    return code == 0 and summary.is_file() and \
        json.loads(summary.read_text()).get("status") == "completed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs started at once")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="driftfl-concurrent-", dir="/tmp"))
    done, crashes, kept = 0, 0, []
    began = time.monotonic()
    for repeat in range(args.repeats):
        started = time.monotonic()
        runs = []
        for k in range(args.runs):
            run_dir = scratch / f"r{repeat}-{k}"
            method = METHODS[(repeat + k) % len(METHODS)]
            runs.append((run_dir, method, start(run_dir, method, seed=repeat)))
        results = []
        for run_dir, method, process in runs:
            ok = completed(run_dir, process.wait())
            crashed = CRASH_LINE in Path(f"{run_dir}.txt").read_text()
            done += ok
            crashes += crashed
            results.append(f"{method} {'ok' if ok else f'FAILED (rc {process.returncode})'}"
                           + (" (Ray crash line)" if crashed else ""))
            if ok:
                shutil.rmtree(run_dir, ignore_errors=True)
            if not ok or crashed:
                kept.append(f"{run_dir}.txt")
            else:
                Path(f"{run_dir}.txt").unlink()
        print(f"repetition {repeat + 1}/{args.repeats}: {', '.join(results)} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    wall = time.monotonic() - began
    total = args.runs * args.repeats
    print(f"completed: {done} of {total} runs ({args.runs} at a time x {args.repeats}), rc 0 "
          f"and status completed; wall time {wall / 60:.1f} min")
    print(f"consoles with a Ray crash line: {crashes}")
    if kept:
        print("kept for inspection:", *kept, sep="\n  ")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(0 if done == total else 1)


if __name__ == "__main__":
    main()
