"""How long `driftfl run` takes to refuse an unknown or misplaced setting.

Each typo below is refused by a real `driftfl run` process (nothing is written); the script
prints the median wall time of ``--repeats`` refusals per typo, whether each is under the
3 s a user should wait, and for comparison what importing torch and Flower costs (what the
refusal no longer waits for: driftfl/common/composing.py checks the keys with Hydra alone).

    .venv/bin/python benchmarks/typo_refusal.py               # 5 repeats, about 10 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TYPOS = [["roundz=3"], ["strategy.mu=0.1"], ["partition.alphaa=1"],
         ["strategy=fedavg", "strategy.mu=0.1"]]
LIMIT = 3.0  # seconds


def timed(command: list[str], cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    driftfl = str(Path(sys.executable).parent / "driftfl")
    print(f"median of {args.repeats} refusals each, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as scratch:
        for typo in TYPOS:
            runs = [timed([driftfl, "run", *typo], scratch) for _ in range(args.repeats)]
            out = runs[-1][1]
            if out.returncode != 2 or any(Path(scratch).iterdir()):
                sys.exit(f"driftfl run {' '.join(typo)} was not refused: {out.stderr}")
            median = statistics.median(seconds for seconds, _ in runs)
            verdict = "under" if median < LIMIT else "OVER"
            print(f"{' '.join(typo):<34} {median:5.2f} s  {verdict} {LIMIT:g} s  "
                  f"({out.stderr.strip()})")
        imports = statistics.median(timed([sys.executable, "-c", "import torch, flwr"],
                                          scratch)[0] for _ in range(args.repeats))
        print(f"for comparison, `import torch, flwr` alone: {imports:.2f} s")


if __name__ == "__main__":
    main()
