"""scripts/gpu_check.py: it covers every objective, and it runs (the CPU against itself) on a
machine without a GPU, so a path it forgets or a check that breaks shows up here first."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from driftfl.client.objectives import OBJECTIVES

from conftest import REPO

pytestmark = pytest.mark.slow  # the GPU check script, run CPU against CPU

SCRIPT = REPO / "scripts" / "gpu_check.py"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_check_runs_cpu_against_cpu_and_covers_every_objective():
    result = run("--device", "cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for method in OBJECTIVES:  # the registry: a new objective the script skips fails here
        assert any(line.startswith(f"ok   objective {method} ") for line in lines), method
    for name in ("condense dm", "condense dc", "condense dsa", "dsa rotate", "dcfl client mix",
                 "dcfl server (filter, pre-training)", "aux set (credibility, class phi)",
                 "model resnet18", "central evaluation"):
        assert any(line.startswith(f"ok   {name}") for line in lines), name
    assert "FAIL" not in result.stdout and lines[-1] == "all cpu checks passed"


def test_the_gpu_check_refuses_in_one_line_where_there_is_no_gpu():
    result = run("--device", "cuda", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpu_check: error: PyTorch sees no CUDA GPU here")
    assert "--device cpu" in result.stderr and len(result.stderr.splitlines()) == 1


def test_a_result_that_differs_between_the_devices_fails_its_check(capsys):
    script = load_script()
    checks = script.Checks("elsewhere")  # the runs see "cpu", then "elsewhere"
    checks.compare("same", lambda device: {"w": torch.ones(3), "steps": 4})
    checks.compare("drifts", lambda device: {"w": torch.ones(3) * (1 + (device == "cpu") * 1e-2)})
    checks.compare("other count", lambda device: {"steps": 4 + (device == "cpu")})
    checks.compare("raises", lambda device: 1 / 0)
    assert checks.failures == ["drifts", "other count", "raises"]
    assert "FAIL raises raised ZeroDivisionError" in capsys.readouterr().out


def test_results_agree_only_within_the_tolerance_and_in_the_same_structure():
    agree = load_script().agree
    assert agree({"a": [1.0, np.float32(2)]}, {"a": [1.0 + 1e-6, 2.0]}, rtol=1e-3, atol=1e-4)
    assert not agree({"a": 1.0}, {"b": 1.0}, rtol=1e-3, atol=1e-4)
    assert not agree([1.0, 2.0], [1.0], rtol=1e-3, atol=1e-4)
    assert not agree(np.zeros(3), np.zeros(4), rtol=1e-3, atol=1e-4)
    assert not agree(np.array([1, 2]), np.array([1, 3]), rtol=1e-3, atol=1e-4)  # exact ints
    assert agree(float("nan"), float("nan"), rtol=1e-3, atol=1e-4)  # a class without samples
    # atol scales with the values: small ones (FedCurv's Fisher) are not waved through
    assert not agree(np.array([1e-6, 2e-6]), np.array([2e-6, 1e-6]), rtol=1e-3, atol=1e-4)
    assert agree(np.array([1e-6, 0.0]), np.array([1e-6, 1e-11]), rtol=1e-3, atol=1e-4)
