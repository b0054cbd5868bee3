"""Server-side aggregation: FedAvg, FedNova, FedAvgM, FedDisco on hand-computed cases, and the
checks that keep a bad reply away from the global model."""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import (Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord,
                      RecordDict)

from driftfl.common.protocol import ARRAYS, LOCAL_STEPS, METRICS, NUM_EXAMPLES
from driftfl.strategies import FedAvg, FedAvgM, FedNovaAggregation
from driftfl.strategies.parts.aggregation import (ClientUpdate, check_reply, example_weights,
                                                  mean_metrics, weighted_average)
from driftfl.strategies.parts.fednova import nova_normaliser

GLOBAL = {"w": np.array([1.0, 1.0], np.float32), "count": np.array(5, np.int64)}


def metadata(node):
    """A train reply's metadata as the SuperLink delivers it."""
    return Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type="train")


def message(node, records):
    return Message(metadata=metadata(node), content=RecordDict(records))


def reply(node, w, n, count=7, steps=1, **metrics):
    arrays = ArrayRecord({"w": Array(np.asarray(w, np.float32)),
                          "count": Array(np.array(count, np.int64))})
    values = {NUM_EXAMPLES: n, **metrics}
    if steps is not None:
        values[LOCAL_STEPS] = steps
    return message(node, {ARRAYS: arrays, METRICS: MetricRecord(values)})


def started(strategy):
    strategy.global_arrays = {k: v.copy() for k, v in GLOBAL.items()}
    return strategy


def aggregate(strategy, replies):
    arrays, metrics = strategy.aggregate_train(1, replies)
    return (None if arrays is None else {k: v.numpy() for k, v in arrays.items()}), metrics


def test_fedavg_weights_by_examples_and_keeps_integer_counters_from_the_first_client():
    arrays, metrics = aggregate(started(FedAvg()), [
        reply(1, [2.0, 0.0], n=10, count=7, loss=1.0),
        reply(2, [5.0, 3.0], n=30, count=9, loss=3.0)])
    assert np.allclose(arrays["w"], [0.25 * 2 + 0.75 * 5, 0.75 * 3])
    assert arrays["w"].dtype == np.float32
    assert arrays["count"] == 7 and arrays["count"].dtype == np.int64
    assert metrics["loss"] == pytest.approx(2.5) and metrics[NUM_EXAMPLES] == 40


def test_replies_are_used_in_node_order_not_arrival_order():
    # floating-point sums depend on the order; arrival order would make same-seed runs differ
    strategy = started(FedAvg())
    strategy.clients.node_rank = {30: 0, 10: 1, 20: 2}  # node id -> partition id
    arrivals = [reply(20, [1.0, 2.0], n=5, count=2), reply(10, [3.0, 1.0], n=7, count=1),
                reply(30, [0.5, 0.1], n=3, count=0), reply(99, [2.0, 2.0], n=1, count=3)]
    assert [u.node_id for u in strategy.accept(arrivals)] == [30, 10, 20, 99]
    first, second = aggregate(strategy, arrivals), aggregate(strategy, arrivals[::-1])
    assert first[0]["count"] == 0 == second[0]["count"]  # the counter of partition 0's node
    assert first[0]["w"].tobytes() == second[0]["w"].tobytes()


@pytest.mark.parametrize("bad, reason", [
    (lambda: reply(9, [np.nan, 0.0], n=10), "NaN or infinite"),
    (lambda: reply(9, [1.0, 2.0, 3.0], n=10), r"float32\[3\], expected float32\[2\]"),
    (lambda: reply(9, [1.0, 1.0], n=0), "not a positive number"),
    (lambda: reply(9, [1.0, 1.0], n=float("inf")), "'num-examples' is inf"),
    (lambda: reply(9, [1e30, 1.0], n=10), r"update's norm 1e\+30 exceeds the bound 14.1"),
    (lambda: reply(9, [1.0, 1.0], n=10, loss=float("nan")), "metric 'loss' is nan"),
    (lambda: reply(9, [1.0, 1.0], n=10, steps=0), "at least one local step"),
    (lambda: reply(9, [1.0, 1.0], n=10, **{"class-alpha": [0.5, float("inf")]}), "infinite"),
])
def test_a_bad_reply_never_touches_the_global_model(bad, reason):
    strategy = started(FedAvg())
    arrays, _ = aggregate(strategy, [reply(1, [3.0, 3.0], n=10), bad()])
    assert np.allclose(arrays["w"], [3.0, 3.0])
    assert strategy.report.clients == 1 and len(strategy.report.rejected) == 1
    assert re.search(reason, strategy.report.rejected[0])


