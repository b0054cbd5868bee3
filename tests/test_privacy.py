"""User-level differential privacy (DP-FedAvg): clipping, the noise's scale, the accountant,
the clients' side, the budget stop and the refusals."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import Array, ArrayRecord

from driftfl.client.privacy import disclosed_metrics, privatise
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.privacy import PrivacySettings, clip_update
from driftfl.common.protocol import ARRAYS, LOCAL_STEPS, METRICS, NUM_EXAMPLES, TRAIN_LOSS
from driftfl.methods import check_experiment
from driftfl.server.checkpoint import state_of
from driftfl.strategies.aggregation import ClientUpdate
from driftfl.strategies.private import PrivateMean

GLOBAL = {"w": np.zeros((50, 40), np.float32), "b": np.zeros(40, np.float32),
          "count": np.array(7, np.int64)}  # an integer buffer: not an update, never noised


def update(node: int, scale: float, examples: float = 100.0, seed: int = 0) -> ClientUpdate:
    rng = np.random.default_rng(seed)
    arrays = {k: (v + scale * rng.standard_normal(v.shape)).astype(v.dtype)
              if v.dtype.kind == "f" else v.copy() for k, v in GLOBAL.items()}
    return ClientUpdate(node, arrays, {NUM_EXAMPLES: examples, LOCAL_STEPS: 1.0}, None)


def norm(arrays: dict, reference: dict = GLOBAL) -> float:
    return math.sqrt(sum(float(np.sum((arrays[k].astype(np.float64) - reference[k]) ** 2))
                         for k in reference if reference[k].dtype.kind == "f"))


def mean_of(name: str, updates: list[ClientUpdate], clients: int, **settings) -> dict:
    private = PrivateMean(PrivacySettings(name=name, **settings), num_clients=100,
                          per_round=clients)
    return private.combine(updates, GLOBAL, clients, server_round=1)


def test_clip_scales_to_the_norm_and_leaves_small_updates_alone():
    clipped, before = clip_update([np.full(4, 3.0), np.full(1, 4.0)], 2.5)  # norm sqrt(52)
    assert before == pytest.approx(math.sqrt(52))
    assert math.sqrt(sum(float(np.sum(c ** 2)) for c in clipped)) == pytest.approx(2.5)
    small, _ = clip_update([np.array([0.3, 0.4])], 1.0)
    assert np.array_equal(small[0], [0.3, 0.4])


def test_central_no_client_moves_the_mean_by_more_than_clip_over_m():
    """One client's huge update, four silent ones: without noise the mean moved by C / m."""
    aggregate = mean_of("central", [update(1, 100.0)], clients=5, clip=2.0,
                        noise_multiplier=0.0)
    assert norm(aggregate) == pytest.approx(2.0 / 5, rel=1e-5)
    assert aggregate["count"] == 7 and aggregate["w"].dtype == np.float32


def test_central_mean_counts_every_client_once_whatever_its_examples():
    a, b = update(1, 0.01, examples=10, seed=1), update(2, 0.01, examples=5000, seed=2)
    aggregate = mean_of("central", [a, b], clients=2, clip=10.0, noise_multiplier=0.0)
    expected = (a.arrays["w"].astype(np.float64) + b.arrays["w"]) / 2
    assert np.allclose(aggregate["w"], expected, atol=1e-7)


def test_central_noise_has_the_stated_scale_and_is_seeded_per_round():
    private = PrivateMean(PrivacySettings(name="central", clip=1.5, noise_multiplier=2.0),
                          num_clients=100, per_round=4)
    zero = [update(n, 0.0) for n in range(4)]
    first = private.combine(zero, GLOBAL, 4, server_round=1)
    noise = np.concatenate([first["w"].ravel(), first["b"].ravel()])
    assert noise.std() == pytest.approx(2.0 * 1.5 / 4, rel=0.05)  # sigma C / m
    assert abs(noise.mean()) < 0.05
    again = private.combine(zero, GLOBAL, 4, server_round=1)
    assert np.array_equal(first["w"], again["w"])  # a resumed round adds the same noise
    assert not np.array_equal(first["w"], private.combine(zero, GLOBAL, 4, 2)["w"])
    # the seed is the strategy's state (a checkpoint keeps it), not the experiment's seed
    assert state_of(private) == {"noise_seed": private.noise_seed}
    other = PrivateMean(private.settings, num_clients=100, per_round=4)
    assert other.noise_seed != private.noise_seed


