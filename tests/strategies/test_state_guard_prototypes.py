"""Issue 27's attacks inside the reply checks' bounds, on the state FedProto, FedCSD and DCFL keep:
each re-sent through real Messages into the real strategy, which must keep its global model and
every piece of its state as the honest replies alone make them (strategies/prototypes.py,
dcfl/condensed.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import (Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord,
                      RecordDict)

from driftfl.common.config import compose
from driftfl.common.datasets import to_tensors
from driftfl.common.evaluation import evaluate
from driftfl.common.models import build_model
from driftfl.common.protocol import (ARRAYS, CLASSIFIER, CONDENSED, DATASET_META, EXPERIMENT,
                                     FEATURE_PROTOTYPES, LOCAL_STEPS, METRICS, NUM_EXAMPLES,
                                     PROTOTYPES, model_to_arrays)
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies.methods import fedproto
from driftfl.strategies.methods import prototypes as rules
from driftfl.strategies.parts.aggregation import to_numpy
from driftfl.strategies.methods.fedproto import weighted_prototypes


def metadata(node, kind="train"):
    return Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type=kind)


def train_reply(node, arrays, n=10, steps=1, **records) -> Message:
    content = RecordDict({ARRAYS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                          METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: steps})})
    for name, record in records.items():
        content[name] = record
    return Message(metadata=metadata(node), content=content)


def prototypes(p, counts) -> ArrayRecord:
    return ArrayRecord({"prototypes": Array(np.asarray(p, np.float32)),
                        "counts": Array(np.asarray(counts, np.int64))})


class Grid:
    def __init__(self, nodes, answer=None):
        self.nodes, self.answer = nodes, answer

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, timeout=None):
        return [self.answer(m) for m in messages]


# Three classes, 10 examples a node: nodes 1, 2 hold classes 0 and 1, node 3 classes 1 and 2;
# node 4, the attacker, classes 0 and 1.
HISTOGRAMS = {1: [5, 5, 0], 2: [4, 6, 0], 3: [0, 3, 7], 4: [5, 5, 0]}


def surveyed(strategy):
    strategy.meet([{"node_id": n, "partition_id": n - 1, "num_examples": 10,
                    "label_histogram": h} for n, h in HISTOGRAMS.items()])
    return strategy


def honest_rows(node, scale=1.0):
    """Feature prototypes (C=3, d=4) of norm about 2: a zero row for a class not held."""
    held = np.array(HISTOGRAMS[node]) > 0
    return scale * held[:, None] * (np.ones((3, 4)) + 0.1 * node)


# --- FedProto -----------------------------------------------------------------------------------

def proto_strategy(*overrides):
    cfg = check_experiment(compose(["strategy=fedproto", "num_clients=4", *overrides]))
    torch.manual_seed(0)
    model = build_model({"name": "mlp", "hidden": [4]}, (1, 2, 2), 3)
    strategy = surveyed(build_strategy(cfg, model))
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    strategy.configure_train(1, ArrayRecord({k: Array(v) for k, v in weights.items()}),
                             ConfigRecord(), Grid(HISTOGRAMS))
    return strategy, weights


def moved(weights, by):
    return {k: v + by if v.dtype.kind == "f" else v for k, v in weights.items()}


def proto_round(strategy, server_round, weights, hostile):
    """A round of honest nodes (models moved by 0.01), those in ``hostile`` sending its (rows,
    counts) and a model moved by 0.05 instead."""
    replies = [train_reply(n, moved(weights, 0.05 if n in hostile else 0.01),
                           **{FEATURE_PROTOTYPES: prototypes(*hostile.get(
                               n, (honest_rows(n, server_round), HISTOGRAMS[n])))})
               for n in HISTOGRAMS]
    if server_round > 1:
        strategy.configure_train(server_round, ArrayRecord({k: Array(v) for k, v in
                                                            weights.items()}),
                                 ConfigRecord(), Grid(HISTOGRAMS))
    return strategy.aggregate_train(server_round, replies)


def honest_p_g(server_round):
    return weighted_prototypes([(honest_rows(n, server_round).astype(np.float32),
                                 np.array(HISTOGRAMS[n], np.float64)) for n in (1, 2, 3)], 3, 4)


ghost = honest_rows(4)
ghost[2] = 1e4  # class 2, which node 4 does not hold
outsized_row = honest_rows(4)
outsized_row[1] *= 1e3  # class 1, held: 1e3 x the peers'


@pytest.mark.parametrize("attack, reason", [
    ((ghost, [5, 5, 0]), "prototypes of classes [2], which the node does not hold"),
    ((ghost, [3, 5, 2]), "counts [2] of classes [2] exceed the data survey's [0]"),
    ((ghost, [5, 0, 5]), "counts [5] of classes [2] exceed the data survey's [0]"),
    ((outsized_row, HISTOGRAMS[4]), "its class-1 prototype's norm 2.8e+03 is over "
                                    "max_peer_ratio=30 x the round's median 2.4"),
])
def test_fedproto_rejects_prototypes_off_the_survey_or_outsizing_peers(attack, reason,
                                                                        server_task):
    strategy, weights = proto_strategy()
    arrays, _ = proto_round(strategy, 1, weights, {4: attack})
    assert strategy.report.rejected_partitions == ["3"] and reason in strategy.report.rejected[0]
    p_g, present = honest_p_g(1)
    assert np.array_equal(strategy.prototypes, p_g) and present.all()
    assert strategy.report.clients == 3  # the model: the honest nodes' alone
    assert all(np.allclose(arrays[k].numpy(), v, rtol=1e-6, atol=0)
               for k, v in moved(weights, 0.01).items())


def test_fedproto_bounds_a_lone_holder_by_the_pooled_median_and_then_by_p_g(server_task):
    """Node 3 alone holds class 2: its class-2 row is measured against the round's lower median
    over all held rows and, once P_G,2 exists, against max_update_ratio x max(1, ||P_G,2||)."""
    strategy, weights = proto_strategy()
    strategy.max_peer_ratio = 10.0
    rows = honest_rows(3)
    rows[2] *= 30 / 2.6  # norm 30: over 10 x the pooled median 2.4
    proto_round(strategy, 1, weights, {3: (rows, HISTOGRAMS[3])})
    assert strategy.report.rejected_partitions == ["2"]
    assert "class-2 prototype's norm 30 is over max_peer_ratio=10 x the round's median 2.4" \
        in strategy.report.rejected[0]
    assert not strategy.present[2]  # nobody else holds it
    proto_round(strategy, 2, weights, {})
    p_g = strategy.prototypes.copy()
    assert strategy.present.all() and np.linalg.norm(p_g[2]) == pytest.approx(5.2, rel=1e-6)
    # round 3: norm 60 passes the peer rule (10 x the pooled median 7.2 of this round's rows,
    # three times round 1's) but lies 54.8 from P_G,2, over 10 x 5.2
    rows = honest_rows(3, 3)
    rows[2] *= 60 / 7.8
    proto_round(strategy, 3, weights, {3: (rows, HISTOGRAMS[3])})
    assert strategy.report.rejected_partitions == ["2"]
    assert "class-2 prototype is 54.8 from the global one, over the bound 52" \
        in strategy.report.rejected[0]
    assert not strategy.present[2]  # this round's P_G: the honest nodes', class 2 unheld
    assert np.array_equal(strategy.prototypes, weighted_prototypes(
        [(honest_rows(n, 3).astype(np.float32), np.array(HISTOGRAMS[n], np.float64))
         for n in (1, 2, 4)], 3, 4)[0])


def test_fedproto_keeps_p_g_when_the_new_one_moves_over_the_bound(server_task, caplog):
    """All replies agree and pass every per-reply rule, yet the classes P_G shares move by more
    than max_update_ratio x max(1, their norm): the state check refuses the new P_G."""
    strategy, weights = proto_strategy("max_update_ratio=3")
    small = {n: (0.1 * honest_rows(n), HISTOGRAMS[n]) for n in HISTOGRAMS}
    proto_round(strategy, 1, weights, small)
    before, present = strategy.prototypes.copy(), strategy.present.copy()
    # each row moves by 2.9 (under 3 x max(1, ~0.25)); the three classes by 5.0 (over 3 x 1)
    shifted = {n: (rows + 1.45 * (rows != 0), counts) for n, (rows, counts) in small.items()}
    with caplog.at_level("WARNING", logger="flwr"):
        arrays, _ = proto_round(strategy, 2, weights, shifted)
    assert arrays is not None and strategy.report.rejected == []
    assert np.array_equal(strategy.prototypes, before) and np.array_equal(strategy.present,
                                                                          present)
    assert strategy.report.refused_state[0].startswith("FedProto's prototypes: it would move")
    assert "round 2: the update of FedProto's prototypes refused" in caplog.text


@pytest.mark.parametrize("rule", ["median", "krum"])
def test_fedproto_under_a_robust_rule_combines_each_class_over_its_holders(rule, server_task):
    """A row 5 x its peers' passes the peer rule; the count-weighted mean follows it, the
    median and Krum (which keeps the model replies closest to the rest) do not."""
    overrides = ["aggregation=krum", "aggregation.num_malicious=0"] if rule == "krum" else [
        f"aggregation={rule}"]
    strategy, weights = proto_strategy(*overrides)
    rows = honest_rows(4)
    rows[0] *= 5
    proto_round(strategy, 1, weights, {4: (rows, HISTOGRAMS[4])})  # its model: Krum drops it
    assert strategy.report.clients == 4
    if rule == "median":  # class 0: nodes 1, 2 and the attacker: the middle one, node 2's
        assert np.allclose(strategy.prototypes[0], honest_rows(2)[0])
        assert np.allclose(strategy.prototypes[2], honest_rows(3)[2])  # node 3's alone
    else:  # Krum kept node 1 (the first of the closest): its rows; it lacks class 2
        assert np.allclose(strategy.prototypes[0], honest_rows(1)[0])
        assert not strategy.present[2]
    default, _ = proto_strategy()
    proto_round(default, 1, weights, {4: (rows, HISTOGRAMS[4])})
    assert default.prototypes[0, 0] > 1.5 * strategy.prototypes[0, 0]  # the mean follows it


# --- FedProto on Fashion-MNIST: honest clients and one attacker --------------------------------

FMNIST = ["strategy=fedproto", "model=mlp", "model.hidden=[64]", "dataset.subset=3000",
          "dataset.test_subset=1000", "num_clients=5", "partition=dirichlet",
          "logit_shift_samples=8"]


def fedproto_run(attack: str | None, guarded: bool = True, rounds: int = 4) -> float:
    """Final test accuracy of FedProto's rounds through the real ClientApp; partition 0's
    replies carry, for ``attack`` "ghost", prototypes of 1e4 on a class it does not hold,
    counted (the probe's); for "negated", its own prototypes times -5 (inside the bounds)."""
    from test_methods import InProcessGrid, fmnist_nodes

    from driftfl.server.survey import survey_clients
    from driftfl.server.experiment import prepare_experiment

    experiment = prepare_experiment(compose(FMNIST))
    model = experiment.initial_model()
    strategy = build_strategy(experiment.cfg, model)
    grid = InProcessGrid(fmnist_nodes(5))
    record = ConfigRecord({EXPERIMENT: experiment.cfg.to_json(),
                           DATASET_META: experiment.meta.to_json()})
    clients = survey_clients(grid, record, 5, node_wait=5, timeout=60)
    strategy.meet(clients)
    hostile = clients[0]
    histogram = np.array(hostile["label_histogram"])
    assert (histogram == 0).any()  # Dir(0.5) leaves partition 0 without some class
    # the class it lacks that most of the others hold
    held_by = (np.array([c["label_histogram"] for c in clients[1:]]) > 0).sum(axis=0)
    unheld, held = np.argmax(np.where(histogram == 0, held_by, -1)), np.flatnonzero(histogram)[0]
    arrays = model_to_arrays(model)
    for server_round in range(1, rounds + 1):
        messages = list(strategy.configure_train(server_round, arrays,
                                                 ConfigRecord(dict(record)), grid))
        replies = grid.send_and_receive(messages)
        for reply in replies:
            if attack and reply.metadata.src_node_id == hostile["node_id"]:
                rows = reply.content[FEATURE_PROTOTYPES]["prototypes"].numpy().copy()
                counts = histogram.copy()
                if attack == "ghost":
                    rows[unheld], counts[unheld], counts[held] = 1e4, counts[held], 0
                reply.content[FEATURE_PROTOTYPES] = prototypes(
                    rows if attack == "ghost" else -5 * rows, counts)
        result, _ = strategy.aggregate_train(server_round, replies)
        arrays = result if result is not None else arrays
        if guarded:  # no honest partition is ever blamed; the ghost attacker always is
            assert set(strategy.report.rejected_partitions) <= {"0"}
            assert (strategy.report.rejected_partitions == ["0"] or attack != "ghost"
                    or "0" in strategy.clients.excluded)  # excluded after exclude_after rounds
    d = experiment.data
    test = to_tensors(d.test_x, d.test_y, d.mean, d.std)
    net = copy.deepcopy(model)
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in to_numpy(arrays).items()})
    return evaluate(net, *test, batch_size=500, num_classes=d.num_classes)[1]


