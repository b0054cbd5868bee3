"""Robust by default where clients are not trusted (issue 43): the bounded rule's formula on
hand-checked cases, where it is chosen, a state that moves at its clients' honest scale, and
repeat offenders excluded."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from driftfl.common.config import compose
from driftfl.common.protocol import CONTROL_DELTA
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies.parts.aggregation import Aggregation
from driftfl.strategies.parts.bounded import (BoundedAggregation, centred_clip, trust_line,
                                              untrusted)
from driftfl.strategies.parts.guard import state_problem
from test_robust import GLOBAL, updates
from test_scaffold_feddyn import honest, scaffold_strategy, start_round


def vectors(*values):
    return [{"w": np.asarray(v, np.float64)} for v in values]


# --- the rule on hand-checked cases ---------------------------------------------------------

def test_centred_clip_moves_each_vector_to_within_the_lower_median_distance_of_the_median():
    # 1-D: median 3; distances 2, 1, 0, 1, 97; the lower median of the nonzero ones is 1 = tau
    out, factors = centred_clip(vectors([1.0], [2.0], [3.0], [4.0], [100.0]), ratio=1.0)
    assert [float(v["w"][0]) for v in out] == [2.0, 2.0, 3.0, 4.0, 4.0]
    assert factors == [0.5, 1.0, 1.0, 1.0, pytest.approx(1 / 97)]
    # clip_ratio 2: tau = 2, the far vector lands at 3 + 2, the others as sent
    out, _ = centred_clip(vectors([1.0], [2.0], [3.0], [4.0], [100.0]), ratio=2.0)
    assert [float(v["w"][0]) for v in out] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_two_vectors_cannot_show_which_is_honest_and_are_left_as_sent():
    out, factors = centred_clip(vectors([0.0], [1000.0]), ratio=1.0)
    assert factors == [1.0, 1.0] and float(out[1]["w"][0]) == 1000.0


def test_the_models_are_bounded_before_the_mean():
    """Three honest updates near +1 and one at -9 (inside the reply check's 10 x ||w|| bound),
    each weighing a quarter: moves (1, 1), (1.2, 0.9), (0.9, 1.1), (-9, -9); centre (0.95,
    0.95); the distances' lower median (0 left out) is tau = 0.158."""
    rule = BoundedAggregation(Aggregation(), clip_ratio=1.0)
    sent = updates([[2.0, 2.0], [2.2, 1.9], [1.9, 2.1], [-8.0, -8.0]])
    bounded = rule.bound_updates(sent, GLOBAL)
    centre, tau = np.array([0.95, 0.95]), math.hypot(0.05, 0.15)
    moves = [u.arrays["w"].astype(np.float64) - 1.0 for u in bounded]
    assert all(np.linalg.norm(m - centre) <= tau + 1e-6 for m in moves)
    # towards (-9, -9), within tau (its sum over the rounds, this first round, bounded too:
    # test_history.py)
    assert np.all(moves[3] < centre) and np.linalg.norm(moves[3] - centre) <= tau
    assert np.allclose(moves[0], [1.0, 1.0])  # within tau: as sent
    assert list(rule.clipped) == [2, 4]  # (1.2, 0.9) was 0.269 from the centre
    mean = rule.aggregate(bounded, GLOBAL)["w"]
    # the attacker moves the mean by at most its weight x tau from the honest clients' bounded
    honest = np.mean([m for m in moves[:3]], axis=0) * 3 / 4 + centre / 4 + 1.0
    assert np.linalg.norm(mean - honest) <= tau / 4 + 1e-6
    assert np.all(mean > 1.8)  # the plain mean: (-0.475, -0.5)
    assert bounded[0].arrays["count"] == sent[0].arrays["count"]  # counters as sent


def test_payloads_are_bounded_alike_before_the_methods_mean():
    rule = BoundedAggregation(Aggregation(), clip_ratio=1.0)
    five = vectors([1.0], [2.0], [3.0], [4.0], [100.0])
    assert float(rule.combine(five, np.ones(5))["w"][0]) == pytest.approx(3.0)  # 2 2 3 4 4
    assert Aggregation().combine(five, np.ones(5))["w"][0] == 22.0


# --- where it is chosen -----------------------------------------------------------------------

@pytest.mark.parametrize("trust, deployed, bounded", [
    ("auto", False, False), ("auto", True, True), ("none", False, True),
    ("clients", True, False)])
def test_untrusted_clients_get_the_bounded_rule_and_deployment_is_untrusted_by_default(
        trust, deployed, bounded, server_task):
    from test_scaffold_feddyn import tiny_model
    cfg = check_experiment(compose([f"trust={trust}"]))
    strategy = build_strategy(cfg, tiny_model(), claims_counts=deployed)
    assert untrusted(cfg, deployed) is bounded
    assert isinstance(strategy.aggregation, BoundedAggregation) is bounded
    line = trust_line(cfg, strategy.aggregation, deployed)
    if bounded:
        assert line.startswith(f"driftfl: clients not trusted (trust={trust}): each client's")
        assert "1 x the round's median distance" in line and "paper's plain mean" in line
    elif deployed:
        assert line.startswith("driftfl: warning: trust=clients")
    else:
        assert line == ("driftfl: clients trusted (trust=auto in simulation): each method's own "
                        "formula, so one client can steer the model and the method's state "
                        "without limit; trust=none bounds each client's influence")


@pytest.mark.parametrize("deployed", [True, False])
def test_two_untrusted_clients_are_told_no_bound_is_possible_and_what_a_liar_weighs(
        deployed, server_task):
    """centred_clip leaves two replies as sent; in deployment a node claiming 10^7 examples
    against its peer's count is capped at 10 x that count: 10 / 11 of the mean."""
    from test_scaffold_feddyn import tiny_model
    cfg = check_experiment(compose(["trust=none", "num_clients=2"]))
    strategy = build_strategy(cfg, tiny_model(), claims_counts=deployed)
    line = trust_line(cfg, strategy.aggregation, deployed)
    assert line.startswith("driftfl: warning: clients not trusted (trust=none), but with 2 "
                           "clients a round no bound is possible")
    assert "without limit" in line and "3 clients a round or more are bounded" in line
    assert ("weighs up to 10 / (10 + 1) = 90.9% of the mean (max_examples_ratio=10) unless "
            "owners= declares its count" in line) is deployed
    cfg = check_experiment(compose(["trust=none", "num_clients=3"]))
    assert "no bound" not in trust_line(cfg, build_strategy(cfg, tiny_model()).aggregation,
                                        deployed)


@pytest.mark.parametrize("overrides, reason", [
    (["aggregation=median"], "aggregation=median bounds each client's influence"),
    (["privacy=central", "fraction=0.5"],
     "privacy=central: each client's influence is bounded by the clip"),
    (["secagg=secaggplus", "num_clients=4"], "secagg=secaggplus: the server sees no client")])
def test_where_something_else_bounds_a_client_the_line_says_what(overrides, reason, server_task):
    from test_scaffold_feddyn import tiny_model
    cfg = check_experiment(compose(["trust=none", *overrides]))
    strategy = build_strategy(cfg, tiny_model())
    assert not isinstance(strategy.aggregation, BoundedAggregation)
    assert reason in trust_line(cfg, strategy.aggregation, False)


def test_the_bounded_rule_wraps_a_methods_own_rule(server_task):
    from test_scaffold_feddyn import tiny_model
    cfg = check_experiment(compose(["strategy=fednova", "trust=none"]))
    strategy = build_strategy(cfg, tiny_model())
    assert type(strategy.aggregation.inner).__name__ == "FedNovaAggregation"


# --- state moves at its clients' honest scale -------------------------------------------------

def test_a_state_from_zero_moves_at_most_ratio_times_the_rounds_honest_scale():
    new, old = {"c": np.array([3.0, 4.0])}, None  # a move of 5 from zero
    assert state_problem(new, old, 10.0) is None  # the old bound: 10 x max(1, 0) = 10
    problem = state_problem(new, old, 10.0, scale=0.1)  # honest clients move it by 0.1
    assert problem == ("it would move by 5, over the bound 1 (max_update_ratio x the round's "
                       "median contribution)")
    assert state_problem(new, old, 10.0, scale=0.6) is None
    # a scale above max(1, ||old||) never loosens the old bound
    assert state_problem({"c": np.array([30.0, 40.0])}, old, 10.0, scale=100.0) is not None


def test_scaffolds_c_cannot_jump_from_zero_by_more_than_its_clients_honest_scale(
        server_task, caplog):
    """Four clients; three move c by a little each, one by 300 x more (the peer screen set
    aside: max_peer_ratio=1e6). The old bound, 10 x max(1, ||c||) = 10 from c = 0, lets that c
    through; the new one, max_update_ratio x (|S|/K) x the median ||Delta c_k||, refuses it."""
    from driftfl.strategies.methods.scaffold import update_control
    strategy, weights = scaffold_strategy("trust=clients", "max_peer_ratio=1e6")
    start_round(strategy, weights)
    sent = [honest(strategy, weights, node, shift)
            for node, shift in ((1, 0.001), (2, 0.002), (3, 0.003), (4, 0.3))]
    candidate = update_control(strategy.control, [d for _, d in sent], 4)
    assert state_problem(candidate, strategy.control, 10.0) is None  # the old bound
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = strategy.aggregate_train(1, [m for m, _ in sent])
    assert arrays is not None and strategy.report.clients == 4  # every reply was used
    assert strategy.report.refused_state and "SCAFFOLD's c" in strategy.report.refused_state[0]
    assert "the round's median contribution" in strategy.report.refused_state[0]
    assert not any(c.any() for c in strategy.control.values())  # c stays 0
    # honest clients alone move it
    strategy, weights = scaffold_strategy("trust=clients")
    start_round(strategy, weights)
    strategy.aggregate_train(1, [m for m, _ in sent[:3]])
    assert not strategy.report.refused_state and any(c.any() for c in strategy.control.values())


# --- repeat offenders ---------------------------------------------------------------------------

def test_a_client_rejected_three_rounds_in_a_row_is_excluded_named_once(server_task, caplog):
    strategy, weights = scaffold_strategy("trust=clients")
    for server_round in (1, 2, 3, 4):
        messages = start_round(strategy, weights, server_round)
        if server_round == 4:  # excluded: never sampled again
            assert sorted(m.metadata.dst_node_id for m in messages) == [1, 2, 3]
            break
        replies = [honest(strategy, weights, node, 0.001 * node)[0] for node in (1, 2, 3)]
        bad, _ = honest(strategy, weights, 4, 0.002)
        bad.content[CONTROL_DELTA] = ArrayRecord({"nope": Array(np.zeros(1, np.float32))})
        with caplog.at_level(logging.WARNING, logger="flwr"):
            strategy.aggregate_train(server_round, [*replies, bad])
        assert strategy.report.rejected_partitions == ["node4"]
    named = [r.message for r in caplog.records if "excluded from the rest of the run" in r.message]
    assert named == ["node 4 excluded from the rest of the run: its replies were rejected 3 "
                     "rounds in a row (exclude_after=3)"]
    assert strategy.clients.excluded == ["node4"]


def test_a_round_that_rejects_most_replies_strikes_nobody(server_task):
    strategy, weights = scaffold_strategy("trust=clients")
    for server_round in (1, 2, 3):
        start_round(strategy, weights, server_round)
        replies = []
        for node in (1, 2, 3, 4):
            message, _ = honest(strategy, weights, node, 0.001 * node)
            if node != 1:  # three of four rejected: the round, not the clients
                message.content[CONTROL_DELTA] = ArrayRecord(
                    {"nope": Array(np.zeros(1, np.float32))})
            replies.append(message)
        strategy.aggregate_train(server_round, replies)
        assert len(strategy.report.rejected) == 3
    assert strategy.clients.excluded == [] and strategy.guard.strikes == {}


def test_exclude_after_0_never_excludes(server_task):
    strategy, weights = scaffold_strategy("trust=clients", "exclude_after=0")
    for server_round in (1, 2, 3, 4):
        start_round(strategy, weights, server_round)
        replies = [honest(strategy, weights, node, 0.001 * node)[0] for node in (1, 2, 3)]
        bad, _ = honest(strategy, weights, 4, 0.002)
        bad.content[CONTROL_DELTA] = ArrayRecord({"nope": Array(np.zeros(1, np.float32))})
        strategy.aggregate_train(server_round, [*replies, bad])
    assert strategy.clients.excluded == []
