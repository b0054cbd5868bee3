"""User-level differential privacy (DP-FedAvg) as a release part: clipping, the noise's scale and
source, the secret sample, survivors, the accountant over what each round released, the clients'
side, the budget stop and the refusals."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import Array, ArrayRecord

from driftfl.client.privacy import (disclosed_metrics, noise_shares, privatise,
                                    privatise_payload)
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.privacy import PrivacySettings, clip_update
from driftfl.common.protocol import ARRAYS, LOCAL_STEPS, METRICS, NUM_EXAMPLES, TRAIN_LOSS
from driftfl.methods import check_experiment
from driftfl.server.checkpoint import state_of
from driftfl.strategies.parts.aggregation import ClientUpdate
from driftfl.strategies.parts.release import (CentralRelease, DistributedRelease, Release,
                                              RoundFacts, SecureSum)

GLOBAL = {"w": np.zeros((50, 40), np.float32), "b": np.zeros(40, np.float32),
          "count": np.array(7, np.int64)}  # an integer buffer: not an update, never noised


def update(node: int, scale: float, examples: float = 100.0, seed: int = 0) -> ClientUpdate:
    rng = np.random.default_rng(seed)
    arrays = {k: (v + scale * rng.standard_normal(v.shape)).astype(v.dtype)
              if v.dtype.kind == "f" else v.copy() for k, v in GLOBAL.items()}
    return ClientUpdate(node, arrays, {NUM_EXAMPLES: examples, LOCAL_STEPS: 1.0}, None)


def norm(arrays, reference: dict = GLOBAL) -> float:
    if isinstance(arrays, list):  # a mean update, the float arrays in order
        return math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))
    return math.sqrt(sum(float(np.sum((arrays[k].astype(np.float64) - reference[k]) ** 2))
                         for k in reference if reference[k].dtype.kind == "f"))


def facts(sent: int) -> RoundFacts:
    return RoundFacts(GLOBAL, list(range(sent)), {}, "", list(range(sent)))


def central(clients: int = 100, rate: float = 1.0, **settings) -> CentralRelease:
    return CentralRelease(PrivacySettings(name="central", **settings), num_clients=clients,
                          per_round=max(1, round(rate * clients)), rate=rate)


def distributed(per_round: int, secure: bool = False, **settings) -> DistributedRelease:
    return DistributedRelease(PrivacySettings(name="distributed", **settings), num_clients=100,
                              per_round=per_round, secure=secure)


def rdp(rate: float, sigma: float, rounds: int, delta: float = 1e-5) -> float:
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation
                               .REPLACE_SPECIAL)
    event = dp_accounting.GaussianDpEvent(sigma)
    accountant.compose(event if rate >= 1 else dp_accounting.PoissonSampledDpEvent(rate, event),
                       rounds)
    return accountant.get_epsilon(delta)


def test_clip_scales_to_the_norm_and_leaves_small_updates_alone():
    clipped, before = clip_update([np.full(4, 3.0), np.full(1, 4.0)], 2.5)  # norm sqrt(52)
    assert before == pytest.approx(math.sqrt(52))
    assert math.sqrt(sum(float(np.sum(c ** 2)) for c in clipped)) == pytest.approx(2.5)
    small, _ = clip_update([np.array([0.3, 0.4])], 1.0)
    assert np.array_equal(small[0], [0.3, 0.4])


# -- central ------------------------------------------------------------------------------------
def test_central_no_client_moves_the_mean_by_more_than_clip_over_qn():
    """One client's huge update, four silent ones: without noise the mean moved by C / (q N)."""
    release = central(clients=5, clip=2.0, noise_multiplier=0.0)
    released = release.release(1, facts(5), [update(1, 100.0)])
    assert norm(released.mean_update) == pytest.approx(2.0 / 5, rel=1e-5)


def test_central_mean_counts_every_client_once_whatever_its_examples():
    a, b = update(1, 0.01, examples=10, seed=1), update(2, 0.01, examples=5000, seed=2)
    released = central(clients=2, clip=10.0, noise_multiplier=0.0).release(1, facts(2), [a, b])
    expected = (a.arrays["w"].astype(np.float64) + b.arrays["w"]) / 2
    assert np.allclose(released.mean_update[0], expected, atol=1e-7)


