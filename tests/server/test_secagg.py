"""Secure aggregation: Flower's SecAgg+ protocol run by driftfl.server.secure over the real
ClientApp (in process), its refusals, and the client mods that leave other messages alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from driftfl.client.secure import only_secagg
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import (ARRAYS, DATASET_META, EXPERIMENT, LOCAL_STEPS,
                                     NUM_EXAMPLES, model_to_arrays)
from driftfl.methods import build_strategy, check_experiment
from driftfl.server.survey import survey_clients
from driftfl.server.experiment import prepare_experiment
from driftfl.common.privacy import float_keys
from driftfl.server.secure import check_weights, round_clipping_range, secure_train_round
from driftfl.server.traffic import MeteredGrid
from driftfl.strategies.parts.aggregation import to_numpy
from test_methods import InProcessGrid, fmnist_nodes

CLIENTS = 3
TINY = ["secagg=secaggplus", "model=mlp", "dataset.subset=2000", "dataset.test_subset=200",
        f"num_clients={CLIENTS}", "rounds=1", "logit_shift_samples=32"]


SURVEYED: list[dict] = []  # the last survey's clients


def stage(msg: Message) -> str | None:
    if msg.has_content() and RECORD_KEY_CONFIGS in msg.content.config_records:
        return msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE)
    return None


class RecordingGrid(InProcessGrid):
    """Keeps every message and reply; ``drop``: the node whose collect-stage reply is lost
    (it took part in setup and key sharing, then dropped out)."""

    def __init__(self, node_configs, drop: int | None = None):
        super().__init__(node_configs)
        self.drop, self.sent, self.replies = drop, [], []

    def send_and_receive(self, messages, timeout=None):
        # each node gets its own copy, as over the wire: the workflow sends one RecordDict to
        # every node in the setup stage, and Flower's mod pops the stage from it
        messages = list(messages)
        stages = [stage(m) for m in messages]
        replies = super().send_and_receive([copy.deepcopy(m) for m in messages], timeout)
        self.sent += list(zip(stages, messages))
        self.replies += list(zip(stages, replies))
        return [r for s, r in zip(stages, replies)
                if not (s == Stage.COLLECT_MASKED_VECTORS and r.metadata.src_node_id == self.drop)]


def setup(grid_factory, overrides=()):
    experiment = prepare_experiment(compose([*TINY, *overrides]))
    cfg = experiment.cfg
    model = experiment.initial_model()
    strategy = build_strategy(cfg, model)
    grid = grid_factory(fmnist_nodes(CLIENTS))
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    clients = survey_clients(grid, record, CLIENTS, node_wait=5, timeout=60)
    strategy.meet(clients)
    SURVEYED[:] = clients
    return cfg, strategy, grid, record, model_to_arrays(model), clients


def plain_updates(record, arrays, clients, strategy_round=1, overrides=()):
    """Each client's update and example count in a plain (unsecured) train round of the same
    experiment: the clients train deterministically, so these are what SecAgg+ carried."""
    cfg, strategy, grid, record, arrays, _ = setup(InProcessGrid, overrides)
    replies = grid.send_and_receive(strategy.configure_train(strategy_round, arrays, record, grid))
    global_arrays = to_numpy(arrays)
    out = {}
    for reply in replies:
        trained = to_numpy(reply.content[ARRAYS])
        out[reply.metadata.src_node_id] = (
            {k: trained[k].astype(np.float64) - global_arrays[k] for k in float_keys(
                global_arrays)}, reply.content["metrics"][NUM_EXAMPLES])
    return out


def clipping(strategy, cfg) -> float:
    """The clipping range the round just run used (secagg.clipping_range=auto: derived)."""
    return round_clipping_range(strategy, cfg.secagg)


def error_bound(cfg, counts, updates, clipping_range):
    """|secure mean - example-weighted mean| per coordinate: Flower's stochastic rounding moves
    each client's weighted coordinate by less than one level, 2 clipping_range /
    quantization_range, and the weights themselves are rounded to 1 / quantization_range."""
    s = cfg.secagg
    level = 2 * clipping_range / s.quantization_range
    n = np.array(counts, dtype=np.float64)
    max_weight = max(c["num_examples"] for c in SURVEYED)  # round_max_weight: the largest
    dq = np.round(n / max_weight * s.quantization_range) / s.quantization_range
    quantisation = len(n) * level / dq.sum()
    weights = np.abs(dq / dq.sum() - n / n.sum()).sum()
    largest = max(np.abs(v).max() for u in updates for v in u.values())
    return quantisation + weights * largest + 1e-6  # + float32 rounding of the new model


def weighted(updates, counts):
    n = np.array(counts, dtype=np.float64) / sum(counts)
    return {k: sum(w * u[k] for w, u in zip(n, updates)) for k in updates[0]}


def check_aggregate(cfg, strategy, new, arrays, updates, counts, step=1.0):
    expected = {k: step * v for k, v in weighted(updates, counts).items()}
    bound = step * error_bound(cfg, counts, updates, clipping(strategy, cfg))
    global_arrays = to_numpy(arrays)
    worst = max(np.abs(new[k] - global_arrays[k] - expected[k]).max() for k in expected)
    print(f"secure vs plain: worst {worst:.3g}, bound {bound:.3g}")
    assert worst <= bound, (worst, bound)
    assert any(np.abs(expected[k]).max() > 100 * bound for k in expected)  # it moved
    return worst, bound


def test_the_secure_aggregate_is_the_plain_fedavg_mean_within_the_quantisation_error(
        fmnist_available, server_task):
    cfg, strategy, grid, record, arrays, clients = setup(
        lambda nodes: MeteredGrid(RecordingGrid(nodes)))
    grid.take()
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == CLIENTS
    assert strategy.report.rejected == [] and strategy.report.refused_aggregate == ""
    assert strategy.report.train_metrics[NUM_EXAMPLES] == sum(c["num_examples"] for c in clients)
    plain = plain_updates(record, arrays, clients)
    nodes = sorted(plain)
    check_aggregate(cfg, strategy, to_numpy(new), arrays, [plain[n][0] for n in nodes],
                    [plain[n][1] for n in nodes])
    traffic = grid.take()  # the metered grid counted all four stages
    assert traffic["bytes_up_metrics"] > 0 and traffic["bytes_up_other"] > 0
    assert traffic["bytes_down_arrays"] > 0 and "bytes_up_arrays" not in traffic


def test_a_client_that_drops_after_sharing_its_keys_leaves_the_mean_of_the_others(
        fmnist_available, server_task):
    drop = 101
    cfg, strategy, grid, record, arrays, clients = setup(
        lambda nodes: RecordingGrid(nodes, drop=drop))
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == CLIENTS - 1
    assert strategy.report.late == ["1"]  # partition 1, still "connected" in process
    shared = {m.metadata.dst_node_id for s, m in grid.sent if s == Stage.SHARE_KEYS}
    assert drop in shared  # it took part until the collect stage
    plain = plain_updates(record, arrays, clients)
    others = sorted(n for n in plain if n != drop)
    check_aggregate(cfg, strategy, to_numpy(new), arrays, [plain[n][0] for n in others],
                    [plain[n][1] for n in others])


def test_distributed_dp_through_secagg_is_the_mean_of_the_survivors_clipped_updates(
        fmnist_available, server_task):
    """privacy=distributed with SecAgg+: each client clips (here without noise, to compare)
    and weighs 1; with min_survivors=2 the round releases the mean of the two survivors'
    clipped updates, and records the noise multiplier the two shares make."""
    drop = 101
    private = ["privacy=distributed", "privacy.noise_multiplier=0", "privacy.clip=0.5",
               "privacy.min_survivors=2"]
    cfg, strategy, grid, record, arrays, clients = setup(
        lambda nodes: RecordingGrid(nodes, drop=drop), private)
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == CLIENTS - 1
    plain = plain_updates(record, arrays, clients, overrides=private)
    for update, _ in plain.values():  # what each client sent: clipped to 0.5
        assert np.sqrt(sum(np.sum(v ** 2) for v in update.values())) <= 0.5 + 1e-6
    survivors = [plain[n][0] for n in sorted(plain) if n != drop]
    global_arrays = to_numpy(arrays)
    level = 2 * clipping(strategy, cfg) / cfg.secagg.quantization_range
    worst = max(np.abs(to_numpy(new)[k] - global_arrays[k]
                       - sum(u[k] for u in survivors) / len(survivors)).max()
                for k in survivors[0])
    assert worst <= level + 1e-6, worst
    assert strategy.release.columns(1)["dp_q"] == 1.0  # the server knows the sample


def test_distributed_dp_through_secagg_unmasks_nothing_below_min_survivors(
        fmnist_available, server_task):
    """With one of three clients lost after sharing its keys and min_survivors=3, the server
    stops before the unmask stage: it never learns a sum of fewer noise shares than the noise
    needs, the model stays, and the round is accounted as releasing nothing."""
    drop = 101
    private = ["privacy=distributed", "privacy.min_survivors=3"]
    cfg, strategy, grid, record, arrays, clients = setup(
        lambda nodes: RecordingGrid(nodes, drop=drop), private)
    assert secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60) is None
    assert Stage.UNMASK not in {s for s, _ in grid.sent}
    assert "fewer than the release needs" in strategy.report.refused_aggregate
    columns = strategy.release.columns(1)
    assert columns["dp_sigma"] == np.inf and columns["epsilon"] == 0.0


def test_a_methods_own_aggregate_train_runs_on_the_secure_aggregate(fmnist_available,
                                                                    server_task):
    """FedAvgM's server momentum (Flower's, in its aggregate_train) applies to the secure mean:
    round 1 with server_lr 0.5 moves the model half the mean update."""
    overrides = ["strategy=fedavgm", "strategy.server_lr=0.5"]
    cfg, strategy, grid, record, arrays, clients = setup(RecordingGrid, overrides)
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == CLIENTS
    plain = plain_updates(record, arrays, clients, overrides=overrides)
    nodes = sorted(plain)
    check_aggregate(cfg, strategy, to_numpy(new), arrays, [plain[n][0] for n in nodes],
                    [plain[n][1] for n in nodes], step=0.5)


class Overclaiming(RecordingGrid):
    """Node 102's collect-stage reply claims ten times its examples in its clear metrics."""

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for reply in replies:
            if (self.replies[-1][0] == Stage.COLLECT_MASKED_VECTORS
                    and reply.metadata.src_node_id == 102):
                metrics = reply.content["metrics"]
                metrics[NUM_EXAMPLES] = 10.0 * metrics[NUM_EXAMPLES]
        return replies


