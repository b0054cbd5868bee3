"""The ServerApp's run config: overrides plus Flower's usual keys for the common settings."""

from __future__ import annotations

import tomllib

import pytest

from conftest import REPO
from driftfl.common.errors import ConfigError
from driftfl.server.run_config import FLOWER_KEYS, experiment_overrides


def test_pyproject_declares_every_flower_key_unset():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for key, (_, unset) in FLOWER_KEYS.items():
        assert declared[key] == unset and type(declared[key]) is type(unset), key


def test_flower_keys_become_overrides_and_unset_ones_leave_conf_alone():
    run_config = {"overrides": "model=mlp strategy.mu=0.1", "num-server-rounds": 3,
                  "strategy": "fedprox", "lr": 0.0, "seed": 0, "local-epochs": 0}
    assert experiment_overrides(run_config) == ["model=mlp", "strategy.mu=0.1", "rounds=3",
                                                "seed=0", "strategy=fedprox"]
    assert experiment_overrides({"overrides": '["rounds=2"]'}) == ["rounds=2"]


def test_a_setting_given_both_ways_is_refused():
    with pytest.raises(ConfigError, match="rounds is set twice.*num-server-rounds=3"):
        experiment_overrides({"overrides": "rounds=5", "num-server-rounds": 3})
