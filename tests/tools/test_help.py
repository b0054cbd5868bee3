"""`driftfl run --help` is rendered from the models that check the settings, so it lists every
setting with its default and meaning; every command answers --help; --version says which."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import Field, create_model

from support.cli import driftfl
from driftfl import help as run_help_module
from driftfl.common.experiment_settings import ExperimentSettings
from driftfl.help import general_help, model_lines, run_help, shown, type_name


def test_every_setting_of_the_experiment_is_in_the_help_with_its_default():
    from driftfl.common.config import ExperimentConfig

    text = general_help()
    for name, field in ExperimentConfig.model_fields.items():
        assert f"  {name}: " in text, name
        if not field.is_required():
            nested = field.annotation
            if isinstance(nested, type) and hasattr(nested, "model_fields"):
                for key, inner in nested.model_fields.items():
                    if key != "name":
                        assert f"  {name}.{key}: " in text and f"= {shown(inner.default)}" in text
            else:
                assert f"  {name}: {type_name(field.annotation)}" in text
                line = next(line for line in text.splitlines() if line.startswith(f"  {name}: "))
                assert line.endswith(f"= {shown(field.default)}"), line
        assert field.description.split()[0] in text


def test_the_groups_are_listed_with_their_options_and_defaults():
    text = general_help()
    assert "strategy (default fedavg): dcfl, fedavg, fedavgm," in text
    assert "dataset (default fmnist): cifar10, cifar100, emnist, fmnist, folder, mnist, npz" in text
    assert "experiment (none by default; add one: +experiment=OPTION)" in text


def test_a_field_added_to_a_model_shows_up_without_touching_the_help(monkeypatch):
    grown = create_model("Grown", __base__=ExperimentSettings,
                         warmup_rounds=(int, Field(2, ge=0, description="rounds before the first")))
    monkeypatch.setattr("driftfl.common.experiment_settings.ExperimentSettings", grown)
    text = general_help()
    assert "  warmup_rounds: int >= 0 = 2\n      rounds before the first" in text


def test_a_value_shows_its_type_range_default_and_where_the_overrides_move_it():
    lines = model_lines(ExperimentSettings, values={"rounds": 20, "lr": 0.05})
    assert "  rounds: int in [1, 1000000] = 5  (here: 20)" in lines
    assert "  lr: float > 0 = 0.05" in lines  # as the default: no "here"
    assert "  device: cpu | cuda = cpu" in lines
    assert "  simulation.ray_address: str or null = null" in lines


def test_the_help_of_a_chosen_option_lists_its_settings_from_its_schema():
    text = run_help(["strategy=dcfl", "strategy.ipc=3"])
    assert "  strategy: config group = fedavg  (here: dcfl)" in text
    assert "strategy=dcfl: its settings" in text
    assert "  strategy.ipc: int in [1, 1000000] = 10  (here: 3)\n      condensed images" in text


def described_models():
    """Every settings model `driftfl run --help` renders a section's keys from: each method's
    strategy and objective halves, the aggregations', selections', datasets', partitions' and
    built-in models' settings, and the nested sections of the experiment."""
    from driftfl.client.objectives import OBJECTIVES
    from driftfl.common.conditions import HeterogeneitySettings
    from driftfl.common.dataset_settings import DATASET_SETTINGS
    from driftfl.common.experiment_settings import SimulationSettings
    from driftfl.common.model_settings import BUILT_IN_MODELS
    from driftfl.common.partition import PARTITIONS
    from driftfl.common.privacy import PrivacySettings, SecAggSettings
    from driftfl.methods import METHODS, MethodHeader, method_schema
    from driftfl.strategies import AGGREGATIONS, SELECTIONS

    models = {"MethodHeader": MethodHeader, "privacy": PrivacySettings, "secagg": SecAggSettings,
              "heterogeneity": HeterogeneitySettings, "simulation": SimulationSettings}
    models |= {f"strategy={name}": method_schema(name, method.objective)
               for name, method in METHODS.items()}
    models |= {f"objective={name}": objective.Settings for name, objective in OBJECTIVES.items()}
    models |= {f"aggregation={name}": part.Settings for name, part in AGGREGATIONS.items()}
    models |= {f"selection={name}": part.Settings for name, part in SELECTIONS.items()}
    models |= {f"dataset={name}": settings for name, settings in DATASET_SETTINGS.items()}
    models |= {f"partition={name}": settings for name, settings in PARTITIONS.items()}
    models |= {f"model={name}": settings for name, settings in BUILT_IN_MODELS.items()}
    return models


def test_every_setting_of_every_section_has_a_meaning():
    """A section's ``name`` is its config group's option (the help lists the options); every
    other key says what it means."""
    models = described_models()
    assert len([key for key in models if key.startswith("strategy=")]) >= 15
    missing = [f"{where}: {key}" for where, model in models.items()
               for key, field in model.model_fields.items()
               if key != "name" and not (field.description or "").strip()]
    assert missing == []


def test_the_general_help_needs_neither_torch_nor_flower():
    probe = ("import sys; from driftfl.help import run_answer; "
             "run_answer(['--help'], lambda args: [], None); "
             "print(sorted({'torch', 'flwr', 'ray'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_version_names_driftfl_and_what_it_runs_on():
    text = run_help_module.version_text()
    assert text.startswith("driftfl ") and "flwr " in text and "torch " in text


@pytest.mark.parametrize("command, usage", [
    (["run", "--help"], "usage: driftfl run"),
    (["run", "-h", "strategy=fedprox"], "strategy.mu: float"),
    (["report", "--help"], "usage: driftfl report"),
    (["audit", "--help"], "driftfl audit RUN_DIR"),
    (["split", "--help"], "usage: driftfl split DIR [overrides]"),
    (["split", "-h"], "usage: driftfl split DIR [overrides]"),
    (["secure", "--help"], "usage: driftfl secure"),
    (["secure", "init", "--help"], "usage: driftfl secure init"),
    (["secure", "connect", "--help"], "usage: driftfl secure connect"),
    (["secure", "register", "--help"], "usage: driftfl secure register"),
    (["secure", "proxy", "--help"], "usage: driftfl secure proxy"),
    (["--version"], "driftfl "),
    (["run", "--version"], "driftfl "),
    (["run", "--hydra-help"], "Hydra ("),  # Hydra's own help, as before
])
def test_every_command_answers_help_with_its_usage_and_writes_nothing(command, usage, tmp_path):
    out = driftfl(*command, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (0, "") and usage in out.stdout
    assert not any(tmp_path.iterdir())


def test_help_refuses_an_unknown_option_in_one_line(tmp_path):
    out = driftfl("run", "--help", "strategy=fedproxx", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("driftfl: error: unknown strategy 'fedproxx'; valid: dcfl,")


def test_the_help_lists_the_settings_of_the_options_a_run_uses_by_default():
    """partition.alpha, the first thing a non-IID researcher changes, without naming the
    partition; a named option's settings instead of the default's."""
    text = general_help()
    assert "partition=dirichlet (the default): its settings" in text
    assert "  partition.alpha: " in text and "  strategy.objective: " in text
    chosen = run_help(["partition=pathological"])
    assert "partition=pathological: its settings" in chosen
    assert "partition=dirichlet" not in chosen and "  partition.alpha: " not in chosen