def test_a_reply_whose_clear_metrics_fail_the_checks_is_left_out_of_the_sum(
        fmnist_available, server_task):
    """What still can be checked is checked before the workflow sums the masked vectors; a
    reply that fails is treated as a dropped node, so its masks are removed with it."""
    cfg, strategy, grid, record, arrays, clients = setup(Overclaiming)
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == CLIENTS - 1
    assert strategy.report.rejected_partitions == ["2"]
    assert "examples; the data survey found" in strategy.report.rejected[0]
    plain = plain_updates(record, arrays, clients)
    others = sorted(n for n in plain if n != 102)
    check_aggregate(cfg, strategy, to_numpy(new), arrays, [plain[n][0] for n in others],
                    [plain[n][1] for n in others])


class Overstepping(RecordingGrid):
    """Node 102's collect-stage reply reports one local step more than it was assigned."""

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for reply in replies:
            if (self.replies[-1][0] == Stage.COLLECT_MASKED_VECTORS
                    and reply.metadata.src_node_id == 102):
                reply.content["metrics"][LOCAL_STEPS] += 1.0
        return replies


def test_heterogeneity_runs_through_secagg_and_each_assigned_step_count_is_checked(
        fmnist_available, server_task):
    """Drawn epochs under SecAgg+: each client trains what its assignment record asks, and the
    secure round checks the clear step count against exactly that (a client claiming a step
    more is left out of the sum), as a plain round does."""
    overrides = ["heterogeneity=epochs", "heterogeneity.max_epochs=3"]
    cfg, strategy, grid, record, arrays, clients = setup(Overstepping, overrides)
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == CLIENTS - 1
    assert strategy.report.rejected_partitions == ["2"]
    assert "'local-steps' is" in strategy.report.rejected[0]
    assigned = {n: strategy.plan.assigned[n].epochs for n in strategy.plan.assigned}
    assert len(set(assigned.values())) > 1 or set(assigned.values()) != {1}  # drawn, not 1s


