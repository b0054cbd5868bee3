"""A new method with a summed payload runs under every release without touching the release
code: docs/adding-a-method.md's FedCentre, its objective and strategy taken from the page as
written, through the real ClientApp with no privacy, central DP, distributed DP, SecAgg+ and
distributed DP through SecAgg+."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import REPO
from flwr.app import ConfigRecord
from test_methods import fmnist_nodes
from test_secagg import RecordingGrid

from driftfl.client.objectives import OBJECTIVES
from driftfl.common.config import compose
from driftfl.common.protocol import DATASET_META, EXPERIMENT, METHOD, model_to_arrays
from driftfl.methods import METHODS, build_strategy
from driftfl.server.experiment import prepare_experiment
from driftfl.server.secure import secure_train_round
from driftfl.server.survey import survey_clients
from driftfl.specs import METHOD_SPECS, OBJECTIVE_SPECS

CLIENTS = 3
TINY = ["model=mlp", "dataset.subset=1500", "dataset.test_subset=200", f"num_clients={CLIENTS}",
        "rounds=2", "logit_shift_samples=32"]
QUIET = ["privacy.noise_multiplier=0", "privacy.payload_clip=1000"]  # to compare the sums


def guide_module(marker: str) -> dict:
    """The namespace of the guide's code block that defines ``marker``."""
    text = (REPO / "docs" / "adding-a-method.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if marker in b]
    namespace: dict = {"__name__": f"guide_{marker.split()[1]}"}
    exec(compile(block, "adding-a-method.md", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def fedcentre():
    """The guide's method, registered by its own two classes as the guide writes them."""
    guide_module("class Centre(Objective)")  # registers the objective by its name
    strategy = guide_module("class FedCentre(DriftStrategy)")["FedCentre"]
    assert METHODS["fedcentre"].strategy is strategy and METHODS["fedcentre"].objective == "centre"
    yield strategy
    # the repository's registries as they were
    del METHODS["fedcentre"], OBJECTIVES["centre"], METHOD_SPECS["fedcentre"]
    del OBJECTIVE_SPECS["centre"]


def round_under(overrides: list[str], secure: bool = False, drop: int | None = None):
    """One round of FedCentre with these settings: the strategy and the grid after it."""
    cfg = compose([*TINY, *overrides]).model_dump()
    cfg["strategy"] = {"name": "fedcentre", "objective": "centre", "lam": 0.1}
    experiment = prepare_experiment(cfg)
    model = experiment.initial_model()
    strategy = build_strategy(experiment.cfg, model)
    grid = RecordingGrid(fmnist_nodes(CLIENTS), drop=drop)
    record = ConfigRecord({EXPERIMENT: experiment.cfg.to_json(),
                           DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, CLIENTS, node_wait=5, timeout=60))
    arrays = model_to_arrays(model)
    if secure:
        new = secure_train_round(strategy, grid, experiment.cfg.secagg, 1, arrays, record, 60)
    else:
        new, _ = strategy.aggregate_train(1, grid.send_and_receive(
            strategy.configure_train(1, arrays, record, grid)))
    assert new is not None, strategy.report
    assert strategy.report.rejected == [] and strategy.centre is not None
    return strategy, grid


PLAIN_MEANS: dict = {}


def test_the_guides_method_runs_plain(fedcentre, fmnist_available, server_task):
    strategy, grid = round_under([])
    assert {m.content["config"][METHOD] for _, m in grid.sent
            if m.metadata.message_type == "train"} == {"centre"}
    means = [r.content["feature-centre"]["mean"].numpy() for _, r in grid.replies
             if "feature-centre" in r.content.array_records]
    assert len(means) == CLIENTS
    np.testing.assert_allclose(strategy.centre, np.mean(means, axis=0), rtol=1e-6)
    PLAIN_MEANS["centre"] = strategy.centre


@pytest.mark.parametrize("overrides, secure", [
    (["privacy=central", *QUIET], False),
    (["privacy=distributed", *QUIET, "privacy.min_survivors=1.0"], False),
    (["secagg=secaggplus"], True),
    (["secagg=secaggplus", "privacy=distributed", *QUIET, "privacy.min_survivors=1.0"], True),
], ids=["central", "distributed", "secagg", "distributed-secagg"])
def test_the_guides_method_takes_the_same_sum_under_every_release(
        fedcentre, fmnist_available, server_task, overrides, secure):
    """Without noise and with a clip that does not bite, every release hands the method the
    same sum: its centre equals the plain round's (within SecAgg+'s quantisation)."""
    if "centre" not in PLAIN_MEANS:
        test_the_guides_method_runs_plain(fedcentre, fmnist_available, server_task)
    strategy, grid = round_under(overrides, secure)
    tolerance = 1e-3 if secure else 1e-5
    np.testing.assert_allclose(strategy.centre, PLAIN_MEANS["centre"], atol=tolerance)
    for _, reply in grid.replies:  # what left a client: the model and the summed mean, or
        # under SecAgg+ no array at all
        arrays = {name for name, record in reply.content.array_records.items() if record}
        assert arrays <= (set() if secure else {"arrays", "feature-centre"})


def test_the_guides_method_under_noise_composes_its_payloads_release(
        fedcentre, fmnist_available, server_task):
    strategy, _ = round_under(["privacy=distributed", "secagg=secaggplus"], secure=True)
    columns = strategy.release.columns(1)
    assert columns["dp_q"] == 1.0 and columns["dp_sigma_payload"] == columns["dp_sigma"]
    assert strategy.release.payload == "the clients' mean features"
    assert "the clients' mean features clipped to privacy.payload_clip=5" in \
        strategy.release.plan(2)
