"""MOON and FedProto pinned on hand-worked cases; MOON's projection head; the previous local
model kept in the node's state; FedProto's server (count-weighted prototypes, checked replies)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message, Metadata,
                      MetricRecord, RecordDict)

from driftfl.client.objectives import build_objective
from driftfl.client.objectives.moon import STATE_PREVIOUS, features_of, moon_contrastive
from driftfl.client.objectives.proto import proto_loss
from driftfl.common.config import compose
from driftfl.common.models import MODELS, build_model
from driftfl.common.protocol import (ARRAYS, CONFIG, FEATURE_PROTOTYPES, LOCAL_STEPS, METRICS,
                                     NUM_EXAMPLES, model_to_arrays)
from driftfl.common.training import TrainSettings, train_locally
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies.methods.fedproto import check_feature_prototypes, weighted_prototypes

# --- MOON -------------------------------------------------------------------------------------


def test_moon_loss_on_hand_worked_representations():
    """tau = 0.5. Sample 1: cos(r, r_glob) = 1, cos(r, r_prev) = 0, so
    l1 = -log(e^2 / (e^2 + e^0)) = log(1 + e^-2). Sample 2: r = (1, 1), r_glob = (3, 0),
    r_prev = (-1, 0): cosines +-1/sqrt(2), so l2 = log(1 + e^(-2 sqrt 2)). Lengths do not count."""
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    r_glob = torch.tensor([[2.0, 0.0], [3.0, 0.0]])
    r_prev = torch.tensor([[0.0, 5.0], [-1.0, 0.0]])
    expected = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-2 * math.sqrt(2)))) / 2
    assert moon_contrastive(r, r_glob, r_prev, 0.5).item() == pytest.approx(expected, rel=1e-6)


def test_moon_loss_is_log_2_when_the_previous_model_is_the_global_one():
    torch.manual_seed(0)
    r, r_glob = torch.randn(7, 5), torch.randn(7, 5)
    per_sample = [moon_contrastive(r[i:i + 1], r_glob[i:i + 1], r_glob[i:i + 1], 0.5).item()
                  for i in range(7)]
    assert per_sample == pytest.approx([math.log(2)] * 7, rel=1e-6)


def test_moon_gradient_flows_into_the_local_representation_only():
    torch.manual_seed(0)
    r = torch.randn(4, 3, requires_grad=True)
    r_glob, r_prev = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    moon_contrastive(r, r_glob, r_prev, 0.5).backward()
    assert r.grad is not None and r.grad.abs().sum() > 0
    assert r_glob.grad is None and r_prev.grad is None  # frozen models' representations


def node_context():
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def local_round(objective, model, x, y, seed=0):
    stats = train_locally(model, x, y, TrainSettings(1, 8, 0.1, 0.0, 0.0), objective,
                          torch.Generator().manual_seed(seed))
    objective.after_training(model, stats)
    return stats


def test_moon_keeps_the_trained_model_and_contrasts_with_it_next_round():
    torch.manual_seed(0)
    x, y = torch.randn(24, 1, 4, 4), torch.randint(0, 3, (24,))
    job = SimpleNamespace(context=node_context())  # the node's state outlives the objective
    spec = {"name": "mlp", "hidden": [6]}

    first = build_objective("moon", {}, job)
    model = build_model(spec, (1, 4, 4), 3)
    global_features = features_of(model, x)
    local_round(first, model, x, y)
    assert first.diagnostics() == {"moon-previous-model": 0.0}  # first round: global model
    assert torch.equal(first.r_prev, global_features)
    assert STATE_PREVIOUS in job.context.state.array_records
    trained = {k: v.clone() for k, v in model.state_dict().items()}

    second = build_objective("moon", {}, job)  # a fresh process in deployment
    new_global = build_model(spec, (1, 4, 4), 3)
    second.prepare(new_global, x, y)
    assert second.diagnostics() == {"moon-previous-model": 1.0}
    previous = build_model(spec, (1, 4, 4), 3)
    previous.load_state_dict(trained)
    assert torch.allclose(second.r_prev, features_of(previous, x))
    assert torch.allclose(second.r_glob, features_of(new_global, x))
    assert not torch.allclose(second.r_prev, second.r_glob)

    # a stored model that does not fit (another architecture) falls back to the global model
    other = build_model({"name": "mlp", "hidden": [5]}, (1, 4, 4), 3)
    third = build_objective("moon", {}, job)
    third.prepare(other, x, y)
    assert third.diagnostics() == {"moon-previous-model": 0.0}


def test_moon_without_a_node_context_uses_the_global_model_and_keeps_nothing():
    torch.manual_seed(0)
    x, y = torch.randn(10, 1, 4, 4), torch.randint(0, 2, (10,))
    objective = build_objective("moon", {"mu": 5.0, "tau": 0.2})
    assert (objective.weight, objective.settings.tau) == (5.0, 0.2)
    stats = local_round(objective, build_model({"name": "mlp", "hidden": [4]}, (1, 4, 4), 2), x, y)
    assert math.isfinite(stats.mean_loss) and objective.diagnostics()["moon-previous-model"] == 0


# --- the projection head (model.projection) ----------------------------------------------------

@pytest.mark.parametrize("name", sorted(MODELS))
def test_projection_zero_builds_exactly_todays_model(name):
    builder = MODELS[name][1]
    torch.manual_seed(0)
    today = builder((1, 28, 28), 10).state_dict()
    torch.manual_seed(0)
    built = build_model({"name": name, "projection": 0}, (1, 28, 28), 10).state_dict()
    assert list(built) == list(today)
    assert all(torch.equal(built[k], today[k]) for k in today)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_projection_head_sits_between_the_features_and_the_linear_head(name):
    plain = build_model({"name": name}, (1, 28, 28), 10)
    d = plain.head.in_features
    model = build_model({"name": name, "projection": 16}, (1, 28, 28), 10).eval()
    x = torch.randn(2, 1, 28, 28)
    assert model.features(x).shape == (2, 16) and model.head.in_features == 16
    assert torch.allclose(model(x), model.head(model.features(x)))
    layers = model.features.projection
    assert [type(m) for m in layers] == [torch.nn.Linear, torch.nn.ReLU, torch.nn.Linear]
    assert (layers[0].in_features, layers[0].out_features, layers[2].out_features) == (d, d, 16)
    # the extractor is today's, its parameters under features.body
    assert {k.replace("features.body.", "features.", 1) for k in model.state_dict()
            if k.startswith("features.body.")} == {k for k in plain.state_dict()
                                                   if k.startswith("features.")}


def test_projection_is_a_checked_model_setting():
    from driftfl.common.errors import ConfigError

    assert check_experiment(compose(["strategy=moon", "model.projection=256"])
                            ).model.projection == 256
    with pytest.raises(ConfigError, match=r"model.projection must be in \[0, 1000000\]"):
        check_experiment(compose(["strategy=moon", "model.projection=-1"]))


# --- FedProto: the client ---------------------------------------------------------------------

def test_proto_loss_on_a_hand_worked_case():
    """d = 2. Sample 1 (class 0, P_G,0 = (0, 0)): (1 + 4); sample 2 (class 1, no global
    prototype): 0; sample 3 (class 2, P_G,2 = (1, 1)): (1 + 1). Mean over 3 samples x 2 dims."""
    features = torch.tensor([[1.0, 2.0], [3.0, 3.0], [2.0, 0.0]])
    labels = torch.tensor([0, 1, 2])
    prototypes = torch.tensor([[0.0, 0.0], [9.0, 9.0], [1.0, 1.0]])
    present = torch.tensor([True, False, True])
    assert proto_loss(features, labels, prototypes, present).item() == pytest.approx(7 / 6)


def test_proto_loss_skips_classes_without_a_global_prototype():
    features = torch.randn(4, 3, requires_grad=True)
    labels = torch.tensor([1, 1, 1, 1])
    loss = proto_loss(features, labels, torch.randn(2, 3), torch.tensor([True, False]))
    loss.backward()
    assert loss.item() == 0.0 and not features.grad.any()
    # with the class present the gradient is 2 (h - P) / (N d), as MSE's
    prototypes = torch.randn(2, 3)
    features.grad = None
    proto_loss(features, labels, prototypes, torch.tensor([False, True])).backward()
    assert torch.allclose(features.grad, 2 * (features.detach() - prototypes[1]) / 12)


def proto_job(prototypes=None, present=None):
    content = {}
    if prototypes is not None:
        content[FEATURE_PROTOTYPES] = ArrayRecord({
            "prototypes": Array(np.asarray(prototypes, np.float32)),
            "present": Array(np.asarray(present, bool))})
    return SimpleNamespace(message=SimpleNamespace(content=content), context=node_context())


def test_proto_objective_is_plain_ce_without_prototypes_and_replies_its_prototypes():
    torch.manual_seed(0)
    x, y = torch.randn(12, 1, 2, 2), torch.tensor([0, 0, 2] * 4)  # class 1 absent
    model = build_model({"name": "mlp", "hidden": [4]}, (1, 2, 2), 3)
    objective = build_objective("proto", {}, proto_job())  # round 1: no record
    objective.prepare(model, x, y)
    features = model.features(x)
    batch = SimpleNamespace(features=features, logits=model.head(features), y=y,
                            index=torch.arange(12))
    assert torch.equal(objective.loss(batch), F.cross_entropy(batch.logits, y))
    assert objective.diagnostics() == {"global-prototype-classes": 0.0}

    local_round(objective, model, x, y)  # prepare, train, after_training
    record = objective.reply_records()[FEATURE_PROTOTYPES]
    prototypes, counts = record["prototypes"].numpy(), record["counts"].numpy()
    assert prototypes.dtype == np.float32 and counts.dtype == np.int64
    assert counts.tolist() == [8, 0, 4]
    trained = features_of(model, x)  # of the trained model, eval mode, all local data
    assert np.allclose(prototypes[0], trained[y == 0].mean(0).numpy(), atol=1e-6)
    assert np.allclose(prototypes[2], trained[y == 2].mean(0).numpy(), atol=1e-6)
    assert not prototypes[1].any()


def test_proto_objective_pulls_towards_the_received_prototypes():
    torch.manual_seed(0)
    x, y = torch.randn(6, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    model = build_model({"name": "mlp", "hidden": [4]}, (1, 2, 2), 3)
    p_g, present = np.ones((3, 4)), [True, False, True]
    objective = build_objective("proto", {"mu": 0.5}, proto_job(p_g, present))
    objective.prepare(model, x, y)
    features = model.features(x)
    batch = SimpleNamespace(features=features, logits=model.head(features), y=y,
                            index=torch.arange(6))
    expected = F.cross_entropy(batch.logits, y) + 0.5 * proto_loss(
        features, y, torch.ones(3, 4), torch.tensor(present))
    assert torch.isclose(objective.loss(batch), expected)
    assert objective.diagnostics() == {"global-prototype-classes": 2.0}
    with pytest.raises(ValueError, match="do not fit"):
        build_objective("proto", {}, proto_job(np.ones((3, 5)), present)).prepare(model, x, y)


# --- FedProto: the server ---------------------------------------------------------------------

def metadata(node):
    return Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type="train")


def proto_reply(node, arrays, prototypes, counts, n=10):
    content = RecordDict({ARRAYS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                          METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: 1})})
    content[FEATURE_PROTOTYPES] = ArrayRecord({"prototypes": Array(np.asarray(prototypes)),
                                               "counts": Array(np.asarray(counts))})
    return Message(metadata=metadata(node), content=content)


def test_global_prototypes_are_the_count_weighted_mean_and_unheld_classes_absent():
    a = (np.array([[1, 1], [2, 2], [0, 0]], np.float32), np.array([3, 1, 0]))
    b = (np.array([[5, 5], [4, 4], [7, 7]], np.float32), np.array([1, 3, 0]))  # row 2: count 0
    p_g, present = weighted_prototypes([a, b], 3, 2)
    assert p_g[0].tolist() == [2, 2]  # (3 * 1 + 1 * 5) / 4
    assert p_g[1].tolist() == [3.5, 3.5]  # (1 * 2 + 3 * 4) / 4: by counts, not per client
    assert p_g[2].tolist() == [0, 0] and present.tolist() == [True, True, False]


def test_plain_prototype_mean_is_the_unweighted_mean_over_the_holders():
    a = (np.array([[1, 1], [2, 2], [0, 0]], np.float32), np.array([3, 1, 0]))
    b = (np.array([[5, 5], [4, 4], [7, 7]], np.float32), np.array([1, 3, 0]))
    p_g, present = weighted_prototypes([a, b], 3, 2, by_counts=False)
    assert p_g[0].tolist() == [3, 3]  # (1 + 5) / 2, whatever the counts 3 and 1
    assert p_g[1].tolist() == [3, 3]  # (2 + 4) / 2
    assert p_g[2].tolist() == [0, 0] and present.tolist() == [True, True, False]
    # a class one reply holds is that reply's prototype under either mean
    c = (np.array([[9, 9], [0, 0], [6, 6]], np.float32), np.array([2, 0, 5]))
    assert weighted_prototypes([a, c], 3, 2, by_counts=False)[0][2].tolist() == [6, 6]


def test_prototype_mean_setting_reaches_the_strategy(server_task):
    weighted, weights = proto_strategy([1, 2], [[5, 5, 0], [5, 5, 0]])
    plain, _ = proto_strategy([1, 2], [[5, 5, 0], [5, 5, 0]], "strategy.prototype_mean=plain")
    assert weighted.by_counts and not plain.by_counts
    ones = np.ones((3, 4), np.float32)
    for strategy in (weighted, plain):
        strategy.configure_train(1, ArrayRecord({k: Array(v) for k, v in weights.items()}),
                                 ConfigRecord(), Grid([1, 2]))
        strategy.aggregate_train(1, [proto_reply(1, weights, ones * [[1], [1], [0]], [4, 1, 0]),
                                     proto_reply(2, weights, ones * [[3], [3], [0]], [1, 4, 0])])
    assert weighted.prototypes[:2, 0].tolist() == pytest.approx([1.4, 2.6])  # 7/5, 13/5
    assert plain.prototypes[:2, 0].tolist() == [2, 2]  # (1 + 3) / 2 for both classes


def test_prototype_replies_are_checked():
    good = proto_reply(1, {}, np.zeros((3, 2), np.float32), np.array([1, 0, 2]))
    assert isinstance(check_feature_prototypes(good, 3, 2), tuple)
    assert "expected (3, 4)" in check_feature_prototypes(good, 3, 4)
    nan = np.zeros((3, 2), np.float32)
    nan[1, 0] = np.nan
    assert "not finite" in check_feature_prototypes(proto_reply(1, {}, nan, [1, 0, 2]), 3, 2)
    huge = np.full((3, 2), 3e38, np.float32)
    assert "within" in check_feature_prototypes(proto_reply(1, {}, huge, [1, 0, 2]), 3, 2)
    assert "counts" in check_feature_prototypes(
        proto_reply(1, {}, np.zeros((3, 2), np.float32), np.array([1.5, 0, 2])), 3, 2)
    assert "counts" in check_feature_prototypes(
        proto_reply(1, {}, np.zeros((3, 2), np.float32), np.array([1, -1, 2])), 3, 2)
    assert "at most 2" in check_feature_prototypes(good, 3, 2, num_examples=2)
    bare = Message(metadata=metadata(1), content=RecordDict())
    assert "lacks" in check_feature_prototypes(bare, 3, 2)


class Grid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


def proto_strategy(nodes, histograms=None, *overrides):
    """``histograms``: each node's surveyed label histogram (the counts a reply may send)."""
    cfg = check_experiment(compose(["strategy=fedproto", f"num_clients={len(nodes)}",
                                    *overrides]))
    torch.manual_seed(0)
    model = build_model({"name": "mlp", "hidden": [4]}, (1, 2, 2), 3)
    strategy = build_strategy(cfg, model)
    histograms = histograms or [[4, 3, 3]] * len(nodes)
    strategy.meet([{"node_id": n, "partition_id": i, "num_examples": 10,
                    "label_histogram": h} for i, (n, h) in enumerate(zip(nodes, histograms))])
    return strategy, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def test_fedproto_sends_prototypes_from_round_2_and_refuses_bad_replies(server_task):
    nodes = [1, 2, 3, 4]
    strategy, weights = proto_strategy(nodes, [[6, 0, 4]] * 4)
    assert (strategy.num_classes, strategy.feature_dim) == (3, 4)
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    grid = Grid(nodes)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert len(messages) == 4
    assert all(FEATURE_PROTOTYPES not in m.content.array_records for m in messages)  # round 1

    new = {k: v + 0.1 if v.dtype.kind == "f" else v for k, v in weights.items()}
    good = np.arange(12, dtype=np.float32).reshape(3, 4)
    good[1] = 0  # class 1: held by none of them
    nan = good.copy()
    nan[0, 0] = np.nan
    replies = [proto_reply(1, new, good, np.array([6, 0, 4])),
               proto_reply(2, new, nan, np.array([6, 0, 4])),  # NaN
               proto_reply(3, new, good[:, :2], np.array([6, 0, 4])),  # (C, 2), not (C, 4)
               proto_reply(4, new, good, np.array([6, 3, 4]))]  # 13 > the survey's 10
    result, _ = strategy.aggregate_train(1, replies)
    assert strategy.report.clients == 1 and strategy.report.rejected_partitions == ["1", "2", "3"]
    assert all(np.allclose(result[k].numpy(), v) for k, v in new.items())  # node 1's alone
    assert np.array_equal(strategy.prototypes[[0, 2]], good[[0, 2]])  # node 1's P_k alone
    assert strategy.present.tolist() == [True, False, True]
    assert strategy.server_metrics(None) == {"prototype_classes": 2.0}

    messages = list(strategy.configure_train(2, arrays, ConfigRecord(), grid))
    record = messages[0].content[FEATURE_PROTOTYPES]
    assert np.array_equal(record["prototypes"].numpy(), strategy.prototypes)
    assert record["present"].numpy().tolist() == [True, False, True]

    # a round whose every reply is refused touches neither P_G nor the model
    before = strategy.prototypes.copy()
    result, _ = strategy.aggregate_train(2, [proto_reply(1, new, nan, np.array([6, 0, 4]))])
    assert result is None and np.array_equal(strategy.prototypes, before)
    assert strategy.present.tolist() == [True, False, True]