def test_replies_with_other_keys_or_records_are_rejected():
    wrong_keys = message(3, {ARRAYS: ArrayRecord({"v": Array(np.zeros(2, np.float32))}),
                             METRICS: MetricRecord({NUM_EXAMPLES: 5})})
    no_metrics = message(3, {ARRAYS: ArrayRecord({"w": Array(np.zeros(2, np.float32))})})
    for msg, reason in ((wrong_keys, "model keys differ"), (no_metrics, "lacks")):
        assert reason in check_reply(msg, GLOBAL)


def test_an_error_reply_is_rejected_and_no_usable_reply_keeps_the_model():
    error = Message(metadata=metadata(4), error=Error(code=0, reason="node died"))
    strategy = started(FedAvg())
    arrays, metrics = aggregate(strategy, [error])
    assert arrays is None and metrics is None
    assert "node died" in strategy.report.rejected[0]


def test_extra_records_in_a_reply_do_not_break_aggregation():
    msg = reply(1, [4.0, 4.0], n=10)
    msg.content["prototypes"] = ArrayRecord({"p": Array(np.ones(3, np.float32))})
    msg.content["extra-config"] = ConfigRecord({"x": 1})
    arrays, _ = aggregate(started(FedAvg()), [msg, reply(2, [0.0, 0.0], n=10)])
    assert np.allclose(arrays["w"], [2.0, 2.0])


def test_metric_means_use_only_keys_every_client_sent():
    updates = [check_reply(reply(1, [1, 1], n=1, a=1.0, b=5.0), GLOBAL),
               check_reply(reply(2, [1, 1], n=3, a=3.0), GLOBAL)]
    metrics = mean_metrics(updates, example_weights(updates))
    assert metrics == {"a": 2.5, LOCAL_STEPS: 1.0, NUM_EXAMPLES: 4.0}


def test_weighted_average_of_many_clients_matches_numpy():
    rng = np.random.default_rng(0)
    ws = rng.normal(size=(5, 2)).astype(np.float32)
    ns = rng.integers(1, 100, 5)
    updates = [check_reply(reply(i, w, n=int(n)), GLOBAL) for i, (w, n) in enumerate(zip(ws, ns))]
    out = weighted_average(updates, example_weights(updates))
    assert np.allclose(out["w"], np.average(ws, axis=0, weights=ns), atol=1e-6)


# --- FedNova ----------------------------------------------------------------------------

def test_nova_normaliser_is_the_sum_of_momentum_coefficients():
    for rho in (0.0, 0.5, 0.9):
        for tau in (1, 2, 7):
            # each of the tau gradients is applied with weight sum_{j<remaining} rho^j
            explicit = sum((1 - rho ** (tau - t)) / (1 - rho) if rho else 1 for t in range(tau))
            assert nova_normaliser(tau, rho) == pytest.approx(explicit)
    assert nova_normaliser(1, 0.9) == pytest.approx(1.0)
    assert nova_normaliser(5, 0.0) == 5


def nova(momentum=0.0):
    return started(FedAvg(aggregation=FedNovaAggregation(momentum=momentum,
                                                          param_keys=frozenset({"w"}))))


def test_fednova_hand_computed_case():
    # w_G = [1, 1]; client A: n=10, tau=2, w=[3, 1]; client B: n=30, tau=6, w=[1, -5]
    arrays, _ = aggregate(nova(), [reply(1, [3.0, 1.0], n=10, steps=2),
                                   reply(2, [1.0, -5.0], n=30, steps=6)])
    gamma, a = np.array([0.25, 0.75]), np.array([2.0, 6.0])
    d = np.array([[-2.0, 0.0], [0.0, 6.0]]) / a[:, None]  # (w_G - w_k) / a_k
    expected = np.array([1.0, 1.0]) - (gamma @ a) * (gamma @ d)
    assert np.allclose(arrays["w"], expected)
    assert arrays["count"] == 7  # a buffer: averaged (here: counter from the first client)


def test_fednova_rejects_replies_without_a_usable_step_count_instead_of_failing():
    # every reply of the round reports 0 local steps (or none, or inf): each is rejected with
    # its reason, the global model stays as it was and no strategy state changes
    strategy = nova()
    arrays, metrics = aggregate(strategy, [reply(1, [3.0, 1.0], n=10, steps=0),
                                           reply(2, [1.0, -5.0], n=30, steps=float("inf")),
                                           reply(3, [1.0, -5.0], n=30, steps=None)])
    assert arrays is None and metrics is None
    assert strategy.report.clients == 0 and len(strategy.report.rejected) == 3
    assert all(LOCAL_STEPS in r for r in strategy.report.rejected)
    arrays, _ = aggregate(strategy, [reply(1, [3.0, 1.0], n=10, steps=2),
                                     reply(2, [1.0, -5.0], n=30, steps=0)])
    assert np.allclose(arrays["w"], [3.0, 1.0])  # the one usable reply, as FedNova steps it
    assert strategy.report.clients == 1


