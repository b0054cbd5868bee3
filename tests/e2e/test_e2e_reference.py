"""Same command, same bytes, across versions: small reference runs whose final model.pt is
pinned by its SHA-256, so that a change to any computation a run makes (data loading,
partition, initial model, sampling, local training, aggregation) fails here.

A float's last bits depend on which vector instructions PyTorch's kernels and MKL pick on this
CPU (on this AMD EPYC the AVX-512 and AVX2 paths give different bytes after 3 rounds), so the
reference runs with portable arithmetic: ATen's default kernels, MKL's conditional numerical
reproducibility and oneDNN's convolutions held to SSE4.1, the same bytes whatever the CPU's
vector instructions (MKL's AVX-512, AVX2 and SSE4.2 paths, oneDNN's AVX2 and SSE4.1 measured
equal under it). A change that is meant to change results updates REFERENCE, and its commit says so:

    .venv/bin/python -m pytest tests/e2e/test_e2e_reference.py   # prints the new digests
"""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from conftest import driftfl_bin, host_with

pytestmark = pytest.mark.e2e

PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
            "ONEDNN_MAX_CPU_ISA": "SSE41"}
SMALL = ["dataset.subset=2000", "dataset.test_subset=500", "num_clients=4",
         "fraction=0.75", "rounds=3", "seed=3"]
REFERENCE = {  # case: its overrides beside SMALL, and the SHA-256 of the final model.pt
    "fedavg-dirichlet": (["strategy=fedavg", "model=mlp"],
                         "15c794a7e8ed30e37c6529c527a4381686f9bf6b871112390c15cc6e002b2751"),
    "fedprox-pathological-cnn": (
        ["strategy=fedprox", "partition=pathological", "model=cnn"],
        "75a9000d003213ae3cd68c55488e7750b0a36b153a27e24f1f32657130e6b270"),
}


@pytest.fixture(scope="module")
def portable_host(tmp_path_factory):
    """The module's runs submit to one host whose processes compute with portable arithmetic:
    Ray's workers, where the clients train, take their environment from the host, not from
    the run."""
    with host_with(tmp_path_factory, "portable-host", **PORTABLE) as env:
        yield {**env, **PORTABLE}


@pytest.mark.parametrize("case", sorted(REFERENCE))
def test_a_reference_run_ends_in_the_same_model_bytes(case, tmp_path, fmnist_available,
                                                      portable_host):
    overrides, expected = REFERENCE[case]
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", *SMALL, *overrides, f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=portable_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    digest = hashlib.sha256((run_dir / "model.pt").read_bytes()).hexdigest()
    assert digest == expected, (
        f"{case}: the final model's bytes changed ({digest}). If the change of results is "
        "intended, set this digest in REFERENCE and say so in the commit; else a computation "
        "changed that should not have.")