def test_central_noise_has_the_stated_scale_and_comes_from_the_operating_system():
    """sigma C / (q N) on the mean, drawn afresh: the same round twice differs, and nothing a
    checkpoint keeps (no seed) could regenerate it."""
    release = central(clients=4, clip=1.5, noise_multiplier=2.0)
    zero = [update(n, 0.0) for n in range(4)]
    first = release.release(1, facts(4), zero).mean_update
    noise = np.concatenate([first[0].ravel(), first[1].ravel()])
    assert noise.std() == pytest.approx(2.0 * 1.5 / 4, rel=0.05)
    assert abs(noise.mean()) < 0.05
    again = release.release(1, facts(4), zero).mean_update
    assert not np.array_equal(first[0], again[0])
    assert set(state_of(release)) == {"spent", "lost", "clip"}  # no noise seed is kept


def test_central_adds_noise_when_no_reply_is_accepted():
    """Every reply refused: the round still releases noise (never an unnoised, unchanged
    model, an event whose epsilon would be infinite), and the round is accounted."""
    release = central(clients=10, clip=1.0, noise_multiplier=1.0)
    released = release.release(3, facts(10), [])
    assert released.mean_update is not None and norm(released.mean_update) > 0
    assert release.columns(3)["dp_sigma"] == 1.0


def test_central_samples_by_poisson_from_the_operating_systems_entropy():
    """The sample that amplification is credited for is secret: not the seeded selection
    (repeatable from config.yaml), and not the same twice."""
    release = central(clients=100, rate=0.2)
    nodes = list(range(100))
    samples = [tuple(release.sample(nodes, lambda n: n[:20])) for _ in range(20)]
    assert len(set(samples)) == 20  # fresh every time
    sizes = [len(s) for s in samples]
    assert len(set(sizes)) > 1 and 10 < np.mean(sizes) < 30  # Poisson at q = 0.2
    assert Release().sample(nodes, lambda n: n[:20]) == nodes[:20]  # plain: the selection's


def dp_fedavg(release):
    from driftfl.strategies import FedAvg

    strategy = FedAvg()
    strategy.release = release
    strategy.global_arrays = {"w": np.array([1.0, 1.0], np.float32)}
    strategy.trained = [1, 2, 3, 4]
    return strategy


def peers():
    """Updates of norms 0.02, 0.02, 0.9, 0.9 (the issue's example)."""
    from test_reply_checks import train_reply

    return [train_reply(1, [1.02, 1.0], 5), train_reply(2, [1.0, 1.02], 5),
            train_reply(3, [1.9, 1.0], 5), train_reply(4, [1.0, 1.9], 5)]


def test_under_central_dp_no_client_decides_whether_anothers_reply_counts(server_task):
    """Plain rounds screen each update against the round's median: with norms [0.02, 0.02,
    0.9, 0.9] both 0.9 replies are rejected (over 30 x 0.02), so one client's data decides
    whether another's counts, outside the mechanism. Under central DP only per-client checks
    decide: all four enter."""
    plain = dp_fedavg(Release())
    plain.aggregate_train(1, peers())
    assert plain.report.clients == 2 and plain.report.rejected_partitions == ["node3", "node4"]
    private = dp_fedavg(central(clients=4, clip=10.0, noise_multiplier=0.0))
    arrays, _ = private.aggregate_train(1, peers())
    assert private.report.clients == 4 and private.report.rejected == []
    np.testing.assert_allclose(arrays["w"].numpy(), [1.0 + 0.92 / 4, 1.0 + 0.92 / 4], rtol=1e-6)


def test_under_central_dp_a_round_whose_replies_are_all_refused_still_releases_noise(
        server_task):
    """Every reply refused by its own checks (the wrong shape): the model is released with
    the round's noise, never unchanged and unnoised."""
    from test_reply_checks import train_reply

    private = dp_fedavg(central(clients=4, clip=1.0, noise_multiplier=1.0))
    arrays, _ = private.aggregate_train(1, [train_reply(n, [1.0, 1.0, 1.0], 5)
                                            for n in (1, 2, 3, 4)])
    assert private.report.clients == 0 and len(private.report.rejected) == 4
    assert arrays is not None and not np.array_equal(arrays["w"].numpy(), [1.0, 1.0])
    assert private.release.columns(1)["dp_sigma"] == 1.0
    # and the round's row says so: the model moved (by the noise alone), nothing was learnt
    assert private.report.model_updated


@pytest.mark.parametrize("q, sigma, rounds, delta", [(0.2, 1.0, 30, 1e-5), (1.0, 2.0, 5, 1e-6),
                                                    (0.05, 0.8, 100, 1e-5)])
