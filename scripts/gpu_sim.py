"""driftfl's Ray simulation on a GPU machine that has PyTorch but no Flower, Ray or Hydra and
cannot fetch anything: the prepared device check of docs/benchmarks.md ("GPU paths").

Here, where PyPI answers (once):

    .venv/bin/python scripts/gpu_sim.py prepare

downloads, for the GPU machine's Python (3.12, manylinux x86-64), the wheels driftfl needs that
that machine lacks, at the versions installed here, and packs them with Fashion-MNIST's four
files into carries under .gpu/ (ignored by git), each small enough to travel with the working
tree in one device call (a file too large for one, Ray's wheel, goes in parts). It prints the
device calls to make, one per carry, in a row on the warm machine:

    python3 scripts/gpu_sim.py stage .gpu/carry1                        (every carry but the last)
    python3 scripts/gpu_sim.py check --stage .gpu/carry3 --out $OUT      (the last)

`stage` keeps a carry's files in /tmp/driftfl-gpu, which the warm machine keeps between calls.
`check` stages the last carry, joins the parts, installs the wheels into /tmp/driftfl-gpu/site
and runs, writing gpu-sim.json and gpu-sim.log under --out:

1. scripts/gpu_check.py: every objective, model and condensation, the GPU against the CPU;
2. `driftfl run device=cuda` in Ray simulation, the main job and FedCSD, FedSSD and DCFL, 3
   rounds each, at simulation.client_gpus 0.5 and 0.25: status, accuracy, seconds per round;
3. benchmarks/overhead.py: a CNN round of driftfl against the plain-PyTorch floor on the GPU.

Anywhere, `check --device cpu --quick` runs the same plan on the CPU with small data,
client_gpus 0 and the main job alone in step 2 (each method's step is the same command with its
overrides, which the test suite's every-method sweep runs on the CPU; tests/tools/test_gpu_sim.py
runs it). Exits 1 when a step fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE = Path("/tmp/driftfl-gpu")
CARRY_MIB = 48  # a call carries 64 MiB with the working tree (11 MiB): room to spare
FMNIST = Path("/usr/share/datasets/fashion-mnist")
# what driftfl needs (pyproject.toml) beyond PyTorch; pip resolves the rest for Python 3.12
NEEDS = ["flwr[simulation]", "flwr-datasets", "hydra-core", "hydra-joblib-launcher", "pydantic",
         "psutil", "cryptography", "dp-accounting", "threadpoolctl"]
BUILT_HERE = ["antlr4-python3-runtime"]  # hydra's parser: PyPI has no wheel, it is pure Python
# the GPU machine's own builds (KINDS.md's package list), never to be shadowed by carried ones
ON_DEVICE = ("numpy", "scipy", "pandas", "pyarrow", "pillow", "matplotlib", "torch",
             "torchvision", "triton", "sympy", "networkx", "nvidia_", "cuda_")
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
PART = ".part"
METHODS = {"main job": [], "fedcsd": ["strategy=fedcsd"], "fedssd": ["strategy=fedssd"],
           "dcfl": ["strategy=dcfl", "strategy.condense_iterations=50"]}
QUICK = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=500", "num_clients=4",
         "rounds=2"]


def pinned(name: str) -> str:
    base = name.split("[")[0]
    return f"{name}=={importlib.metadata.version(base)}"


def pack(files: list[Path], dest: Path, limit: int) -> list[Path]:
    """``files`` into folders dest/carry1, carry2, ... of at most ``limit`` bytes each, a file
    larger than ``limit`` in parts (name.part00, ...), largest first into the first that fits."""
    pieces: list[tuple[str, bytes | Path, int]] = []
    for path in files:
        size = path.stat().st_size
        if size <= limit:
            pieces.append((path.name, path, size))
            continue
        data = path.read_bytes()
        for i, start in enumerate(range(0, size, limit)):
            chunk = data[start:start + limit]
            pieces.append((f"{path.name}{PART}{i:02d}", chunk, len(chunk)))
    carries: list[list[tuple[str, bytes | Path, int]]] = []
    for piece in sorted(pieces, key=lambda p: -p[2]):
        home = next((c for c in carries if sum(p[2] for p in c) + piece[2] <= limit), None)
        if home is None:
            carries.append(home := [])
        home.append(piece)
    folders = []
    for k, carry in enumerate(carries, 1):
        folder = dest / f"carry{k}"
        folder.mkdir(parents=True)
        for name, content, _ in carry:
            if isinstance(content, Path):
                shutil.copyfile(content, folder / name)
            else:
                (folder / name).write_bytes(content)
        folders.append(folder)
    return folders


def join_parts(folder: Path) -> None:
    """Each name.part00, part01, ... in ``folder`` back into name."""
    for first in sorted(folder.glob(f"*{PART}00")):
        name = first.name[:-len(PART) - 2]
        parts = sorted(folder.glob(f"{name}{PART}[0-9][0-9]"))
        with open(folder / name, "wb") as whole:
            for part in parts:
                whole.write(part.read_bytes())
                part.unlink()


def prepare(dest: Path, limit: int) -> int:
    if dest.exists():
        shutil.rmtree(dest)
    wheels = dest / "wheels"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels),
                    *map(pinned, BUILT_HERE)], check=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "--find-links", str(wheels),
                    "-d", str(wheels), *map(pinned, NEEDS)], check=True)
    carried = [w for w in sorted(wheels.glob("*.whl"))
               if not w.name.lower().startswith(ON_DEVICE)]
    data = sorted(FMNIST.glob("*.gz"))
    if len(data) != 4:
        sys.exit(f"Fashion-MNIST's four files are not in {FMNIST}: "
                 "sudo apt-get install -y dataset-fashion-mnist")
    folders = pack(carried + data, dest, limit)
    shutil.rmtree(wheels)
    total = sum(f.stat().st_size for c in folders for f in c.iterdir())
    print(f"gpu_sim: {len(carried)} wheels and Fashion-MNIST, {total / 2**20:.0f} MiB in "
          f"{len(folders)} carries under {dest}; on the GPU machine, one call each, in a row:")
    for folder in folders[:-1]:
        print(f"  carry={folder.relative_to(REPO)}: python3 scripts/gpu_sim.py stage "
              f"{folder.relative_to(REPO)}")
    print(f"  carry={folders[-1].relative_to(REPO)}: python3 scripts/gpu_sim.py check "
          f"--stage {folders[-1].relative_to(REPO)} --out $OUT")
    return 0


def stage(carry: Path) -> None:
    STAGE.mkdir(parents=True, exist_ok=True)
    for path in carry.iterdir():
        shutil.copyfile(path, STAGE / path.name)
    print(f"gpu_sim: {carry} staged in {STAGE} ({len(list(STAGE.iterdir()))} files)")


def install() -> dict[str, str]:
    """The staged wheels installed into STAGE/site and the data in place: the environment the
    steps run in."""
    join_parts(STAGE)
    site, data = STAGE / "site", STAGE / "data" / "fashion-mnist"
    data.mkdir(parents=True, exist_ok=True)
    for gz in STAGE.glob("*.gz"):
        shutil.copyfile(gz, data / gz.name)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                    *map(str, sorted(STAGE.glob("*.whl")))], check=True)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
            "PATH": os.pathsep.join([str(site / "bin"), os.environ["PATH"]]),
            "DRIFTFL_DATA": str(STAGE / "data")}


def step(log, name: str, command: list[str], env: dict, timeout: int) -> dict:
    started = time.monotonic()
    try:
        out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=timeout)
        rc, text = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as late:
        rc, text = "timeout", f"{late.stdout or ''}{late.stderr or ''}"
        text = text.decode() if isinstance(text, bytes) else text
    seconds = time.monotonic() - started
    log.write(f"\n===== {name}: rc {rc}, {seconds:.1f} s\n{text}\n")
    log.flush()
    print(f"gpu_sim: {name}: {'ok' if rc == 0 else f'FAILED (rc {rc})'}, {seconds:.1f} s",
          flush=True)
    return {"step": name, "rc": rc, "seconds": round(seconds, 1), "tail": text[-600:]}


def run_result(run_dir: Path) -> dict:
    """A run's status, final accuracy and seconds per round (the median of rounds 2..R, round 1
    holding Ray's start)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return {"status": "no summary"}
    trained = [r["seconds"] for r in rounds if r["round"] > 1]
    return {"status": summary["status"], "final_accuracy": summary["final_accuracy"],
            "seconds_per_round": round(statistics.median(trained), 2) if trained else None}


