"""Every registered method, straight from the registry: it composes, passes the checks and
trains one round; its YAML says what its settings schema says."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from conftest import REPO
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from driftfl.client.app import app as client_app
from driftfl.client.objectives import OBJECTIVES, build_objective
from driftfl.common.config import ExperimentConfig, compose
from driftfl.common.datasets import DATASETS
from driftfl.common.errors import ConfigError
from driftfl.common.models import MODELS
from driftfl.common.partition import PARTITIONS
from driftfl.common.protocol import CONFIG, DATASET_META, EXPERIMENT, PROXIMAL_MU
from driftfl.methods import METHODS, build_strategy, check_experiment, method_schema
from driftfl.server.experiment import prepare_experiment
from driftfl.server.survey import survey_clients
from driftfl.server.traffic import MeteredGrid
from driftfl.strategies import AGGREGATIONS, SELECTIONS
from driftfl.strategies.parts.aggregation import to_numpy

CONF = REPO / "conf"
TINY = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=200", "num_clients=2",
        "rounds=1", "logit_shift_samples=32"]


def fmnist_nodes(n: int) -> dict[int, dict]:
    """Node configs of n nodes holding Fashion-MNIST partitions (node ids 100, 101, ...): as
    deployment nodes name their data, since in-process calls do not count as simulation."""
    return {100 + i: {"dataset": "fmnist", "partition-id": i, "num-partitions": n}
            for i in range(n)}


class InProcessGrid:
    """A Grid whose nodes are ClientApp calls in this process, each with its own Context
    (node config and state), as a SuperNode keeps them."""

    def __init__(self, node_configs: dict[int, dict]):
        self.contexts = {node: Context(run_id=1, node_id=node, node_config=config,
                                       state=RecordDict(), run_config={})
                         for node, config in node_configs.items()}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for message in messages:
            try:
                replies.append(client_app(message, self.contexts[message.metadata.dst_node_id]))
            except Exception as err:  # a failing handler becomes an error reply, as in Flower
                replies.append(Message(Error(code=0, reason=repr(err)), reply_to=message))
        return replies


def surveyed(overrides: list[str], nodes: int = 2):
    """A strategy built from ``overrides`` and met by the data survey of an in-process grid of
    ``nodes`` Fashion-MNIST nodes: (experiment, model, strategy, grid, the config record every
    message carries)."""
    experiment = prepare_experiment(compose(overrides))
    model = experiment.initial_model()
    strategy = build_strategy(experiment.cfg, model)
    grid = InProcessGrid(fmnist_nodes(nodes))
    record = ConfigRecord({EXPERIMENT: experiment.cfg.to_json(),
                           DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, nodes, node_wait=5, timeout=60))
    return experiment, model, strategy, grid, record


# what a method's clients send beside the model and metrics in round 1 (FedCSD: its prototype
# phase; DCFL: its pre-training stage), by payload kind
EXTRA_UP = {"fedcsd": {"prototypes"}, "fedproto": {"feature_prototypes"},
            "scaffold": {"control_delta"}, "fedcurv": {"fisher"},
            "dcfl": {"condensed", "classifier"}}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_composes_validates_and_trains_one_round(name, fmnist_available,
                                                              server_task):
    experiment = prepare_experiment(compose([f"strategy={name}", *TINY]))
    cfg = experiment.cfg
    assert cfg.strategy.name == name and cfg.strategy.objective == METHODS[name].objective
    model = experiment.initial_model()
    strategy = build_strategy(cfg, model, experiment.aux_set(model))
    assert isinstance(strategy, METHODS[name].strategy)

    grid = MeteredGrid(InProcessGrid(fmnist_nodes(2)))
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    clients = survey_clients(grid, record, 2, node_wait=5, timeout=60)
    assert set(grid.take()) == {"bytes_sent", "bytes_received", "bytes_down_survey",
                                "bytes_up_survey"}
    strategy.meet(clients)
    initial = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    from driftfl.common.protocol import model_to_arrays

    result = strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=1,
                            train_config=record, evaluate_config=ConfigRecord(dict(record)))

    assert strategy.report.rejected == [] and strategy.report.clients == 2
    assert math.isfinite(strategy.report.train_metrics["train-loss"])
    trained = to_numpy(result.arrays)
    assert any(not np.array_equal(trained[k], initial[k]) for k in initial)
    # what the clients sent, by payload kind, adds up to all they sent
    traffic = grid.take()
    up = {k.removeprefix("bytes_up_"): v for k, v in traffic.items() if k.startswith("bytes_up_")}
    assert set(up) == {"arrays", "metrics", *EXTRA_UP.get(name, ())} and all(up.values())
    assert sum(up.values()) == traffic["bytes_received"]
    assert sum(v for k, v in traffic.items() if k.startswith("bytes_down_")) == traffic[
        "bytes_sent"]


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_method_has_a_yaml_and_every_strategy_yaml_is_a_method():
    assert group_options("strategy") == sorted(METHODS)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_methods_yaml_holds_its_schemas_defaults(name):
    section = yaml.safe_load((CONF / "strategy" / f"{name}.yaml").read_text())
    section.pop("defaults", None)
    schema = method_schema(name, METHODS[name].objective)
    assert section == schema(name=name, objective=METHODS[name].objective).model_dump()


@pytest.mark.parametrize("group, table", [
    ("dataset", {n: entry[0] for n, entry in DATASETS.items()}), ("partition", PARTITIONS),
    ("model", {n: entry[0] for n, entry in MODELS.items()}),
    ("aggregation", {n: part.Settings for n, part in AGGREGATIONS.items()}),
    ("selection", {n: part.Settings for n, part in SELECTIONS.items()})])
def test_every_yaml_of_a_group_holds_its_schemas_defaults(group, table):
    assert set(group_options(group)) <= set(table)
    for option in group_options(group):
        section = yaml.safe_load((CONF / group / f"{option}.yaml").read_text())
        given = {k: v for k, v in section.items() if k != "name" and v != "???"}  # ???: required
        defaults = {k: f.get_default() for k, f in table[option].model_fields.items()
                    if not f.is_required()}
        assert given == defaults, option


def test_config_yaml_holds_the_experiment_schemas_defaults():
    top = yaml.safe_load((CONF / "config.yaml").read_text())
    for key in ("defaults", "hydra", "label"):  # label: the method's name unless set
        top.pop(key)
    fields = ExperimentConfig.model_fields
    # groups chosen in the defaults list whose schema has a default: their default yaml
    # (privacy: none, ...) builds the schema's default
    grouped = {"privacy": "none", "secagg": "none", "heterogeneity": "none"}
    for group, name in grouped.items():
        chosen = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
        assert type(fields[group].get_default())(**chosen) == fields[group].get_default()
    assert set(top) == {k for k, f in fields.items() if not f.is_required()} - set(grouped)
    for key, value in top.items():
        default = fields[key].get_default()
        assert (default.model_dump() if hasattr(default, "model_dump") else default) == value, key


def test_fedssd_lam_follows_the_class_count_unless_set():
    settings = check_experiment(compose(["strategy=fedssd"])).strategy
    assert settings.lam is None  # before the data is known
    assert settings.for_classes(10).lam == 0.01 and settings.for_classes(100).lam == 0.001
    assert settings.model_copy(update={"lam": 0.05}).for_classes(100).lam == 0.05
    assert prepare_experiment(compose(["strategy=fedssd", "dataset.subset=2000"])
                              ).cfg.strategy.lam == 0.01


def test_prox_takes_mu_from_the_train_message_that_fedprox_sends():
    from types import SimpleNamespace

    message = SimpleNamespace(content={CONFIG: ConfigRecord({PROXIMAL_MU: 0.2})})
    objective = build_objective("prox", {"mu": 0.5}, SimpleNamespace(message=message))
    assert objective.weight == 0.2  # the wire's value, not the section's
    bad = SimpleNamespace(content={CONFIG: ConfigRecord({PROXIMAL_MU: -1.0})})
    with pytest.raises(ConfigError, match="mu must be >= 0, got -1.0"):
        build_objective("prox", {}, SimpleNamespace(message=bad))


def test_another_objective_leaves_the_methods_own_settings_out():
    cfg = check_experiment(compose(["strategy=fedgkd", "strategy.objective=ce"]))
    assert cfg.strategy.model_dump() == {"name": "fedgkd", "objective": "ce", "buffer_size": 5}
    cfg = check_experiment(compose(["strategy=fedavg", "strategy.objective=lsd"]))
    assert (cfg.strategy.beta, cfg.strategy.temperature) == (0.3, 1.0)  # the schema's defaults


def test_a_method_whose_server_needs_its_own_objective_refuses_another_up_front():
    """check_experiment is what `driftfl run` checks first and the ServerApp again: the
    refusal came only from the ServerApp's build_strategy, minutes into a run."""
    fixed = {name for name, method in METHODS.items() if method.objective_fixed}
    assert fixed == {"scaffold", "feddyn"}
    for name in fixed:
        with pytest.raises(ConfigError, match=f"^strategy={name} needs objective="
                                              f"{METHODS[name].objective} "):
            check_experiment(compose([f"strategy={name}", "strategy.objective=ce"]))
    assert check_experiment(compose(["strategy=fedcurv", "strategy.objective=ce"]))