def test_fedproto_with_an_attacker_ends_within_a_few_points_of_the_honest_run(
        fmnist_available, server_task, monkeypatch):
    honest = fedproto_run(None)
    attacked = fedproto_run("ghost")
    negated = fedproto_run("negated")
    # the probe's attack with the survey and peer rules off (as before issue 27)
    monkeypatch.setattr(fedproto, "survey_problem", lambda *_, **__: None)
    monkeypatch.setattr(rules, "outliers", lambda *_: {})  # (fedproto screens with it)
    unguarded = fedproto_run("ghost", guarded=False)
    print(f"FedProto test accuracy: honest {honest:.1%}, the probe's attacker {attacked:.1%} "
          f"({unguarded:.1%} unguarded), negated x5 inside the bounds {negated:.1%}")
    assert honest > 0.7
    assert attacked > honest - 0.05  # measured: 78.1 % honest, 75.4 % attacked (its data lost)
    assert unguarded < honest - 0.15  # 52.7 %: the honest updates are refused from round 2 on
    # what the bounds leave: 57.9 % measured, FedProto's count-weighted mean follows it
    assert 0.45 < negated < honest


# --- FedCSD's prototype phase -------------------------------------------------------------------

def csd_strategy(*overrides):
    cfg = check_experiment(compose(["strategy=fedcsd", "num_clients=4", *overrides]))
    torch.manual_seed(0)
    model = build_model({"name": "mlp", "hidden": [4]}, (1, 2, 2), 3)
    return surveyed(build_strategy(cfg, model)), {
        k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def csd_phase(strategy, server_round, weights, hostile):
    """configure_train's prototype phase: the nodes answer with logit prototypes (C = 3)."""
    def answer(message):
        node = message.metadata.dst_node_id
        rows, counts = hostile.get(node, (honest_rows(node, server_round)[:, :3],
                                          HISTOGRAMS[node]))
        return Message(metadata=metadata(node, "query.csd_prototypes"),
                       content=RecordDict({PROTOTYPES: prototypes(rows, counts)}))
    return list(strategy.configure_train(
        server_round, ArrayRecord({k: Array(v) for k, v in weights.items()}), ConfigRecord(),
        Grid(HISTOGRAMS, answer)))


def honest_csd(server_round, nodes=(1, 2, 3)):
    from driftfl.strategies.methods.fedcsd import global_prototypes

    return global_prototypes([(honest_rows(n, server_round)[:, :3].astype(np.float32),
                               np.array(HISTOGRAMS[n])) for n in nodes], 3)


@pytest.mark.parametrize("attack, reason", [
    ((ghost[:, :3], [5, 5, 0]), "prototypes of classes [2], which the node does not hold"),
    ((ghost[:, :3], [3, 5, 2]), "counts [2] of classes [2] exceed the data survey's [0]"),
    ((outsized_row[:, :3], HISTOGRAMS[4]), "its class-1 prototype's norm 2.42e+03 is over "
                                           "max_peer_ratio=30 x the round's median 2.08"),
])
def test_fedcsd_leaves_a_hostile_prototype_reply_out_of_p_g_and_training(attack, reason,
                                                                          server_task, caplog):
    strategy, weights = csd_strategy()
    with caplog.at_level("WARNING", logger="flwr"):
        messages = csd_phase(strategy, 1, weights, {4: attack})
    assert [m.metadata.dst_node_id for m in messages] == [1, 2, 3]
    assert f"prototype reply from partition 3 (node 4) rejected: {reason}" in caplog.text
    p_g = messages[0].content[PROTOTYPES]["prototypes"].numpy()
    assert np.array_equal(p_g, honest_csd(1)) and np.array_equal(strategy.prototypes, p_g)


def test_fedcsd_keeps_p_g_over_the_bound_and_reports_it_in_the_rounds_row(server_task):
    strategy, weights = csd_strategy("max_update_ratio=3")
    small = {n: (0.1 * honest_rows(n)[:, :3], HISTOGRAMS[n]) for n in HISTOGRAMS}
    csd_phase(strategy, 1, weights, small)
    before = strategy.prototypes.copy()
    # each row moves by 1.4 x sqrt(3) = 2.4 (under 3 x max(1, ~0.2)); the three classes by 4.2
    shifted = {n: (rows + 1.4 * (rows != 0), counts) for n, (rows, counts) in small.items()}
    messages = csd_phase(strategy, 2, weights, shifted)
    assert len(messages) == 4  # every reply passed; the combined P_G did not
    assert np.array_equal(messages[0].content[PROTOTYPES]["prototypes"].numpy(), before)
    assert np.array_equal(strategy.prototypes, before)
    steps = strategy.local_training.steps(10)
    strategy.aggregate_train(2, [train_reply(n, weights, steps=steps) for n in HISTOGRAMS])
    assert strategy.report.rejected == [] and strategy.report.clients == 4
    assert strategy.report.refused_state[0].startswith("FedCSD's prototypes: it would move")


@pytest.mark.parametrize("rule", ["aggregation=median", "aggregation=trimmed_mean",
                                  "aggregation=krum"])
def test_under_a_robust_rule_fedcsd_combines_the_prototypes_per_class_with_it(rule, server_task):
    """A row 5 x its peers' (inside the peer bound) moves Eq. 7's mean; under a robust rule P_G,c
    is that rule's per class (Krum: the median), so the honest rows decide it."""
    extra = ["aggregation.beta=0.25"] if rule.endswith("trimmed_mean") else []
    strategy, weights = csd_strategy(rule, *extra)
    rows = honest_rows(4)[:, :3].copy()
    rows[1] *= 5
    messages = csd_phase(strategy, 1, weights, {4: (rows, HISTOGRAMS[4])})
    assert len(messages) == 4  # every reply passed the checks
    p_g = strategy.prototypes
    holders = [n for n in HISTOGRAMS if HISTOGRAMS[n][1] > 0]
    class_1 = np.stack([(rows if n == 4 else honest_rows(n)[:, :3])[1] for n in holders])
    assert len(holders) == 4
    if rule.endswith("trimmed_mean"):  # int(0.25 x 4) = 1 cut at each end of every coordinate
        expected = np.sort(class_1, axis=0)[1:3].mean(axis=0)
    else:
        expected = np.median(class_1, axis=0)
    np.testing.assert_allclose(p_g[1], expected, rtol=1e-6)
    # Eq. 7's mean would follow the outsized row: 2.2 per entry against the honest 1.1-1.3
    assert class_1.mean(axis=0)[0] > 2 and p_g[1].max() < 1.5


# --- DCFL: condensed sets and the pre-trained model ---------------------------------------------

# ten classes; node 4, the attacker, holds classes 0 and 1
DCFL_HISTOGRAMS = {1: [5, 5, 0, 0, 0, 0, 0, 0, 0, 0], 2: [0, 0, 5, 5, 0, 0, 0, 0, 0, 0],
                   3: [0, 0, 0, 0, 5, 5, 0, 0, 0, 0], 4: [5, 5, 0, 0, 0, 0, 0, 0, 0, 0]}


def dcfl_strategy(*overrides):
    cfg = check_experiment(compose([
        "strategy=dcfl", "model=mlp", "model.hidden=[16]", "num_clients=4", "strategy.ipc=2",
        "strategy.pretrain_fraction=1", "strategy.pretrain_requests=1",
        "strategy.pretrain_epochs=2", "strategy.dsa=false", *overrides]))
    torch.manual_seed(0)
    model = build_model(cfg.model, (1, 28, 28), 10)
    strategy = build_strategy(cfg, model)
    strategy.meet([{"node_id": n, "partition_id": n - 1, "num_examples": 10,
                    "label_histogram": h} for n, h in DCFL_HISTOGRAMS.items()])
    strategy.image_shape = (1, 28, 28)
    return strategy, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def honest_set(node):
    """ipc = 2 images of N(0, 1) pixels (normalised images' scale) per class the node holds."""
    labels = np.repeat(np.flatnonzero(DCFL_HISTOGRAMS[node]), 2)
    rng = np.random.default_rng(node)
    return rng.standard_normal((len(labels), 1, 28, 28)).astype(np.float32), labels


def condensed(images, labels, node=0) -> dict:
    weight = 0.1 * np.random.default_rng(node).standard_normal((10, 16)).astype(np.float32)
    return {CONDENSED: ArrayRecord({"images": Array(np.asarray(images, np.float32)),
                                    "labels": Array(np.asarray(labels, np.int64))}),
            CLASSIFIER: ArrayRecord({"weight": Array(weight)})}


def same_dcfl_state(a, b) -> bool:
    """Explored clients, classifiers, CKA matrix and condensed store alike, array for array."""
    return (a.explored == b.explored and np.array_equal(a.matrix, b.matrix)
            and all(np.array_equal(x, y) for x, y in zip(a.classifiers, b.classifiers))
            and a.store.keys() == b.store.keys()
            and all(np.array_equal(a.store[n][k], b.store[n][k]) for n in a.store for k in (0, 1)))


def pretrain(strategy, weights, attack):
    """The pre-training request, node 4 answering ``attack`` (None: an error reply)."""
    def answer(message):
        node = message.metadata.dst_node_id
        if node == 4 and attack is None:
            return Message(metadata=metadata(node), error=Error(code=0, reason="gone"))
        records = condensed(*(attack if node == 4 else honest_set(node)), node)
        return Message(metadata=metadata(node, "query.dcfl_condense"), content=RecordDict(
            {**records, METRICS: MetricRecord({NUM_EXAMPLES: 10})}))
    return strategy.pretrain(ArrayRecord({k: Array(v) for k, v in weights.items()}),
                             ConfigRecord(), Grid(DCFL_HISTOGRAMS, answer))


big = np.full((100, 1, 28, 28), 1e4, np.float32)
big[::2] *= -1


@pytest.mark.parametrize("attack, reason", [
    ((big, np.zeros(100, np.int64)), "condensed set holds 100 images of class 0, more than "
                                      "ipc = 2"),  # the probe's set
    ((big[:4], np.array([0, 0, 1, 1])), "its condensed set's largest image norm 2.8e+05 is "
                                        "over max_peer_ratio=30 x the median 29.1"),
    ((honest_set(1)[0], np.array([0, 0, 7, 7])), "condensed images of classes [7], which the "
                                                 "node does not hold"),
])
def test_dcfl_pretraining_stores_no_hostile_set_and_trains_on_the_honest_ones(
        attack, reason, server_task, caplog):
    honest, weights = dcfl_strategy()
    expected = to_numpy(pretrain(honest, weights, None))
    strategy, _ = dcfl_strategy()
    with caplog.at_level("WARNING", logger="flwr"):
        trained = to_numpy(pretrain(strategy, weights, attack))
    assert f"DCFL pre-training reply from partition 3 (node 4) rejected: {reason}" in caplog.text
    assert strategy.explored == [1, 2, 3] and same_dcfl_state(strategy, honest)
    assert all(np.array_equal(trained[k], expected[k]) for k in expected)  # w^1 byte for byte


def test_dcfl_screens_a_rounds_new_set_against_the_stored_ones(server_task):
    strategy, weights = dcfl_strategy()
    strategy.global_arrays = weights  # explore() measures each classifier against it
    for node in (1, 2):  # explored before this round
        strategy.explore(node, 0.1 * np.ones((10, 16)), *honest_set(node), {})
    before = strategy.matrix.copy()
    strategy.asked, strategy.trained = {3, 4}, [3, 4]
    steps = strategy.local_training.steps(10)
    # trained models (a head unchanged from the one sent is refused: it did not train)
    trained = {k: (v + 0.01).astype(v.dtype) for k, v in weights.items()}
    replies = [train_reply(3, trained, steps=steps, **condensed(*honest_set(3))),
               train_reply(4, trained, steps=steps, **condensed(big[:4], [0, 0, 1, 1]))]
    updates = strategy.accept(replies)
    assert [u.node_id for u in updates] == [3] and strategy.report.rejected_partitions == ["3"]
    assert "largest image norm 2.8e+05" in strategy.report.rejected[0]
    assert strategy.explored == [1, 2, 3] and set(strategy.store) == {1, 2, 3}
    assert np.array_equal(strategy.matrix[:2, :2], before) and strategy.matrix.shape == (3, 3)


def test_a_diverging_pretraining_keeps_w0_and_round_1_blames_no_partition(fmnist_available,
                                                                          server_task):
    """The real clients' condensed sets, the server's pre-training at lr 1e6: w^1 moves far
    over max_update_ratio x ||w^0||, so w^0 stays; round 1's honest replies are all used."""
    from test_dcfl import TINY, run_rounds

    from driftfl.server.experiment import prepare_experiment

    strategy, arrays, _ = run_rounds(["strategy=dcfl", *TINY, "strategy.pretrain_lr=1e6"], 1)
    assert strategy.report.refused_state[0].startswith("DCFL's pre-trained model: ")
    assert strategy.report.rejected == [] and strategy.report.clients == 2
    assert strategy.explored and strategy.pretrained is None  # sets kept, w^1 not
    w0 = model_to_arrays(prepare_experiment(compose(["strategy=dcfl", *TINY])).initial_model())
    moved = sum(float(np.sum((arrays[k] - v.numpy()) ** 2)) for k, v in w0.items()) ** 0.5
    assert np.isfinite(moved) and moved < 10  # one honest round from w^0


# --- no exclusion on one-against-one evidence (issue 52) ----------------------------------------

# node 4, the attacker, holds class 2 as node 3 alone does: two holders of class 2
SHARED = {**HISTOGRAMS, 4: [0, 3, 7]}


def tiny(node, server_round=1):
    """The attacker's rows: an honest holder's x 1e-6, the lower median of a two-holder class."""
    held = np.array(SHARED[node]) > 0
    return 1e-6 * server_round * held[:, None] * (np.ones((3, 4)) + 0.1 * node)


def test_a_tiny_prototype_sharing_a_class_with_one_holder_rejects_nobody(server_task,
                                                                         monkeypatch):
    """Under #C=2 an attacker sending its prototypes x 1e-6 was the lower median of the class
    it shares with node 3, whose reply was then "outsized", rejected and after exclude_after
    rounds excluded. Two holders set no bar: the class is measured against the round's
    replies' median norms, which one reply cannot set."""
    monkeypatch.setattr(fedproto, "survey_problem", lambda *_: None)  # node 4 holds class 2
    strategy, weights = proto_strategy()
    for server_round in (1, 2, 3, 4):
        proto_round(strategy, server_round, weights,
                    {4: (tiny(4, server_round), SHARED[4])})
        assert strategy.report.rejected == [], strategy.report.rejected
    assert strategy.clients.excluded == [] and strategy.guard.strikes == {}


def test_a_peer_bar_set_by_one_other_holder_never_strikes(server_task):
    """Even where a peer bar rejects, exclusion needs evidence of the reply alone."""
    replies = [(honest_rows(1).astype(np.float32), np.array(HISTOGRAMS[1])),
               (honest_rows(2).astype(np.float32), np.array(HISTOGRAMS[2])),
               (1e3 * honest_rows(4).astype(np.float32), np.array(HISTOGRAMS[4]))]
    bad = rules.outliers(replies, None, np.zeros(3, bool), 30.0, 10.0)
    assert list(bad) == [2] and bad[2][1]  # by a peer bar: no strike (guard.count_offences)
    two = rules.outliers([replies[0], (1e-6 * replies[1][0], replies[1][1])], None,
                            np.zeros(3, bool), 30.0, 10.0)
    assert two == {}  # two holders: the tiny one is no bar for the other


def test_fedcsd_prototype_phase_refusals_are_recorded_and_count_as_offences(server_task, caplog):
    """A prototype reply refused in FedCSD's phase before training is logged, recorded in the
    round's report and strikes its client like any rejected reply: after exclude_after (3)
    rounds it is excluded and never asked again."""
    strategy, weights = csd_strategy()
    steps = strategy.local_training.steps(10)
    for server_round in (1, 2, 3):
        with caplog.at_level("WARNING", logger="flwr"):
            messages = csd_phase(strategy, server_round, weights, {4: (ghost[:, :3], [5, 5, 0])})
        assert [m.metadata.dst_node_id for m in messages] == [1, 2, 3]
        strategy.aggregate_train(server_round, [train_reply(n, weights, steps=steps)
                                                for n in (1, 2, 3)])
        assert strategy.report.rejected_partitions == ["3"]
        assert "which the node does not hold" in strategy.report.rejected[0]
        assert strategy.report.offenders == [4] and strategy.report.clients == 3
    assert "prototype reply from partition 3 (node 4) rejected" in caplog.text
    assert strategy.clients.excluded == ["3"]
    assert "excluded from the rest of the run" in caplog.text
