"""What one hostile client inside SecAgg+ can still do: real `driftfl run`s in simulation with
secagg=secaggplus, honest and with one client of --clients attacking from inside its masked
vector in every round (benchmarks/hostile/sitecustomize.py), side by side: final and best test
accuracy, the rounds that released an update, the replies rejected, the run's status.

    PYTHONPATH=. .venv/bin/python benchmarks/secagg_attack.py [--rounds 5] [--clients 5]
        [--attacks scale:-20 scale:-1e4 sign forge] [overrides ...]

Overrides pass on to every run (e.g. privacy=distributed privacy.noise_multiplier=0.02).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(overrides: list[str], attack: str | None) -> tuple[list[dict], dict]:
    """The rounds and the summary of a `driftfl run` with these overrides under ``attack``."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ)
        if attack:
            env.update(DRIFTFL_BENCH_ATTACK=attack, DRIFTFL_BENCH_ATTACK_DIR=tmp,
                       PYTHONPATH=os.pathsep.join(filter(None, [
                           str(REPO / "benchmarks" / "hostile"), env.get("PYTHONPATH")])))
        out = subprocess.run([sys.executable, "-m", "driftfl.cli", "run", *overrides,
                              f"hydra.run.dir={run_dir}"], cwd=tmp, env=env,
                             capture_output=True, text=True)
        if not (run_dir / "summary.json").is_file():  # a run that failed still has one
            sys.exit(f"driftfl run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        if attack and not (Path(tmp) / "attacker").is_file():
            sys.exit("the attack never ran (is benchmarks/hostile on the workers' path?)")
        rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
        summary = json.loads((run_dir / "summary.json").read_text())
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--subset", type=int, default=4000)
    parser.add_argument("--attacks", nargs="+", default=["scale:-20", "scale:-1e4", "sign",
                                                         "forge"])
    args, extra = parser.parse_known_args()
    overrides = ["secagg=secaggplus", "model=mlp", f"dataset.subset={args.subset}",
                 f"num_clients={args.clients}", f"rounds={args.rounds}", *extra]
    print(" ".join(overrides) + f"; one attacker of {args.clients}, every round")
    print(f"{'attack':>12} {'final acc':>10} {'best acc':>9} {'released':>9} {'rejected':>9}"
          "  status; last round's SecAgg+ outcome")
    for attack in [None, *args.attacks]:
        rows, summary = run(overrides, attack)
        trained = [r for r in rows if r["round"] > 0]
        accuracies = [r["test_accuracy"] for r in rows]
        released = sum(r["model_updated"] for r in trained)
        rejected = sum(r["rejected"] for r in trained)
        print(f"{attack or 'honest':>12} {100 * accuracies[-1]:>9.1f}% "
              f"{100 * max(accuracies):>8.1f}% {released:>5}/{len(trained)} {rejected:>9}  "
              f"{summary['status']}; {trained[-1].get('secagg_outcome', '') or '-'}",
              flush=True)


if __name__ == "__main__":
    main()
