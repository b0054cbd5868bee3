"""An experiment's own settings (ExperimentSettings): checked without torch or Flower, and the
one declaration ExperimentConfig extends."""

from __future__ import annotations

import subprocess
import sys

import pytest

from driftfl.common.composing import composed
from driftfl.common.experiment_settings import ExperimentSettings, settings_problem


@pytest.mark.parametrize("override, message", [
    ("rounds=-1", "rounds must be in [1, 1000000], got -1"),
    ("lr=abc", "lr must be a number, got 'abc'"),
    ("simulation.client_gpus=2", "simulation.client_gpus must be in [0, 1], got 2"),
    ("partition.alpha=0", "partition.alpha must be > 0, got 0"),
    ("superlink=a/b", "superlink must name a SuperLink connection"),
])
def test_a_bad_value_is_refused_before_torch_or_flower_is_imported(override, message):
    """What makes `driftfl run rounds=-1` take a fraction of a second rather than several
    (benchmarks/bad_value_refusal.py measures it)."""
    probe = ("import sys; from driftfl.cli import refusal; print(refusal(sys.argv[1:])); "
             "print(sorted({'torch', 'flwr', 'ray'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", probe, override], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].startswith(message) and out[1] == "[]"


def test_the_default_experiment_has_no_problem():
    assert settings_problem(composed([])) is None


def test_the_sections_a_registry_holds_are_left_to_the_full_check():
    """An unknown dataset or strategy setting needs its schema (torch, Flower): not refused
    here, so the full check names it rather than a second declaration of it."""
    assert settings_problem(composed(["dataset.name=nowhere", "+strategy.muu=4"])) is None


def test_experiment_config_keeps_the_settings_in_their_order_with_their_meaning():
    from driftfl.common.config import ExperimentConfig

    assert list(ExperimentConfig.model_fields) == list(ExperimentSettings.model_fields)
    assert all(field.description for field in ExperimentConfig.model_fields.values())
