"""A method's payload taken as a sum (SCAFFOLD's Delta c_k, FedProto's and FedCSD's class
prototypes) under differential privacy and secure aggregation: clipped to privacy.payload_clip,
noised by sigma x payload_clip on the sum, composed by the accountant, carried in SecAgg+'s masked
vector; and the method's state made of that sum alone."""

from __future__ import annotations

import copy

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from driftfl.client.privacy import privatise_payload
from driftfl.common.config import compose
from driftfl.common.privacy import PrivacySettings
from driftfl.common.protocol import (CONTROL_DELTA, DATASET_META, EXPERIMENT,
                                     FEATURE_PROTOTYPES, PROTOTYPES, model_to_arrays)
from driftfl.methods import build_strategy, check_experiment
from driftfl.server.experiment import prepare_experiment
from driftfl.server.secure import round_clipping_range, secure_train_round
from driftfl.server.survey import survey_clients
from driftfl.strategies.parts.aggregation import ClientUpdate
from driftfl.strategies.parts.release import CentralRelease, DistributedRelease, RoundFacts
from driftfl.strategies.methods.prototypes import from_sum, holders
from test_methods import InProcessGrid, fmnist_nodes
from test_secagg import RecordingGrid

CLIENTS = 3
TINY = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=200", f"num_clients={CLIENTS}",
        "rounds=1", "logit_shift_samples=32"]


def settings(name: str, sigma: float = 0.0, clip: float = 1.0) -> PrivacySettings:
    return PrivacySettings(name=name, noise_multiplier=sigma, payload_clip=clip)


def l2(arrays) -> float:
    return float(np.sqrt(sum(np.sum(np.square(a, dtype=np.float64)) for a in arrays)))


# -- the mechanism --------------------------------------------------------------------------
GLOBAL = {"w": np.zeros(3, np.float32)}
SHAPES = {"a": (2,), "b": (1,)}


def facts(sent: int, payload=SHAPES) -> RoundFacts:
    return RoundFacts(GLOBAL, list(range(sent)), payload, CONTROL_DELTA, list(range(sent)))


def with_payload(node: int, terms: list[np.ndarray]) -> ClientUpdate:
    """A reply whose model did not move, with these payload terms (SHAPES' arrays)."""
    record = ArrayRecord({k: Array(np.asarray(t, np.float32)) for k, t in zip(SHAPES, terms)})
    message = Message(RecordDict({CONTROL_DELTA: record}), dst_node_id=node, message_type="train")
    return ClientUpdate(node, dict(GLOBAL), {}, message)


def central(clients: int, sigma: float, clip: float = 1.0, payload: str = "a payload"):
    return CentralRelease(settings("central", sigma, clip), num_clients=clients,
                          per_round=clients, rate=1.0, payload=payload)


def test_epsilon_composes_the_payloads_gaussian_inside_the_sampled_round():
    """Two Gaussian sums a round (the update's and the payload's, each clipped to its own norm,
    noised by the same sigma), in one Poisson sample: dp-accounting's own figure, and more than
    the update's alone."""
    plain = CentralRelease(settings("central", 1.1), num_clients=100, per_round=20, rate=0.2)
    both = CentralRelease(settings("central", 1.1), num_clients=100, per_round=20, rate=0.2,
                          payload="SCAFFOLD's control deltas")
    for r in range(1, 31):
        plain.release(r, facts(1, {}), [])
        both.release(r, facts(1), [])
    gaussian = dp_accounting.GaussianDpEvent(1.1)
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.2, dp_accounting.ComposedDpEvent([gaussian, gaussian])), 30))
    assert both.epsilon(30) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert both.epsilon(30) > 1.2 * plain.epsilon(30)
    assert both.columns(30)["dp_sigma_payload"] == 1.1 and "dp_sigma_payload" not in \
        plain.columns(30)