def test_a_methods_aggregation_comes_from_its_yaml_and_yields_to_the_command_line():
    assert compose(["strategy=fednova"]).aggregation.name == "fednova"
    assert compose(["strategy=fednova", "aggregation=mean"]).aggregation.name == "mean"
    assert compose(["strategy=fedcsd", "aggregation=fednova"]).aggregation.name == "fednova"


def test_objectives_declare_what_they_need_and_strategies_what_they_send():
    for name, method in METHODS.items():
        assert OBJECTIVES[method.objective].needs <= method.strategy.provides, name


def test_fedcsd_code_trains_without_any_prototype_exchange(fmnist_available, server_task):
    """+experiment=fedcsd_code: each client builds its own prototypes, so the round has no
    prototype phase and the train messages carry the teacher but no prototypes."""
    from driftfl.common.protocol import PROTOTYPES, TEACHER, model_to_arrays

    experiment = prepare_experiment(compose(["+experiment=fedcsd_code", *TINY]))
    cfg = experiment.cfg
    assert (cfg.label, cfg.strategy.prototypes, cfg.strategy.mu) == ("fedcsd-code", "local", 0.5)
    model = experiment.initial_model()
    strategy = build_strategy(cfg, model)

    class Recording(InProcessGrid):
        sent: list = []

        def send_and_receive(self, messages, timeout=None):
            messages = list(messages)
            self.sent += messages
            return super().send_and_receive(messages, timeout)

    grid = Recording(fmnist_nodes(2))
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, 2, node_wait=5, timeout=60))
    grid.sent.clear()
    strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=1,
                   train_config=record, evaluate_config=ConfigRecord(dict(record)))
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train) == len(grid.sent) == 2  # no query before training
    assert all(TEACHER in m.content and PROTOTYPES not in m.content for m in train)
    assert strategy.report.rejected == [] and strategy.report.clients == 2