def test_distributed_client_clips_and_adds_its_share_of_the_noise():
    settings = PrivacySettings(name="distributed", clip=1.0, noise_multiplier=1.0)
    received = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    trained = ArrayRecord({k: Array(v) for k, v in update(1, 5.0).arrays.items()})
    quiet = privatise(trained, received, settings.model_copy(update={"noise_multiplier": 0.0}),
                      clients=9)
    sent = {k: quiet[k].numpy() for k in quiet}
    assert norm(sent) == pytest.approx(1.0, rel=1e-5) and sent["count"] == 7
    noisy = privatise(ArrayRecord({k: Array(v) for k, v in GLOBAL.items()}), received,
                      settings, clients=9, rng=np.random.default_rng(3))
    share = noisy["w"].numpy().astype(np.float64)
    assert share.std() == pytest.approx(1.0 / 3, rel=0.05)  # sigma C / sqrt(m)
    # m shares sum to the noise central DP puts on the sum: sigma C
    total = sum(privatise(received, received, settings, clients=9,
                          rng=np.random.default_rng(s))["w"].numpy().astype(np.float64)
                for s in range(9))
    assert total.std() == pytest.approx(1.0, rel=0.05)
    unchanged = privatise(trained, received, PrivacySettings(name="central"), clients=9)
    assert unchanged is trained  # central: the server clips and noises


def test_distributed_server_refuses_an_update_beyond_clip_and_noise():
    settings = PrivacySettings(name="distributed", clip=1.0, noise_multiplier=1.0)
    private = PrivateMean(settings, num_clients=10, per_round=10)
    honest = update(1, settings.share_noise_std(10))  # what the noise share alone gives
    assert private.reject(honest, GLOBAL, 10) is None
    reason = private.reject(update(2, 1.0), GLOBAL, 10)
    assert reason and "exceeds what privacy=distributed lets a client send" in reason
    # distributed: the server does not clip again, the clients' noise is already in
    aggregate = private.combine([honest], GLOBAL, 1, server_round=1)
    assert np.allclose(aggregate["w"], honest.arrays["w"])


@pytest.mark.parametrize("q, sigma, rounds, delta", [(0.2, 1.0, 30, 1e-5), (1.0, 2.0, 5, 1e-6),
                                                    (0.05, 0.8, 100, 1e-5)])
def test_epsilon_is_the_librarys_own_figure(q, sigma, rounds, delta):
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(sigma)), rounds)
    private = PrivateMean(PrivacySettings(name="central", noise_multiplier=sigma, delta=delta),
                          num_clients=round(1 / q * 20), per_round=20)
    assert private.epsilon(rounds) == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    assert private.epsilon(0) == 0.0


def test_the_budget_stops_before_the_round_that_would_exceed_it():
    private = PrivateMean(PrivacySettings(name="central", noise_multiplier=1.0,
                                          target_epsilon=5.0), num_clients=100, per_round=20)
    rounds = [t for t in range(1, 50) if private.over_budget(t)]
    first = rounds[0]
    assert private.epsilon(first - 1) <= 5.0 < private.epsilon(first)
    assert f"round {first} would spend epsilon" in private.over_budget(first)
    assert f"the run stops after round {first - 1}" in private.over_budget(first)
    free = PrivateMean(PrivacySettings(name="central"), num_clients=10, per_round=10)
    assert free.over_budget(1000) is None
    assert PrivateMean(PrivacySettings(name="central", noise_multiplier=0.0), num_clients=10,
                       per_round=10).epsilon(1) == math.inf


def test_under_privacy_a_reply_carries_only_examples_and_steps():
    metrics = {NUM_EXAMPLES: 10, LOCAL_STEPS: 2, TRAIN_LOSS: 0.5, "logit-shift": 0.1}
    assert disclosed_metrics(metrics, PrivacySettings()) == metrics
    assert disclosed_metrics(metrics, PrivacySettings(name="distributed")) == {
        NUM_EXAMPLES: 10, LOCAL_STEPS: 2}


