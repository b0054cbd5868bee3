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
    ("dataset.subset=-5", "dataset.subset must be in [1, 1000000], got -5"),
    ("dataset.name=nowhere", "unknown dataset 'nowhere'; valid: cifar10, cifar100"),
    ("model=mlp model.hidden=abc", "model.hidden must be a list, got 'abc'"),
    ("model=mlp model.hidden=[0]", "model.hidden.0 must be >= 1, got 0"),
    ("model.projection=-1", "model.projection must be in [0, 1000000], got -1"),
])
def test_a_bad_value_is_refused_before_torch_or_flower_is_imported(override, message):
    """What makes `driftfl run rounds=-1` take a fraction of a second rather than several
    (benchmarks/bad_value_refusal.py measures it)."""
    probe = ("import sys; from driftfl.cli import refusal; print(refusal(sys.argv[1:])); "
             "print(sorted({'torch', 'flwr', 'ray'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", probe, *override.split()], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].startswith(message) and out[1] == "[]"


PAIRS = {  # a bad value of a server section, or parts that cannot run together
    "strategy=fedprox strategy.mu=-1": "strategy.mu must be >= 0, got -1",
    "strategy=scaffold strategy.objective=ce": "strategy=scaffold needs objective=scaffold",
    "secagg=secaggplus strategy=fedcsd": "secagg=secaggplus with strategy=fedcsd: "
                                         "strategy.prototypes=exchange runs a prototype phase",
    "aggregation=krum aggregation.num_malicious=50": "aggregation=krum cannot work with the",
    "selection=cka": "selection=cka needs what only strategy=dcfl provides",
    "strategy=dcfl strategy.dsa_transforms=blur": "strategy.dsa_transforms unknown DSA transform",
}


def test_server_sections_and_pairs_are_refused_before_torch_or_flower_is_imported():
    """The methods' and parts' declarations (driftfl/specs/) need neither: `driftfl run
    strategy=scaffold strategy.objective=ce` is refused in a blink, as a typo is. One fresh
    interpreter for every case: what the refusals imported is what it then holds."""
    probe = ("import sys; from driftfl.cli import refusal\n"
             "for case in sys.argv[1:]: print(refusal(case.split()))\n"
             "print(sorted({'torch', 'flwr', 'ray'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", probe, *PAIRS], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert [said.startswith(message) for said, message in zip(out, PAIRS.values())] == [
        True] * len(PAIRS), out
    assert out[-1] == "[]"


def test_the_default_experiment_has_no_problem():
    assert settings_problem(composed([])) is None


def test_the_sections_a_registry_holds_are_left_to_the_full_check():
    """An unknown strategy setting or a model of a user's own needs its schema (Flower, torch):
    not refused here, so the full check names it rather than a second declaration of it."""
    assert settings_problem(composed(["+strategy.muu=4"])) is None
    assert settings_problem({**composed([]), "model": {"name": "mynet", "width": 3}}) is None


def test_the_early_check_refuses_as_the_full_check_does():
    """The dataset and a built-in model are checked by the very schemas the full check uses
    (their torch-free modules), so the line is the same."""
    from driftfl.common.config import experiment_config
    from driftfl.common.errors import ConfigError

    for overrides in (["dataset.subset=-5"], ["model=mlp", "model.hidden=[0]"],
                      ["dataset.name=nowhere"], ["model.projection=-1", "rounds=0"]):
        data = composed(overrides)
        with pytest.raises(ConfigError) as full:
            experiment_config(data)
        assert settings_problem(data) == str(full.value)


def test_the_built_in_models_settings_are_those_registered():
    from driftfl.common.model_settings import BUILT_IN_MODELS
    from driftfl.common.models import MODELS

    assert {name: MODELS[name][0] for name in BUILT_IN_MODELS} == BUILT_IN_MODELS
    assert set(BUILT_IN_MODELS) == {name for name, (_, build) in MODELS.items()
                                    if build.__module__ == "driftfl.common.models"}


def test_experiment_config_keeps_the_settings_in_their_order_with_their_meaning():
    from driftfl.common.config import ExperimentConfig

    assert list(ExperimentConfig.model_fields) == list(ExperimentSettings.model_fields)
    assert all(field.description for field in ExperimentConfig.model_fields.values())