def test_central_clips_each_term_and_noises_the_sum_by_sigma_times_the_payload_clip(
        server_task):
    release = central(2, 0.0, clip=1.0)
    big = with_payload(1, [np.array([3.0, 4.0]), np.array([0.0])])
    small = with_payload(2, [np.array([0.0, 0.5]), np.array([0.0])])
    total = release.release(1, facts(2), [big, small]).payload_sum
    np.testing.assert_allclose(total["a"], [0.6, 0.8 + 0.5])  # 5 -> 1, 0.5 kept
    # one client moves the sum by at most the clip, however large its term
    huge = with_payload(1, [np.array([3e6, 4e6]), np.array([0.0])])
    moved = release.release(2, facts(2), [huge, small]).payload_sum
    assert l2([moved["a"] - np.array([0.0, 0.5])]) <= 1.0 + 1e-6
    noisy = CentralRelease(settings("central", 2.0, clip=0.5), num_clients=2, per_round=2,
                           rate=1.0, payload="a payload")
    wide = {"a": (200_000,)}
    quiet = ClientUpdate(1, dict(GLOBAL), {}, Message(RecordDict({CONTROL_DELTA: ArrayRecord(
        {"a": Array(np.zeros(200_000, np.float32))})}), dst_node_id=1, message_type="train"))
    noise = noisy.release(3, facts(2, wide), [quiet]).payload_sum["a"]
    assert np.std(noise) == pytest.approx(2.0 * 0.5, rel=0.01)
    again = noisy.release(3, facts(2, wide), [quiet]).payload_sum["a"]
    assert not np.array_equal(noise, again)  # the operating system's noise, never a seed's


def test_a_distributed_client_clips_its_payload_and_adds_its_share_of_the_noise():
    rng = np.random.default_rng(0)
    control = ArrayRecord({"w": Array(np.full((30, 20), 0.5, np.float32)),
                           "b": Array(np.full(20, 0.5, np.float32))})
    out = privatise_payload({CONTROL_DELTA: control, "other": control},
                            settings("distributed", 0.0, clip=2.0), shares=4,
                            summed=(CONTROL_DELTA, ["b", "w"]), rng=rng)
    sent = [out[CONTROL_DELTA][k].numpy() for k in ("b", "w")]
    assert l2(sent) == pytest.approx(2.0, rel=1e-6)  # clipped, direction kept
    assert np.allclose(sent[1], sent[1].flat[0]) and sent[1].dtype == np.float32
    assert set(out) == {CONTROL_DELTA}  # no other record leaves a client under DP
    counts = np.array([5, 0, 7], np.int64)
    protos = ArrayRecord({"prototypes": Array(np.full((3, 4), 2.0, np.float32)),
                          "counts": Array(counts)})
    out = privatise_payload({FEATURE_PROTOTYPES: protos}, settings("distributed", 0.0, clip=2.0),
                            shares=4, summed=(FEATURE_PROTOTYPES, ["prototypes"]), rng=rng)
    assert l2([out[FEATURE_PROTOTYPES]["prototypes"].numpy()]) == pytest.approx(2.0, rel=1e-6)
    # the per-class counts stay on the client: the server's denominators are public
    assert set(out[FEATURE_PROTOTYPES].keys()) == {"prototypes"}
    assert privatise_payload({FEATURE_PROTOTYPES: protos}, settings("distributed"), shares=4,
                             summed=None) == {}  # nothing named: nothing leaves
    big = ArrayRecord({"w": Array(np.zeros(400_000, np.float32))})
    noised = privatise_payload({CONTROL_DELTA: big}, settings("distributed", 1.5, clip=2.0),
                               shares=9, summed=(CONTROL_DELTA, ["w"]), rng=rng
                               )[CONTROL_DELTA]["w"].numpy()
    assert np.std(noised) == pytest.approx(1.5 * 2.0 / 3, rel=0.01)  # sigma C_p / sqrt(m_min)
    central_ = privatise_payload({CONTROL_DELTA: big}, settings("central", 1.5), shares=9,
                                 summed=(CONTROL_DELTA, ["w"]))
    assert central_[CONTROL_DELTA] is big  # the server clips and noises


def test_a_distributed_payload_beyond_its_clip_and_noise_is_refused(server_task):
    private = PrivacySettings(name="distributed", noise_multiplier=1.0, payload_clip=2.0,
                              min_survivors=4)
    release = DistributedRelease(private, num_clients=10, per_round=4, payload="a payload")
    wide = {"a": (10_000,)}
    share = 1.0 * 2.0 / 2  # sigma C_p / sqrt(m_min)

    def reply(term):
        return ClientUpdate(1, dict(GLOBAL), {}, Message(RecordDict({CONTROL_DELTA: ArrayRecord(
            {"a": Array(term.astype(np.float32))})}), dst_node_id=1, message_type="train"))

    honest = np.full(10_000, 2.0 / 100) + np.random.default_rng(1).normal(0, share, 10_000)
    assert release.admit(reply(honest), facts(4, wide)) is None
    assert "exceeds what privacy=distributed lets a client send" in release.admit(
        reply(np.full(10_000, 5.0)), facts(4, wide))
    assert "is not [10000] finite floats" in release.admit(reply(np.zeros(3)), facts(4, wide))