def test_the_server_never_holds_an_unmasked_update(fmnist_available, server_task):
    cfg, strategy, grid, record, arrays, clients = setup(RecordingGrid)
    secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    # no reply of any stage carries an array: the model, and the update, stay on the client
    assert grid.replies and all(not rec for _, r in grid.replies
                                for rec in r.content.array_records.values())
    assert all(u.arrays == {} for u in strategy.last_updates)  # what reached the strategy
    plain = plain_updates(record, arrays, clients)
    s, reach = cfg.secagg, clipping(strategy, cfg)
    collected = [r for st, r in grid.replies if st == Stage.COLLECT_MASKED_VECTORS]
    assert len(collected) == CLIENTS
    from flwr.common import bytes_to_ndarray
    for reply in collected:
        update, n = plain[reply.metadata.src_node_id]
        masked = [bytes_to_ndarray(b) for b in
                  reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        most = max(c["num_examples"] for c in clients)
        ratio = round(n / most * s.quantization_range) / s.quantization_range
        for vector, key in zip(masked[1:], update):
            quantised = np.round((np.clip(update[key] * ratio, -reach, reach) + reach)
                                 * s.quantization_range / (2 * reach))
            # masked: uniform in [0, modulus_range), nowhere near the quantised update
            assert np.mean(np.abs(vector - quantised) <= 1) < 0.01
            assert vector.max() > s.quantization_range  # beyond any unmasked value


def test_plain_messages_pass_the_secagg_mods_untouched(server_task):
    from flwr.client.mod import secaggplus_mod

    msg = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=1,
                  message_type="train")
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(KeyError):  # Flower's mod reads its record of every train message
        secaggplus_mod(msg, context, lambda m, c: m)
    assert only_secagg(secaggplus_mod)(msg, context, lambda m, c: m) is msg
    assert RECORD_KEY_CONFIGS not in context.state.config_records


