"""The `driftfl` command refuses bad input in one line, before starting any Flower process."""

from __future__ import annotations

import subprocess

import pytest

from conftest import driftfl_bin


def driftfl(*args, cwd):
    return subprocess.run([driftfl_bin(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_help_and_unknown_command(tmp_path):
    out = driftfl("--help", cwd=tmp_path)
    assert out.returncode == 0 and "driftfl run" in out.stdout
    out = driftfl("frobnicate", cwd=tmp_path)
    assert out.returncode == 2 and "unknown command 'frobnicate'; valid: report, run" in out.stderr


@pytest.mark.parametrize("override, message", [
    ("partition.alpha=0", "driftfl: error: partition.alpha must be > 0, got 0"),
    ("fraction=2", r"driftfl: error: fraction must be in (0, 1], got 2"),
    ("model.name=vgg", "driftfl: error: unknown model 'vgg'; valid: cnn, lenet5, mlp, resnet18"),
])
def test_bad_value_exits_2_with_one_line_and_no_run(override, message, tmp_path,
                                                    fmnist_available):
    out = driftfl("run", override, "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "run" / "superlink.log").exists()  # no Flower process was started


@pytest.mark.parametrize("args, message", [
    (["roundz=3"], "driftfl: error: unknown setting roundz; did you mean rounds?"),
    (["strategy=fedcsd", "+strategy.muu=4"],
     "driftfl: error: unknown setting strategy.muu; did you mean strategy.mu?"),
    # a sweep is checked for every swept method before any job runs
    (["-m", "strategy=fedntd,fedcsd", "strategy.tau=0,1"],
     "driftfl: error: strategy.tau must be > 0, got 0"),
])
def test_unknown_keys_and_bad_sweeps_are_refused_before_anything_is_written(args, message,
                                                                             tmp_path):
    out = driftfl("run", *args, "hydra.run.dir=run", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == message
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_unknown_strategy_lists_the_valid_ones(tmp_path):
    out = driftfl("run", "strategy=fedfoo", cwd=tmp_path)
    assert out.returncode != 0
    assert "Could not find 'strategy/fedfoo'" in out.stderr
    assert all(name in out.stderr for name in ("fedavg", "fedprox", "fedavgm", "fednova"))
    assert "Traceback" not in out.stderr


def test_cfg_job_prints_the_composed_experiment(tmp_path):
    out = driftfl("run", "--cfg", "job", "strategy=fedprox", cwd=tmp_path)
    assert out.returncode == 0 and "objective: prox" in out.stdout