def test_prototypes_from_the_sum_divide_by_the_surveyed_holders():
    histograms = {1: np.array([3, 0, 2]), 2: np.array([1, 0, 0]), 3: np.array([0, 0, 4])}
    held = holders(histograms, [1, 2, 3], 3)
    np.testing.assert_array_equal(held, [2, 0, 2])
    total = np.array([[2.0, 4.0], [0.0, 0.0], [6.0, 2.0]])
    prototypes, present = from_sum(total, held)
    np.testing.assert_allclose(prototypes, [[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]])
    np.testing.assert_array_equal(present, [True, False, True])


# -- through the real ClientApp --------------------------------------------------------------
def start(overrides, grid_class=InProcessGrid, **grid_args):
    experiment = prepare_experiment(compose([*TINY, *overrides]))
    cfg, model = experiment.cfg, experiment.initial_model()
    strategy = build_strategy(cfg, model)
    grid = grid_class(fmnist_nodes(CLIENTS), **grid_args)
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, CLIENTS, node_wait=5, timeout=60))
    return cfg, strategy, grid, record, model_to_arrays(model)


def plain_payloads(overrides, record_name):
    """Each node's payload term in a round without privacy or secagg (the clients train
    deterministically: what the protected round's clients computed before clipping)."""
    cfg, strategy, grid, record, arrays = start(overrides)
    replies = grid.send_and_receive(strategy.configure_train(1, arrays, record, grid))
    out = {}
    for reply in replies:
        payload = reply.content.array_records[record_name]
        keys = sorted(payload.keys()) if record_name == CONTROL_DELTA else ["prototypes"]
        out[reply.metadata.src_node_id] = [payload[k].numpy().astype(np.float64) for k in keys]
    return out


def clipped(term, clip):
    scale = min(1.0, clip / l2(term))
    return [t * scale for t in term]


@pytest.mark.parametrize("name", ["central", "distributed"])
def test_scaffold_under_privacy_moves_c_by_the_clipped_sum_over_k(fmnist_available, server_task,
                                                                   name):
    private = [f"privacy={name}", "privacy.noise_multiplier=0", "privacy.payload_clip=0.05"]
    cfg, strategy, grid, record, arrays = start(["strategy=scaffold", *private])
    replies = grid.send_and_receive(strategy.configure_train(1, arrays, record, grid))
    assert strategy.aggregate_train(1, replies)[0] is not None
    assert strategy.report.rejected == [] and strategy.report.refused_state == []
    terms = plain_payloads(["strategy=scaffold"], CONTROL_DELTA)
    assert all(l2(t) > 0.05 for t in terms.values())  # the clip bites
    expected = sum(np.concatenate([c.ravel() for c in clipped(t, 0.05)]) for t in terms.values())
    control = np.concatenate([strategy.control[k].ravel() for k in sorted(strategy.control)])
    np.testing.assert_allclose(control, expected / CLIENTS, atol=1e-7)


def test_fedproto_under_central_privacy_is_the_clipped_sum_over_the_holders_sent_a_message(
        fmnist_available, server_task):
    """A client that sent nothing back adds a zero term but still counts as a holder: the
    denominator is public (the survey), never the replies' own counts."""
    private = ["privacy=central", "privacy.noise_multiplier=0", "privacy.payload_clip=2"]
    cfg, strategy, grid, record, arrays = start(["strategy=fedproto",
                                                 "strategy.prototype_mean=plain", *private])
    replies = list(grid.send_and_receive(strategy.configure_train(1, arrays, record, grid)))
    silent = replies[0].metadata.src_node_id
    assert strategy.aggregate_train(1, replies[1:])[0] is not None
    terms = plain_payloads(["strategy=fedproto", "strategy.prototype_mean=plain"],
                           FEATURE_PROTOTYPES)
    total = sum(clipped(t, 2.0)[0] for n, t in terms.items() if n != silent)
    held = holders(strategy.clients.histograms, list(terms), strategy.num_classes)
    expected, present = from_sum(total, held)
    np.testing.assert_allclose(strategy.prototypes, expected, atol=1e-6)
    np.testing.assert_array_equal(strategy.present, present)