def test_fednova_equals_fedavg_when_every_client_takes_the_same_steps():
    replies = [reply(1, [3.0, 1.0], n=10, steps=4), reply(2, [1.0, -5.0], n=30, steps=4)]
    nova_w, _ = aggregate(nova(), replies)
    avg_w, _ = aggregate(started(FedAvg()), replies)
    assert np.allclose(nova_w["w"], avg_w["w"])


# --- FedAvgM (Flower's server momentum over driftfl's checked average) ------------------------

def test_fedavgm_applies_server_momentum_to_the_checked_average():
    strategy = started(FedAvgM(server_learning_rate=1.0, server_momentum=0.5))
    strategy.current_arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    arrays, _ = aggregate(strategy, [reply(1, [0.0, 0.0], n=1), reply(2, [np.nan, 0], n=1)])
    assert np.allclose(arrays["w"], [0.0, 0.0])  # v = Delta = [1, 1]; w = 1 - 1
    strategy.global_arrays = {"w": arrays["w"], "count": arrays["count"]}
    arrays, _ = aggregate(strategy, [reply(1, [0.0, 0.0], n=1)])
    assert np.allclose(arrays["w"], [-0.5, -0.5])  # Delta = 0, v = 0.5 * v, w = 0 - 0.5
    assert arrays["count"].dtype == np.int64 and arrays["count"].shape == ()  # still a counter


# --- FedDisco's discrepancy: l2 (ALGORITHMS.md, the default) or kl (the authors' scripts) -------

def disco_round(metric):
    """Three surveyed nodes, C = 4, with 40, 40 and 20 examples; FedDisco's round weights."""
    from driftfl.strategies.parts.feddisco import FedDiscoAggregation

    aggregation = FedDiscoAggregation(a=0.5, b=0.1, metric=metric)
    aggregation.meet([{"node_id": node, "label_histogram": hist} for node, hist in
                      ((1, [3, 1, 0, 0]), (2, [2, 2, 0, 0]), (3, [1, 1, 1, 1]))])
    updates = [ClientUpdate(node, {}, {NUM_EXAMPLES: n}, None)
               for node, n in ((1, 40.0), (2, 40.0), (3, 20.0))]
    return aggregation, aggregation.weights(updates)


def test_feddisco_kl_discrepancy_on_a_hand_checked_histogram():
    from driftfl.strategies.parts.feddisco import discrepancy

    # D = (3/4, 1/4, 0, 0), U = 1/4: KL = 3/4 ln(3/4 * 4) + 1/4 ln(1/4 * 4) = 3/4 ln 3 = 0.823959;
    # the empty classes add 0 (0 log 0 = 0, as scipy.special.kl_div in the authors' code)
    assert discrepancy([3, 1, 0, 0], "kl") == pytest.approx(0.75 * np.log(3))
    assert discrepancy([2, 2, 0, 0], "kl") == pytest.approx(np.log(2))  # 1/2 ln 2 + 1/2 ln 2
    assert discrepancy([1, 1, 1, 1], "kl") == 0.0
    # the round's d_k are the KLs over their sum: 0.823959 / 1.517106 = 0.543112, 0.456888, 0;
    # p ∝ ReLU(n_k/n - 0.5 d_k + 0.1) = (0.228444, 0.271556, 0.3), / 0.8
    aggregation, weights = disco_round("kl")
    assert weights == pytest.approx([0.285555, 0.339445, 0.375], abs=1e-6)
    # a round where every client is uniform: every d_k is 0 (the authors' rule), p = n_k/n + b
    aggregation.discrepancies = {1: 0.0, 2: 0.0}
    assert aggregation.weights([ClientUpdate(k, {}, {NUM_EXAMPLES: n}, None)
                                for k, n in ((1, 30.0), (2, 10.0))]) == pytest.approx(
        [0.85 / 1.2, 0.35 / 1.2])


def test_feddisco_l2_is_the_default_and_keeps_its_numbers():
    from driftfl.common.config import compose
    from driftfl.methods import check_experiment
    from driftfl.strategies.parts.feddisco import FedDiscoAggregation

    cfg = check_experiment(compose(["strategy=feddisco"]))
    assert cfg.aggregation.metric == "l2"
    assert FedDiscoAggregation.from_config(cfg, None).metric == "l2"
    # d_k = ||D_k - U||_2 = sqrt(0.375) = 0.612372, 0.5, 0 (not divided by the round's sum);
    # p ∝ (0.4 - 0.306186 + 0.1, 0.4 - 0.25 + 0.1, 0.2 + 0.1) = (0.193814, 0.25, 0.3)
    aggregation, weights = disco_round("l2")
    assert list(aggregation.discrepancies.values()) == pytest.approx([np.sqrt(0.375), 0.5, 0])
    assert weights == pytest.approx([0.260568, 0.336106, 0.403327], abs=1e-6)
    cfg = check_experiment(compose(["strategy=feddisco", "aggregation.metric=kl"]))
    assert FedDiscoAggregation.from_config(cfg, None).metric == "kl"