@pytest.mark.parametrize("overrides, refusal", [
    (["aggregation=krum"], "secagg=secaggplus with aggregation=krum: Krum scores every "
                           "client's individual update, which secure aggregation hides; use "
                           "aggregation=mean"),
    (["aggregation=median"], "with aggregation=median: the coordinate-wise median"),
    (["aggregation=trimmed_mean"], "with aggregation=trimmed_mean: the trimmed mean"),
    (["strategy=fednova"], "with aggregation=fednova: FedNova normalises each client's"),
    (["strategy=feddisco"], "with aggregation=feddisco: FedDisco reweighs"),
    (["strategy=fedcsd"], "with strategy=fedcsd: strategy.prototypes=exchange runs a "
     "prototype phase before training"),
    (["strategy=fedproto"], "with strategy=fedproto: strategy.prototype_mean=weighted weighs "
     "each client's prototypes by its own class counts"),
    (["strategy=dcfl"], "with strategy=dcfl: its clients' condensed images"),
    (["strategy=feddyn"], "with strategy=feddyn: its h, a running sum of every client's own "
     "unclipped model would reach the server unprotected"),
    (["num_clients=1"], "with 1 client(s) per round (num_clients=1, fraction=1): SecAgg+ "
                        "needs at least 2"),
    (["privacy=distributed", "privacy.noise_multiplier=10", "privacy.min_survivors=1",
      "secagg.clipping_range=8"],
     "each client's noise share (std 10) would be clipped by secagg.clipping_range=8"),
    (["num_clients=6", "fraction=0.5", "secagg.num_shares=5",
      "secagg.reconstruction_threshold=4"], "with 3 client(s) per round (num_clients=6, "
                                            "fraction=0.5): SecAgg+ needs at least 4"),
])
def test_what_secure_aggregation_cannot_serve_is_refused_in_one_line(overrides, refusal):
    with pytest.raises(ConfigError) as err:
        check_experiment(compose(["secagg=secaggplus", *overrides]))
    assert refusal in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("override, refusal", [
    ("secagg.num_shares=4", "secagg.num_shares=4 as a count must be odd and greater than 2"),
    ("secagg.num_shares=2", "secagg.num_shares=2 as a count must be odd"),
    ("secagg.num_shares=1.5", "secagg.num_shares=1.5 as a share must be in (0, 1]"),
    ("secagg.reconstruction_threshold=3", "secagg.reconstruction_threshold=3 must be less "
                                          "than secagg.num_shares=3"),
    ("secagg.reconstruction_threshold=1.5", "as a share must be in (0, 1]"),
    ("secagg.max_weight=0", "secagg.max_weight must be > 0, got 0"),
    ("secagg.clipping_range=0", "secagg.clipping_range must be auto or a number > 0, got 0"),
    ("secagg.clipping_range=wide", "secagg.clipping_range must be auto or a number > 0, got "
                                   "'wide'"),
    ("secagg.quantization_range=4294967296", "secagg.modulus_range=4294967296 must be greater "
                                             "than secagg.quantization_range=4294967296"),
    ("secagg.modulus_range=3000000000", "secagg.modulus_range=3000000000 must be a power of 2"),
])
def test_settings_flower_would_refuse_are_refused_as_one_line(override, refusal):
    with pytest.raises(ConfigError, match=None) as err:
        compose(["secagg=secaggplus", override])
    assert refusal in str(err.value)


