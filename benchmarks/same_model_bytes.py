"""Train every method once with a fixed seed and print the SHA-256 of each final model.pt.

Run it on two checkouts (before and after a change that must not alter training) and compare:

    .venv/bin/python benchmarks/same_model_bytes.py --checkout /tmp/before --out before.json
    .venv/bin/python benchmarks/same_model_bytes.py --out after.json --compare before.json

Each case is a real `driftfl run` (local simulation, 4 clients, 3 of them sampled per round,
3 rounds, the MLP on 2,000 Fashion-MNIST images) started from the checkout's own source tree,
so the code under test is the checkout's, whatever the environment has installed. Exit 1 when
a compared case differs. ``--portable`` runs with ATen's default kernels, MKL's conditional
numerical reproducibility and oneDNN held to SSE4.1, for bytes that do not depend on the CPU (to compare two machines;
tests/e2e/test_e2e_reference.py pins two cases so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICK = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=500", "num_clients=4",
         "fraction=0.75", "rounds=3", "seed=3"]

# One case per method, plus the variants that take other code paths. Not SecAgg+: Flower's
# quantisation rounds stochastically with NumPy's global generator, so two SecAgg+ runs of one
# checkout end in different bytes (measured at 0c4ce37 and at d1eabaf); that its sum is the plain
# mean within the quantisation error is tests/server/test_secagg.py's to show.
CASES = {
    "fedavg": ["strategy=fedavg"],
    "fedprox": ["strategy=fedprox"],
    "fedavgm": ["strategy=fedavgm"],
    "fednova": ["strategy=fednova"],
    "fedcsd": ["strategy=fedcsd"],
    "fedcsd-previous": ["strategy=fedcsd", "strategy.prototypes=previous"],
    "fedcsd-base": ["+experiment=fedcsd_base"],
    "fedcsd-forcible": ["+experiment=fedcsd_forcible"],
    "fedlsd": ["strategy=fedlsd"],
    "fedntd": ["strategy=fedntd"],
    "fedgkd": ["strategy=fedgkd"],
    "fedssd": ["strategy=fedssd"],
    "fedssd-identity": ["strategy=fedssd", "strategy.psi=identity"],
    "fedssd-mse": ["+experiment=fedssd_mse"],
    "fedssd-kl": ["+experiment=fedssd_kl"],
    "fedcad": ["strategy=fedcad"],
    "fedcad-aux": ["strategy=fedcad", "strategy.alpha_source=aux"],
    "scaffold": ["strategy=scaffold"],
    "feddyn": ["strategy=feddyn"],
    "moon": ["strategy=moon"],
    "fedproto": ["strategy=fedproto"],
    "fedcurv": ["strategy=fedcurv"],
    "fedavg-median": ["strategy=fedavg", "aggregation=median"],
    "feddisco": ["strategy=feddisco"],
    "dcfl": ["strategy=dcfl", "strategy.condense_iterations=20"],
    "dcfl-fednova-prox": ["strategy=dcfl", "aggregation=fednova", "strategy.objective=prox",
                          "strategy.condense_iterations=20"],
}


PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
            "ONEDNN_MAX_CPU_ISA": "SSE41"}


def run_case(checkout: Path, overrides: list[str], run_dir: Path, cache: Path,
             portable: bool = False) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout), "DRIFTFL_CACHE": str(cache),
           "DRIFTFL_HOME": str(cache / "home"), **(PORTABLE if portable else {})}
    out = subprocess.run([sys.executable, "-m", "driftfl.cli", "run", *overrides, *QUICK,
                          f"hydra.run.dir={run_dir}"], cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=900)
    model = run_dir / "model.pt"
    if out.returncode or not model.is_file():
        raise SystemExit(f"{' '.join(overrides)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return hashlib.sha256(model.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--out", type=Path, help="write {case: sha256} here")
    parser.add_argument("--compare", type=Path, help="a file written by --out to compare with")
    parser.add_argument("--only", help="comma-separated cases (default: all)")
    parser.add_argument("--portable", action="store_true",
                        help="arithmetic independent of the CPU's vector instructions")
    args = parser.parse_args()
    cases = {k: v for k, v in CASES.items() if not args.only or k in args.only.split(",")}
    expected = json.loads(args.compare.read_text()) if args.compare else {}
    digests, differ = {}, []
    with tempfile.TemporaryDirectory(prefix="same-bytes-") as scratch:
        for name, overrides in cases.items():
            started = time.perf_counter()
            digests[name] = run_case(args.checkout.resolve(), overrides, Path(scratch) / name,
                                     Path(scratch) / "cache", args.portable)
            verdict = ""
            if name in expected:
                same = expected[name] == digests[name]
                verdict = "  identical" if same else "  DIFFERS"
                differ += [] if same else [name]
            print(f"{name:<18} {digests[name][:16]}  {time.perf_counter() - started:5.1f} s"
                  f"{verdict}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(digests, indent=2) + "\n")
    if expected:
        compared = [name for name in digests if name in expected]
        print(f"{len(compared) - len(differ)} of {len(compared)} compared cases give identical "
              f"model bytes" + (f"; {len(digests) - len(compared)} not in {args.compare}"
                                if len(compared) < len(digests) else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