# -- through SecAgg+ --------------------------------------------------------------------------
def test_scaffold_through_secagg_moves_c_by_the_sum_of_the_control_deltas(fmnist_available,
                                                                         server_task):
    """Without DP each client weighs its example count in SecAgg+; its Delta c_k still enters
    c once (the payload-scale undoes the weight). Exact within SecAgg+'s quantisation."""
    cfg, strategy, grid, record, arrays = start(["strategy=scaffold", "secagg=secaggplus"],
                                                RecordingGrid)
    assert secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60) is not None
    assert strategy.report.clients == CLIENTS and strategy.report.refused_state == []
    for stage, msg in grid.sent:  # the control deltas never travel in the clear
        assert CONTROL_DELTA not in msg.content.array_records
    for stage, reply in grid.replies:
        assert CONTROL_DELTA not in reply.content.array_records
    terms = plain_payloads(["strategy=scaffold"], CONTROL_DELTA)
    expected = sum(np.concatenate([c.ravel() for c in t]) for t in terms.values()) / CLIENTS
    control = np.concatenate([strategy.control[k].ravel() for k in sorted(strategy.control)])
    level = 2 * round_clipping_range(strategy, cfg.secagg) / cfg.secagg.quantization_range
    bound = CLIENTS * CLIENTS * level / CLIENTS + 1e-6  # a level per client, times m, over K
    assert np.abs(control - expected).max() <= bound
    assert np.abs(expected).max() > 100 * bound  # it moved


def test_fedcsd_prototypes_through_secagg_and_distributed_dp_after_a_dropout(
        fmnist_available, server_task):
    """prototypes=previous under privacy=distributed (no noise, to compare) and SecAgg+: P_G is
    the survivors' clipped P_k summed, over the holders among the survivors."""
    drop = 101
    overrides = ["strategy=fedcsd", "strategy.prototypes=previous"]
    private = ["secagg=secaggplus", "privacy=distributed", "privacy.noise_multiplier=0",
               "privacy.payload_clip=0.5", "privacy.min_survivors=2"]
    cfg, strategy, grid, record, arrays = start([*overrides, *private], RecordingGrid, drop=drop)
    assert secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60) is not None
    assert strategy.report.clients == CLIENTS - 1
    terms = plain_payloads(overrides, PROTOTYPES)
    assert all(l2(t) > 0.5 for t in terms.values())  # the clip bites
    survivors = [n for n in terms if n != drop]
    total = sum(clipped(terms[n], 0.5)[0] for n in survivors)
    expected, present = from_sum(total, holders(strategy.clients.histograms, survivors, 10))
    level = 2 * round_clipping_range(strategy, cfg.secagg) / cfg.secagg.quantization_range
    assert np.abs(strategy.prototypes - expected).max() <= CLIENTS * CLIENTS * level + 1e-5
    np.testing.assert_array_equal(strategy.present, present)


def test_the_payload_clip_defaults_to_the_methods_own():
    assert check_experiment(compose(["privacy=central", "strategy=scaffold"])
                            ).privacy.payload_clip == 0.3
    assert check_experiment(compose(["privacy=central", "strategy=fedproto",
                                     "strategy.prototype_mean=plain"])).privacy.payload_clip == 10
    assert check_experiment(compose(["privacy=central", "strategy=scaffold",
                                     "privacy.payload_clip=0.7"])).privacy.payload_clip == 0.7
    assert check_experiment(compose(["privacy=central"])).privacy.payload_clip is None


def test_the_plan_says_what_the_payload_costs(fmnist_available):
    from driftfl.common.models import build_model

    cfg = check_experiment(compose(["privacy=central", "strategy=scaffold", "num_clients=10",
                                    "model=mlp"]))
    release = build_strategy(cfg, build_model(cfg.model, (1, 28, 28), 10)).release
    assert release.payload == "SCAFFOLD's control deltas"
    plan = release.plan(5)
    assert ("SCAFFOLD's control deltas clipped to privacy.payload_clip=0.3 per client and "
            "summed with noise 1 x 0.3; epsilon composes both sums") in plan
    assert copy.deepcopy(release).projected(5) == release.projected(5)