def test_a_strategy_that_names_a_method_registers_it_and_a_taken_name_is_refused():
    """The registry is filled by the classes themselves (registry.py): a base such as
    TeacherStrategy names no method and is not one; a second class under a taken name stops
    at its definition rather than replacing the first."""
    from driftfl.specs import METHOD_SPECS
    from driftfl.strategies import DriftStrategy, FedAvg
    from driftfl.strategies.methods.teacher import TeacherStrategy

    assert {m.strategy for m in METHODS.values()}.isdisjoint({DriftStrategy, TeacherStrategy})
    assert {name for name, m in METHODS.items() if m.strategy is FedAvg} == {
        "fedavg", *FedAvg.variants}

    class FedTwin(FedAvg):
        method = "fedtwin"
        default_objective = "ntd"
    try:
        assert (METHODS["fedtwin"].strategy, METHODS["fedtwin"].objective) == (FedTwin, "ntd")
        assert METHOD_SPECS["fedtwin"].objective == "ntd"  # checked as the built-ins are
        with pytest.raises(TypeError, match="two methods are named 'fedavg'"):
            class Impostor(DriftStrategy):
                method = "fedavg"
        assert METHODS["fedavg"].strategy is FedAvg
    finally:
        del METHODS["fedtwin"], METHOD_SPECS["fedtwin"]