def test_the_strategy_takes_the_dp_mean_and_the_round_count_of_the_sample(fmnist_available):
    """A built strategy under privacy=central: its aggregate is PrivateMean's, its sample
    rate is the selection's share of the clients."""
    from driftfl.methods import build_strategy
    from driftfl.common.models import build_model

    cfg = check_experiment(compose(["privacy=central", "num_clients=40", "fraction=0.25",
                                    "model=mlp"]))
    model = build_model(cfg.model, (1, 28, 28), 10)
    strategy = build_strategy(cfg, model)
    assert strategy.private.sample_rate == 0.25 and strategy.private.per_round == 10
    assert build_strategy(check_experiment(compose(["model=mlp"])), model).private is None


@pytest.mark.parametrize("overrides, message", [
    (["privacy=central", "privacy.target_epsilon=0"], r"privacy.target_epsilon must be > 0"),
    (["privacy=central", "privacy.target_epsilon=-1"], r"privacy.target_epsilon must be > 0"),
    (["privacy=distributed", "privacy.delta=1"], r"privacy.delta must be in \(0, 1\)"),
    (["privacy=central", "privacy.noise_multiplier=0", "privacy.target_epsilon=4"],
     "privacy.target_epsilon needs noise"),
    (["privacy=central", "privacy.clip=0"], r"privacy.clip must be > 0"),
    (["privacy=central", "strategy=fedcsd"], "strategy.prototypes=exchange runs a prototype "
     "phase before training, a second exchange each round that neither covers; set "
     "strategy.prototypes=previous"),
    (["privacy=central", "strategy=fedproto"], "strategy.prototype_mean=weighted weighs each "
     "client's prototypes by its own class counts"),
    (["privacy=distributed", "strategy=feddyn"], "its h, a running sum of every client's own "
     "unclipped model would reach the server without clipping"),
    (["privacy=central", "privacy.payload_clip=3"], "privacy.payload_clip means nothing with "
     "strategy=fedavg"),
    (["privacy=central", "strategy=dcfl"], "condensed images"),
    (["privacy=central", "aggregation=krum"], "use aggregation=mean"),
    (["privacy=central", "strategy=fednova"], "aggregation=fednova"),
    (["privacy=central", "fraction_evaluate=0.5"], "set fraction_evaluate=0"),
    (["privacy=names"], "privacy"),
])
def test_bad_privacy_settings_are_one_line_before_anything_runs(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_experiment(compose(overrides))
    assert "\n" not in str(err.value)


def test_a_round_under_privacy_runs_through_the_real_client_app(fmnist_available, server_task):
    """The real ClientApp under privacy=distributed: every reply is a clipped, noised model
    with two metrics, and the round's DP mean replaces the global model."""
    from flwr.app import ConfigRecord
    from test_methods import InProcessGrid, fmnist_nodes

    from driftfl.common.protocol import DATASET_META, EXPERIMENT, model_to_arrays
    from driftfl.methods import build_strategy
    from driftfl.server.experiment import prepare_experiment
    from driftfl.server.survey import survey_clients
    from driftfl.strategies.aggregation import to_numpy

    experiment = prepare_experiment(compose(["privacy=distributed", "model=mlp",
                                             "dataset.subset=600", "dataset.test_subset=100",
                                             "num_clients=2"]))
    cfg, model = experiment.cfg, experiment.initial_model()
    strategy = build_strategy(cfg, model)
    grid = InProcessGrid(fmnist_nodes(2))
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, 2, node_wait=5, timeout=60))
    arrays = model_to_arrays(model)
    replies = grid.send_and_receive(strategy.configure_train(1, arrays, record, grid))
    start = to_numpy(arrays)
    for reply in replies:
        assert not reply.has_error(), reply.error
        assert set(reply.content[METRICS]) == {NUM_EXAMPLES, LOCAL_STEPS}
        sent = to_numpy(reply.content[ARRAYS])
        bound = strategy.private.reply_bound(sum(v.size for v in start.values()), 2)
        assert 1.0 < norm(sent, start) <= bound  # the clip, plus the noise share
    aggregate, _ = strategy.aggregate_train(1, replies)
    assert aggregate is not None and strategy.report.clients == 2
    assert strategy.report.train_metrics[LOCAL_STEPS] > 0