def test_fedcurv_through_secagg_keeps_totals_and_each_node_takes_its_own_terms_out(
        fmnist_available, server_task):
    """Under SecAgg+ the server holds only P_all = sum_k F_k and Q_all = sum_k F_k w_k (the
    round's masked sum of each node's change of terms); the next train message carries them
    with the round whose terms of the node they hold, and the node's own objective takes its
    terms out: P = P_all - F_k, Q = Q_all - F_k w_k, the plain method's 'everyone but me'."""
    from driftfl.client.job import ClientJob
    from driftfl.client.objectives import build_objective
    from driftfl.common.protocol import ARRAYS, FISHER, FISHER_PENALTY, INCLUDED_ROUND

    cfg, strategy, grid, record, arrays = start(["strategy=fedcurv", "secagg=secaggplus"],
                                                RecordingGrid)
    assert strategy.summed and not strategy.fisher
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.refused_state == []
    assert strategy.included == {n: 1 for n in grid.contexts}
    for stage, reply in grid.replies:  # no Fisher term travels in the clear
        assert not {FISHER, "fisher-delta"} & set(reply.content.array_records)
    # the plain method's terms of the same round (the clients train deterministically)
    _, plain, plain_grid, plain_record, _ = start(["strategy=fedcurv"])
    plain.aggregate_train(1, plain_grid.send_and_receive(plain.configure_train(
        1, arrays, plain_record, plain_grid)))
    assert len(plain.fisher) == CLIENTS
    level = 2 * round_clipping_range(strategy, cfg.secagg) / cfg.secagg.quantization_range
    bound = CLIENTS * CLIENTS * level + 1e-7
    for k in plain.param_keys:
        assert np.abs(strategy.totals_f[k] - sum(f[k] for f in plain.fisher.values())
                      ).max() <= bound
        assert np.abs(strategy.totals_g[k] - sum(g[k] for g in plain.weighted.values())
                      ).max() <= bound
    # round 2: node 101 is told its round-1 terms are in the totals and takes them out
    messages = {m.metadata.dst_node_id: m for m in strategy.configure_train(2, new, record,
                                                                           grid)}
    knowledge = messages[101].content[FISHER_PENALTY]
    assert int(knowledge[INCLUDED_ROUND].numpy()[0]) == 1
    job = ClientJob.from_message(messages[101], grid.contexts[101])
    model = job.model(ARRAYS)
    objective = build_objective("curv", cfg.strategy, job)
    objective.prepare(model, *job.tensors())
    plain.totals = {k: (sum(f[k] for f in plain.fisher.values()),
                        sum(g[k] for g in plain.weighted.values())) for k in plain.param_keys}
    expected = plain.node_knowledge(2, 101)[FISHER_PENALTY]
    for k in plain.param_keys:
        want = expected[f"penalty.{k}"].numpy()
        got = objective.penalty[k].numpy()
        # up to the quantisation, where the noise-free total less its own term is positive
        assert np.abs(got - np.clip(want, 0, None)).max() <= bound + 1e-6
        assert np.abs(objective.anchor[k].numpy() - np.where(
            got > 0, expected[f"anchor.{k}"].numpy(), 0.0)).max() <= bound + 1e-6


def test_a_fedcurv_node_whose_change_was_not_summed_keeps_its_old_terms(fmnist_available,
                                                                        server_task):
    """A node that dropped out after sharing its keys: the totals lack its change, the server
    says so (included-round -1), and the node drops what it had sent, takes nothing out, and
    next sends its whole terms as the change."""
    from driftfl.client.job import ClientJob
    from driftfl.client.objectives import build_objective
    from driftfl.client.objectives.curv import PENDING_STATE, SUMMED_STATE
    from driftfl.common.protocol import ARRAYS, FISHER_PENALTY

    drop = 101
    cfg, strategy, grid, record, arrays = start(["strategy=fedcurv", "secagg=secaggplus"],
                                                RecordingGrid, drop=drop)
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and drop not in strategy.included and len(strategy.included) == 2
    assert PENDING_STATE in grid.contexts[drop].state.array_records  # it sent a change
    messages = {m.metadata.dst_node_id: m for m in strategy.configure_train(2, new, record,
                                                                           grid)}
    job = ClientJob.from_message(messages[drop], grid.contexts[drop])
    objective = build_objective("curv", cfg.strategy, job)
    objective.prepare(job.model(ARRAYS), *job.tensors())
    assert SUMMED_STATE not in grid.contexts[drop].state.array_records
    assert all(not v.any() for v in objective.kept.values())
    totals = messages[drop].content[FISHER_PENALTY]
    for k in strategy.param_keys:  # the totals, the others' terms only, as they are
        np.testing.assert_array_equal(objective.penalty[k].numpy(),
                                      np.clip(totals[f"penalty.{k}"].numpy(), 0, None))