def test_fedproto_p_g_is_replaced_every_round(server_task):
    strategy, weights = proto_strategy([1, 2], [[5, 5, 0], [0, 5, 5]])
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    strategy.configure_train(1, arrays, ConfigRecord(), Grid([1, 2]))
    ones = np.ones((3, 4), np.float32)
    first, second = ones * [[1], [1], [0]], ones * [[0], [1], [1]]  # the classes each holds
    strategy.aggregate_train(1, [proto_reply(1, weights, first, [5, 5, 0]),
                                 proto_reply(2, weights, 3 * second, [0, 5, 5])])
    assert strategy.prototypes[:, 0].tolist() == [1, 2, 3] and strategy.present.all()
    strategy.configure_train(2, arrays, ConfigRecord(), Grid([1, 2]))
    strategy.aggregate_train(2, [proto_reply(1, weights, 2 * first, [5, 0, 0]),
                                 proto_reply(2, weights, 4 * second, [0, 0, 5])])
    assert strategy.prototypes[:, 0].tolist() == [2, 0, 4]  # class 1 held by nobody now
    assert strategy.present.tolist() == [True, False, True]


# --- both, through the ClientApp: two rounds in process ---------------------------------------

@pytest.mark.parametrize("name", ["moon", "fedproto"])
def test_two_rounds_through_the_client_app(name, fmnist_available, server_task):
    from test_methods import TINY, surveyed

    _, model, strategy, grid, record = surveyed([f"strategy={name}", *TINY])
    arrays = model_to_arrays(model)
    for server_round in (1, 2):
        messages = list(strategy.configure_train(server_round, arrays,
                                                 ConfigRecord(dict(record)), grid))
        arrays, _ = strategy.aggregate_train(server_round, grid.send_and_receive(messages))
        assert strategy.report.rejected == [] and strategy.report.clients == 2
        metrics = strategy.report.train_metrics
        if name == "moon":  # round 2 contrasts with each node's round-1 model
            assert metrics["moon-previous-model"] == float(server_round == 2)
        else:  # round 1 trains with plain CE, round 2 with P_G
            assert metrics["global-prototype-classes"] == (0.0 if server_round == 1 else 10.0)
            assert FEATURE_PROTOTYPES in messages[0].content.array_records or server_round == 1
    if name == "fedproto":
        assert strategy.present.all() and strategy.prototypes.shape == (10, 200)
    assert CONFIG in messages[0].content.config_records