def test_central_epsilon_is_the_librarys_own_figure_with_amplification(q, sigma, rounds, delta):
    release = central(clients=100, rate=q, noise_multiplier=sigma, delta=delta)
    for r in range(1, rounds + 1):
        release.release(r, facts(2), [])
    assert release.epsilon(rounds) == pytest.approx(rdp(q, sigma, rounds, delta), rel=1e-9)
    assert release.epsilon(0) == 0.0
    assert release.columns(rounds)["dp_q"] == q


# -- distributed --------------------------------------------------------------------------------
def test_distributed_credits_no_amplification():
    """The issue's setting: N = 100, 20 clients a round, sigma 1, 30 rounds, every noise share
    arriving. The server picks the sample, so epsilon is 30 Gaussian releases composed (39.8),
    not the subsampled figure (8.94) the sample rate would give."""
    release = distributed(20, secure=True, min_survivors=1.0)
    for r in range(1, 31):
        release.release(r, facts(20), [update(n, 0.0) for n in range(20)],
                        SecureSum([update(n, 0.0) for n in range(20)], {}, set(range(20)),
                                  [np.zeros((50, 40)), np.zeros(40)]))
    assert release.epsilon(30) == pytest.approx(rdp(1.0, 1.0, 30), rel=1e-9)
    assert release.epsilon(30) == pytest.approx(39.8, abs=0.05)
    assert release.columns(30)["dp_q"] == 1.0 and release.columns(30)["dp_sigma"] == 1.0


def test_distributed_noise_holds_with_min_survivors_and_nothing_is_released_below():
    """Shares sized for m_min = 10 of the 20 sent: with 10 survivors the sum carries sigma C
    (epsilon as recorded: the issue's 16.9 against 8.94 came from shares sized for 20); with
    5 the secure round unmasks nothing and nothing is spent; with 20 the noise is sigma
    sqrt(2)."""
    release = distributed(20, secure=True, min_survivors=0.5)
    assert release.shares == 10 and release.share_std(1.0) == pytest.approx(1 / math.sqrt(10))

    def secure_round(r, survivors):
        ups = [update(n, 0.0) for n in range(survivors)]
        unmasked = release.enough(survivors)  # what the secure receive asks before unmasking
        return release.release(r, facts(20), ups, SecureSum(
            ups, {}, set(range(survivors)),
            [np.zeros((50, 40)), np.zeros(40)] if unmasked else None, halted="too few"))

    assert not release.enough(5) and release.enough(10)
    assert secure_round(1, 10).withheld == ""
    assert release.columns(1)["dp_sigma"] == pytest.approx(1.0)
    assert secure_round(2, 5).withheld == "too few"
    assert release.columns(2)["dp_sigma"] == math.inf  # nothing released, nothing spent
    assert secure_round(3, 20).mean_update is not None
    assert release.columns(3)["dp_sigma"] == pytest.approx(math.sqrt(2))
    assert release.epsilon(3) == pytest.approx(released(1.0, [1.0, math.sqrt(2)]), rel=1e-9)
    # without SecAgg+ the shares arrived all the same: below m_min nothing is released, but
    # the server saw each share
    plain = distributed(20, min_survivors=0.5)
    below = plain.release(1, facts(20), [update(n, 0.0) for n in range(5)])
    assert "fewer than the 10 the noise needs" in below.withheld and below.mean_update is None
    assert plain.columns(1)["dp_sigma"] == pytest.approx(1 / math.sqrt(10))


def released(rate, sigmas, delta=1e-5):
    accountant = RdpAccountant()
    for sigma in sigmas:
        accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    return accountant.get_epsilon(delta)


def test_distributed_without_secagg_is_accounted_for_one_share():
    """Without SecAgg+ the curious server sees each client's update with its own share of the
    noise: its epsilon is that share's, sigma / sqrt(m_min) a round."""
    release = distributed(10, min_survivors=0.8)
    ups = [update(n, 0.0) for n in range(10)]
    release.release(1, facts(10), ups)
    assert release.columns(1)["dp_sigma"] == pytest.approx(1 / math.sqrt(8))
    assert "sees each client's update with only its own share" in release.plan(5)


