"""What a quick `driftfl run` costs around its training: start-up, the app bundle, shutdown.

A quick job (the MLP on 4,000 Fashion-MNIST images, 4 clients, 2 rounds: the test suite's
every-method sweep runs 17 of them) trains for a few seconds; the rest is processes starting
(SuperLink, `flwr run`, the ServerApp, Ray and its actors) and stopping. Run on a quiet machine,
it prints per repeat and as medians: the command's wall time, the CPU seconds the whole machine
spent meanwhile (from /proc/stat, so every process the run started counts), the seconds from
the run's closing results line to the command's exit, and the rounds' own time. It also times
what `flwr run` reads to build the app bundle: the repository folder (a .venv inside it too)
against the copy driftfl hands it (driftfl.launch.app_bundle).

    .venv/bin/python benchmarks/run_startup.py              # 3 repeats, about 1.5 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from driftfl.host import APP_DIR  # noqa: E402
from driftfl.launch import app_bundle  # noqa: E402
from driftfl.server.console import RESULTS  # noqa: E402

QUICK = ["model=mlp", "dataset.subset=4000", "dataset.test_subset=2000", "num_clients=4",
         "rounds=2", "lr=0.05"]


def busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def one_run(scratch: Path) -> dict:
    run_dir = scratch / "run"
    cpu, started = busy_seconds(), time.monotonic()
    with subprocess.Popen([str(Path(sys.executable).parent / "driftfl"), "run", *QUICK,
                           f"hydra.run.dir={run_dir}"], cwd=scratch, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as run:
        results_at, lines = None, []
        for line in run.stdout:
            lines.append(line)
            if line.startswith(RESULTS):
                results_at = time.monotonic()
    ended = time.monotonic()
    if run.returncode or results_at is None:
        sys.exit("driftfl run failed:\n" + "".join(lines[-30:]))
    return {"wall": ended - started, "cpu": busy_seconds() - cpu,
            "after_results": ended - results_at,
            "rounds": json.loads((run_dir / "summary.json").read_text())["seconds"]}


def bundle_reading() -> tuple[float, int, float, int]:
    """Seconds and files of Flower's own walk over the app folder, then over driftfl's copy."""
    from flwr.cli.utils import collect_files

    started = time.perf_counter()
    walked = collect_files(APP_DIR)
    whole = time.perf_counter() - started
    started = time.perf_counter()
    with app_bundle() as copy:
        copied = collect_files(copy)
    return whole, len(walked), time.perf_counter() - started, len(copied)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"a quick driftfl run ({' '.join(QUICK)}), {os.cpu_count()} cores")
    print(f"{'repeat':<7} {'wall':>7} {'CPU':>7} {'results->exit':>14} {'rounds':>7}")
    rows = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            row = one_run(Path(scratch))
        rows.append(row)
        print(f"{repeat + 1:<7} {row['wall']:>5.1f} s {row['cpu']:>5.1f} s "
              f"{row['after_results']:>12.1f} s {row['rounds']:>5.1f} s")
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"{'median':<7} {median['wall']:>5.1f} s {median['cpu']:>5.1f} s "
          f"{median['after_results']:>12.1f} s {median['rounds']:>5.1f} s")
    whole, walked, copy, copied = bundle_reading()
    print(f"flwr's walk to build the app bundle: {whole:.2f} s over {walked} files in {APP_DIR}; "
          f"{copy:.2f} s over the {copied} files of driftfl's copy (copying included)")


if __name__ == "__main__":
    main()
