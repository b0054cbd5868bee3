"""How long `driftfl run` takes to refuse a bad value of a setting (rounds=-1, lr=abc) or a pair
of parts that cannot run together (strategy=scaffold strategy.objective=ce).

Each bad value below is refused by a real `driftfl run` process (nothing is written); the
script prints the median wall time of ``--repeats`` refusals per value, whether each is under
the 1 s a user should wait, and for comparison a typo of a key (refused by Hydra's composition
alone) and what importing torch and Flower costs, which the refusal no longer waits for:
driftfl/common/experiment_settings.py checks every setting outside the server sections without
them, and driftfl.methods the server sections and the pairs against the methods' and parts'
declarations (driftfl/specs/), torch-free too. A busy machine stretches every figure alike:
compare the rows.

    .venv/bin/python benchmarks/bad_value_refusal.py               # 5 repeats, about 15 s
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

BAD_VALUES = [["rounds=-1"], ["lr=abc"], ["privacy=central", "privacy.clip=0"],
              ["partition.alpha=0"], ["strategy=fedprox", "strategy.mu=-1"],
              ["strategy=scaffold", "strategy.objective=ce"],
              ["secagg=secaggplus", "strategy=fedcsd"]]
TYPO = ["roundz=3"]  # the floor: Hydra's composition and nothing else
LIMIT = 1.0  # seconds


def timed(command: list[str], cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - started, out


def median_refusal(driftfl: str, args: list[str], cwd: str, repeats: int) -> tuple[float, str]:
    runs = [timed([driftfl, "run", *args], cwd) for _ in range(repeats)]
    out = runs[-1][1]
    if out.returncode != 2 or any(Path(cwd).iterdir()):
        sys.exit(f"driftfl run {' '.join(args)} was not refused: {out.stderr}")
    return statistics.median(seconds for seconds, _ in runs), out.stderr.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    driftfl = str(Path(sys.executable).parent / "driftfl")
    print(f"median of {args.repeats} refusals each, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as scratch:
        for bad in [*BAD_VALUES, TYPO]:
            median, said = median_refusal(driftfl, bad, scratch, args.repeats)
            verdict = "under" if median < LIMIT else "OVER"
            kind = "typo " if bad is TYPO else "value"
            print(f"{kind} {' '.join(bad):<40} {median:5.2f} s  {verdict} {LIMIT:g} s  ({said})")
        imports = statistics.median(timed([sys.executable, "-c", "import torch, flwr"],
                                          scratch)[0] for _ in range(args.repeats))
        print(f"for comparison, `import torch, flwr` alone: {imports:.2f} s")


if __name__ == "__main__":
    main()
