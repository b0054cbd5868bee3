"""What a sweep's shared start-up saves: three one-round jobs as one `driftfl run -m` (one
SuperLink and one Ray for all, driftfl.host) against the same three as separate `driftfl run`s,
alternating, on the quick setting (the MLP, 4 clients, 4,000 Fashion-MNIST images). Prints each
side's wall time, the start-up each job's summary.json records, and the ratio of the medians.

    .venv/bin/python benchmarks/sweep_startup.py              # 2 repeats, about 6 min quiet
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUICK = ["model=mlp", "dataset.subset=4000", "dataset.test_subset=2000", "num_clients=4",
         "rounds=1", "lr=0.05"]
SEEDS = (0, 1, 2)
DRIFTFL = str(Path(sys.executable).parent / "driftfl")


def timed(args: list[str], cwd: Path) -> float:
    started = time.monotonic()
    out = subprocess.run([DRIFTFL, "run", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"driftfl run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return time.monotonic() - started


def startups(run_dirs: list[Path]) -> list[float]:
    return [json.loads((d / "summary.json").read_text())["startup_seconds"] for d in run_dirs]


def separate(scratch: Path) -> tuple[float, list[float]]:
    dirs = [scratch / f"alone{seed}" for seed in SEEDS]
    wall = sum(timed([*QUICK, f"seed={seed}", f"hydra.run.dir={d}"], scratch)
               for seed, d in zip(SEEDS, dirs))
    return wall, startups(dirs)


def swept(scratch: Path) -> tuple[float, list[float]]:
    sweep = scratch / "sweep"
    wall = timed(["-m", *QUICK, f"seed={','.join(map(str, SEEDS))}",
                  f"hydra.sweep.dir={sweep}"], scratch)
    return wall, startups([sweep / str(i) for i in range(len(SEEDS))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    repeats = parser.parse_args().repeats
    walls: dict[str, list[float]] = {"separate": [], "sweep": []}
    ups: dict[str, list[float]] = {"separate": [], "sweep": []}
    for repeat in range(repeats):
        for name, measure in (("separate", separate), ("sweep", swept)):
            with tempfile.TemporaryDirectory() as tmp:
                wall, startup = measure(Path(tmp))
            walls[name].append(wall)
            ups[name] += startup
            print(f"repeat {repeat}: {name:8s} {wall:6.1f} s for {len(SEEDS)} jobs; start-up "
                  f"per job {', '.join(f'{s:.1f}' for s in startup)} s", flush=True)
    med = {name: statistics.median(v) for name, v in walls.items()}
    print(f"\nthree one-round jobs: separate runs {med['separate']:.1f} s, one sweep "
          f"{med['sweep']:.1f} s: sweep / separate = {med['sweep'] / med['separate']:.2f}x")
    print(f"start-up per job (median): separate {statistics.median(ups['separate']):.1f} s, "
          f"in the sweep {statistics.median(ups['sweep']):.1f} s (the first job starts Ray)")


if __name__ == "__main__":
    main()