def floor_ratio(printed: str) -> dict:
    """overhead.py's row: driftfl's steady round and the floor's, seconds, and their ratio."""
    row = re.search(r"^(cnn|mlp)\s+([\d.]+) s\s+([\d.]+) s\s+([\d.]+)x", printed, re.M)
    if row is None:
        return {}
    return {"model": row[1], "driftfl_round": float(row[2]), "floor_round": float(row[3]),
            "ratio": float(row[4])}


def check(device: str, out: Path, quick: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PYTHONUNBUFFERED": "1"}
    if device == "cuda":
        env.update(install())
    python = sys.executable
    shares = [0.5, 0.25] if device == "cuda" else [0.0]
    small = QUICK if quick else ["rounds=3"]
    steps = []
    with open(out / "gpu-sim.log", "w") as log:
        steps.append(step(log, "gpu_check", [python, "scripts/gpu_check.py", "--device", device],
                          env, 300))
        methods = {"main job": METHODS["main job"]} if quick else METHODS
        for method, overrides in methods.items():
            for share in shares:
                run_dir = out / "runs" / f"{method.replace(' ', '-')}-{share}"
                done = step(log, f"driftfl run {method}, client_gpus {share}",
                            [python, "-m", "driftfl.cli", "run", *overrides, *small,
                             f"device={device}", f"simulation.client_gpus={share}",
                             f"hydra.run.dir={run_dir}"], env, 240)
                done.update(run_result(run_dir))
                if done["rc"] == 0 and done["status"] != "completed":
                    done["rc"] = f"status {done['status']}"
                steps.append(done)
        overhead = ["--models", "mlp", "--rounds", "2", "--clients", "4"] if quick else [
            "--models", "cnn", "--rounds", "4"]
        steps.append(step(log, "overhead against the floor",
                          [python, "benchmarks/overhead.py", *overhead, "--device", device,
                           "--client-gpus", str(shares[-1])], env, 300))
        steps[-1].update(floor_ratio(steps[-1]["tail"]))
    import torch

    report = {"device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
              "torch": torch.__version__, "steps": steps}
    (out / "gpu-sim.json").write_text(json.dumps(report, indent=2))
    failed = [s["step"] for s in steps if s["rc"] != 0]
    print(f"gpu_sim: {len(steps) - len(failed)} of {len(steps)} steps passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    made = verbs.add_parser("prepare", help="here: the wheels and data, packed into carries")
    made.add_argument("--dest", type=Path, default=REPO / ".gpu")
    made.add_argument("--carry-mib", type=int, default=CARRY_MIB)
    verbs.add_parser("stage", help="there: keep one carry's files").add_argument("carry",
                                                                                 type=Path)
    checked = verbs.add_parser("check", help="there: install, then run the checks")
    checked.add_argument("--stage", type=Path, help="the last carry, staged first")
    checked.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    checked.add_argument("--out", type=Path, required=True)
    checked.add_argument("--quick", action="store_true", help="small data (the CPU test)")
    args = parser.parse_args(argv)
    if args.verb == "prepare":
        return prepare(args.dest, args.carry_mib * 2**20)
    if args.verb == "stage":
        stage(args.carry)
        return 0
    if args.stage:
        stage(args.stage)
    return check(args.device, args.out, args.quick)


if __name__ == "__main__":
    sys.exit(main())