def test_distributed_client_clips_and_adds_its_share_of_the_noise():
    settings = PrivacySettings(name="distributed", clip=1.0, noise_multiplier=1.0)
    received = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    trained = ArrayRecord({k: Array(v) for k, v in update(1, 5.0).arrays.items()})
    quiet = privatise(trained, received, settings.model_copy(update={"noise_multiplier": 0.0}),
                      shares=9)
    sent = {k: quiet[k].numpy() for k in quiet}
    assert norm(sent) == pytest.approx(1.0, rel=1e-5) and sent["count"] == 7
    noisy = privatise(ArrayRecord({k: Array(v) for k, v in GLOBAL.items()}), received,
                      settings, shares=9, rng=np.random.default_rng(3))
    share = noisy["w"].numpy().astype(np.float64)
    assert share.std() == pytest.approx(1.0 / 3, rel=0.05)  # sigma C / sqrt(m_min)
    # m_min shares sum to the noise central DP puts on the sum: sigma C
    total = sum(privatise(received, received, settings, shares=9,
                          rng=np.random.default_rng(s))["w"].numpy().astype(np.float64)
                for s in range(9))
    assert total.std() == pytest.approx(1.0, rel=0.05)
    unchanged = privatise(trained, received, PrivacySettings(name="central"), shares=9)
    assert unchanged is trained  # central: the server clips and noises
    # the client sizes its share from the experiment, not from a number the server sends
    cfg = compose(["privacy=distributed", "num_clients=20", "fraction=0.5"])
    assert noise_shares(cfg) == 8  # 0.8 of the 10 a round selects


def test_a_diverged_distributed_client_sends_zeros_noised_never_nan(capsys):
    """A NaN reply would tell the server, outside the noise, that this client's data made
    training diverge (and under SecAgg+ wreck the round's sum): the client sends a zero update
    and zero payload terms, noised as any other."""
    settings = PrivacySettings(name="distributed", clip=1.0, noise_multiplier=1.0)
    received = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    diverged = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
                for k, v in GLOBAL.items()}
    quiet = privatise(ArrayRecord({k: Array(v) for k, v in diverged.items()}), received,
                      settings.model_copy(update={"noise_multiplier": 0.0}), shares=9)
    assert all(np.array_equal(quiet[k].numpy(), GLOBAL[k]) for k in ("w", "b"))
    noisy = privatise(ArrayRecord({k: Array(v) for k, v in diverged.items()}), received,
                      settings, shares=9, rng=np.random.default_rng(3))
    share = noisy["w"].numpy().astype(np.float64) - GLOBAL["w"]
    assert np.isfinite(share).all() and share.std() == pytest.approx(1.0 / 3, rel=0.05)
    payload = {"delta": ArrayRecord({"c": Array(np.array([np.inf, 1.0, 2.0]))})}
    sent = privatise_payload(payload, settings.model_copy(update={"noise_multiplier": 0.0}),
                             9, ("delta", ["c"]))
    assert np.array_equal(sent["delta"]["c"].numpy(), np.zeros(3))
    assert "not finite (training diverged)" in capsys.readouterr().err


def test_distributed_server_refuses_an_update_beyond_clip_and_noise():
    release = distributed(10, min_survivors=10)
    honest = update(1, release.share_std(1.0))  # what the noise share alone gives
    assert release.admit(honest, facts(10)) is None
    reason = release.admit(update(2, 1.0), facts(10))
    assert reason and "exceeds what privacy=distributed lets a client send" in reason
    lazy = release.admit(update(3, 0.001), facts(10))  # clipped, but no noise share added
    assert lazy and "did not add the noise privacy=distributed asks for" in lazy
    # distributed: the server does not clip again, the clients' noise is already in
    released_ = distributed(10, min_survivors=1).release(1, facts(1), [honest])
    assert np.allclose(released_.mean_update[0], honest.arrays["w"])


# -- the budget, the replies, the refusals ------------------------------------------------------
def test_the_budget_stops_before_the_round_that_would_exceed_it():
    release = central(clients=100, rate=0.2, noise_multiplier=1.0, target_epsilon=5.0)
    first = None
    for r in range(1, 50):
        if release.stop_before(r):
            first = r
            break
        release.release(r, facts(2), [])
    assert release.epsilon(first - 1) <= 5.0 < release.projected(1, first - 1)
    assert f"round {first} would spend epsilon" in release.stop_before(first)
    assert f"the run stops after round {first - 1}" in release.stop_before(first)
    assert central(clients=10).stop_before(1000) is None
    noiseless = central(clients=10, noise_multiplier=0.0)
    noiseless.release(1, facts(1), [])
    assert noiseless.epsilon(1) == math.inf


def test_under_privacy_a_reply_carries_only_examples_and_steps():
    metrics = {NUM_EXAMPLES: 10, LOCAL_STEPS: 2, TRAIN_LOSS: 0.5, "logit-shift": 0.1}
    assert disclosed_metrics(metrics, PrivacySettings()) == metrics
    assert disclosed_metrics(metrics, PrivacySettings(name="distributed")) == {
        NUM_EXAMPLES: 10, LOCAL_STEPS: 2}