def test_settings_flower_accepts_are_accepted_and_sized_as_flower_sizes_them():
    from flwr.server.workflow import SecAggPlusWorkflow

    for shares, threshold in [(3, 2), (5, 3), (1, 1), (0.5, 0.5), (1.0, 0.8)]:
        settings = compose(["secagg=secaggplus", f"secagg.num_shares={shares}",
                            f"secagg.reconstruction_threshold={threshold}"]).secagg
        SecAggPlusWorkflow(settings.num_shares, settings.reconstruction_threshold)
    settings = compose(["secagg=secaggplus"]).secagg
    assert settings.protocol_sizes(10) == (3, 2) and settings.protocol_sizes(2) == (2, 2)
    assert compose(["secagg=secaggplus", "secagg.num_shares=1.0",
                    "secagg.reconstruction_threshold=0.5"]).secagg.protocol_sizes(10) == (10, 5)
    with pytest.raises(ConfigError, match="secagg.num_shares"):
        compose(["secagg.num_shares=5"])  # secagg=none takes no settings


def test_a_client_weight_above_max_weight_is_refused_after_the_survey():
    settings = compose(["secagg=secaggplus", "secagg.max_weight=1000"]).secagg
    clients = [{"partition_id": 0, "num_examples": 600}, {"partition_id": 1, "num_examples": 6000}]
    with pytest.raises(ConfigError, match="secagg.max_weight=1000 is below a client's 6000 "
                                          "examples .partition 1.: SecAgg\\+ would overflow"):
        check_weights(settings, clients, unweighted=False)
    check_weights(settings, clients, unweighted=True)  # DP: one weight for all
    check_weights(settings, clients[:1], unweighted=False)


def test_the_secagg_yamls_hold_the_schemas_defaults():
    import yaml

    from conftest import REPO
    from driftfl.common.privacy import SecAggSettings

    conf = REPO / "conf" / "secagg"
    assert sorted(p.stem for p in conf.glob("*.yaml")) == ["none", "secaggplus"]
    assert yaml.safe_load((conf / "none.yaml").read_text()) == {"name": "none"}
    section = yaml.safe_load((conf / "secaggplus.yaml").read_text())
    assert section == SecAggSettings(name="secaggplus").model_dump()
    assert compose([]).secagg == SecAggSettings()  # none by default