def test_the_strategy_takes_its_release_from_the_config(fmnist_available):
    from driftfl.common.models import build_model
    from driftfl.methods import build_strategy

    cfg = check_experiment(compose(["privacy=central", "num_clients=40", "fraction=0.25",
                                    "model=mlp"]))
    model = build_model(cfg.model, (1, 28, 28), 10)
    strategy = build_strategy(cfg, model)
    assert isinstance(strategy.release, CentralRelease)
    assert strategy.release.rate == 0.25 and strategy.release.expected == 10
    plain = build_strategy(check_experiment(compose(["model=mlp"])), model)
    assert type(plain.release) is Release and plain.release.compares_clients


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
    (["privacy=distributed", "privacy.min_survivors=12"], "set privacy.min_survivors at most 10"),
    (["privacy=distributed", "privacy.min_survivors=0"], "must be a count >= 1 or a share"),
    (["privacy=central", "privacy.min_survivors=3"],
     "privacy.min_survivors is not a setting of privacy=central; privacy options that have it: "
     "distributed"),
    (["privacy=distributed", "privacy.adaptive_clip=true"],
     "privacy.adaptive_clip is not a setting of privacy=distributed; privacy options that have "
     "it: central"),
    (["privacy=central", "privacy.target_quantile=0.7"], "add privacy.adaptive_clip=true"),
    (["privacy=central", "privacy.adaptive_clip=true"], "set privacy.count_noise=1 or more"),
])
def test_bad_privacy_settings_are_one_line_before_anything_runs(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_experiment(compose(overrides))
    assert "\n" not in str(err.value)


def test_settings_of_the_other_mode_are_refused_from_json_too():
    """A deployed experiment arrives as JSON, past Hydra's own key check: the schema refuses."""
    with pytest.raises(ValueError, match="min_survivors is for privacy=distributed"):
        PrivacySettings(name="central", min_survivors=3)
    with pytest.raises(ValueError, match="adaptive_clip is for privacy=central"):
        PrivacySettings(name="distributed", adaptive_clip=True)


def test_a_round_under_privacy_runs_through_the_real_client_app(fmnist_available, server_task):
    """The real ClientApp under privacy=distributed: every reply is a clipped, noised model
    with two metrics, and the round's DP mean replaces the global model."""
    from flwr.app import ConfigRecord
    from test_methods import InProcessGrid, fmnist_nodes

    from driftfl.common.protocol import DATASET_META, EXPERIMENT, model_to_arrays
    from driftfl.methods import build_strategy
    from driftfl.server.experiment import prepare_experiment
    from driftfl.server.survey import survey_clients
    from driftfl.strategies.parts.aggregation import to_numpy

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
        assert 1.0 < norm(sent, start) <= strategy.release.reply_bound(strategy.facts())
    aggregate, _ = strategy.aggregate_train(1, replies)
    assert aggregate is not None and strategy.report.clients == 2
    assert strategy.report.train_metrics[LOCAL_STEPS] > 0


def test_no_method_reads_the_privacy_mode():
    """Privacy and secure aggregation are the release part's: base.py and the methods (their
    strategies and objectives) only read what a release declares, never the mode itself."""
    import ast

    from conftest import REPO

    files = [p for p in (REPO / "driftfl" / "strategies").glob("*.py")]
    files += list((REPO / "driftfl" / "client" / "objectives").glob("*.py"))
    readers = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"privacy", "private", "secagg"}:
                readers.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert readers == []


def test_adaptive_clipping_follows_the_quantile_within_the_same_budget():
    """Andrew et al.'s geometric update: every update of norm 5, C from 1 towards the median
    norm; the count's noise and the update's together spend what sigma alone would."""
    release = central(clients=10, clip=1.0, noise_multiplier=0.0, adaptive_clip=True)
    ups = [update(n, 5.0 / math.sqrt(2040)) for n in range(10)]  # norm ~5 each
    for r in range(1, 40):
        release.release(r, facts(10), ups)
    assert 4.0 < release.clip < 6.5
    assert release.columns(39)["dp_clip"] == release.clip
    noisy = central(clients=100, rate=0.2, noise_multiplier=1.0, adaptive_clip=True,
                    count_noise=5.0)
    plain = central(clients=100, rate=0.2, noise_multiplier=1.0)
    sigmas = noisy.multipliers()
    assert sigmas[0] > 1.0 and sigmas[-1] == 10.0  # 2 x count_noise: sensitivity 1/2
    for r in range(1, 11):
        noisy.release(r, facts(2), [])
        plain.release(r, facts(2), [])
    assert noisy.epsilon(10) == pytest.approx(plain.epsilon(10), rel=1e-6)
