"""Hostile clients inside the bounds cannot take over SCAFFOLD's c, FedDyn's h or FedCurv's
Fisher terms (issue 27): the attacks the probe found, re-sent through real Messages into the
real strategies on Fashion-MNIST next to the same run without the attacker, an attacker just
under the peer bound, and the guards alone on hand-made replies (a refused state update, robust
rules on the payloads, FedCurv's screen against the kept terms)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from driftfl.client.objectives.scaffold import step_scale
from driftfl.common.config import compose
from driftfl.common.datasets import to_tensors
from driftfl.common.evaluation import evaluate
from driftfl.common.protocol import (ARRAYS, CONTROL, CONTROL_DELTA, DATASET_META, EXPERIMENT,
                                     FISHER, LOCAL_STEPS, METRICS, model_to_arrays)
from driftfl.methods import build_strategy
from driftfl.server.survey import survey_clients
from driftfl.server.experiment import prepare_experiment
from driftfl.strategies.parts.aggregation import to_numpy
from driftfl.strategies.methods.fedcurv import FISHER_BOUND, FedCurv, sums
from driftfl.strategies.methods.feddyn import FedDyn, next_h
from driftfl.strategies.parts.aggregation import model_norm as norm, update_norm as distance
from driftfl.strategies.parts.guard import lower_median
from driftfl.strategies.parts.robust import MedianAggregation
from driftfl.strategies.methods.scaffold import update_control
from test_fedcurv import reply as curv_reply
from test_methods import InProcessGrid, fmnist_nodes
from test_scaffold_feddyn import honest, reply, scaffold_strategy, start_round

ATTACKER = 104  # the fifth node (partition 4); nodes 100-103 are honest
SETUP = ["model=mlp", "dataset.subset=1500", "dataset.test_subset=1000", "num_clients=5",
         "partition=iid", "seed=1"]


# --- real runs: four honest clients and an attacker -------------------------------------------

def global_of(message):
    return {k: message.content[ARRAYS][k].numpy() for k in message.content[ARRAYS].keys()}


def arrays_of(msg, record=ARRAYS):
    return {k: msg.content[record][k].numpy() for k in msg.content[record].keys()}


class AttackGrid(InProcessGrid):
    """Real clients in process. In ``attack_rounds`` the attacker's reply is replaced by
    ``forge(strategy, message, its honest reply, the honest replies)``; with no ``forge`` it is
    dropped (the run without the attacker). After each round: ``rounds`` holds the strategy's
    ``state_of`` and report, ``sent`` the replies the strategy got."""

    def __init__(self, forge, attack_rounds, state_of):
        super().__init__(fmnist_nodes(5))
        self.forge, self.attack_rounds, self.state_of = forge, attack_rounds, state_of
        self.strategy, self.rounds, self.sent = None, [], []

    def record(self):
        self.rounds.append((self.state_of(self.strategy), self.strategy.report))

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout)
        if not messages or messages[0].metadata.message_type != "train":
            return replies
        if self.sent:  # the state the last round's aggregation left
            self.record()
        attacking = len(self.sent) + 1 in self.attack_rounds
        others = [r for r in replies if r.metadata.src_node_id != ATTACKER]
        out = list(others)
        for message, answer in zip(messages, replies):
            if answer.metadata.src_node_id == ATTACKER and not (attacking and not self.forge):
                out.append(self.forge(self.strategy, message, answer, others) if attacking
                           else answer)
        self.sent.append(out)
        return out


def run(method, forge=None, attack_rounds=None, state_of=lambda s: None, rounds=3, extra=()):
    """(test accuracy of the final model, its arrays, the grid) after ``rounds`` rounds; the
    attacker attacks (or, with no ``forge``, is absent) in ``attack_rounds``, all by default."""
    experiment = prepare_experiment(compose([f"strategy={method}", *SETUP, f"rounds={rounds}",
                                             *extra]))
    model = experiment.initial_model()
    grid = AttackGrid(forge, attack_rounds or range(1, rounds + 1), state_of)
    grid.strategy = strategy = build_strategy(experiment.cfg, model)
    record = ConfigRecord({EXPERIMENT: experiment.cfg.to_json(),
                           DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, 5, node_wait=5, timeout=60))
    result = strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=rounds,
                            train_config=record, evaluate_config=ConfigRecord(dict(record)))
    grid.record()
    final = to_numpy(result.arrays)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in final.items()})
    d = experiment.data
    x, y = to_tensors(d.test_x, d.test_y, d.mean, d.std)
    return evaluate(model, x, y, 1000, d.num_classes)[1], final, grid


def class_zero(g, length):
    """The global model moved by ``length`` along a unit direction that pushes class 0's logit
    up (the robust-rule tests' poisoning direction), float32."""
    d = {k: np.zeros_like(v, dtype=np.float64) for k, v in g.items()}
    d["head.weight"][0], d["head.bias"][0] = 1.0, 1.0
    return {k: (v + length * d[k] / norm(d)).astype(v.dtype) for k, v in g.items()}


def as_found(g, own, others):
    """The probe's attack: 0.9 x the reply check's bound, 10 x max(1, ||w_G||)."""
    return class_zero(g, 0.9 * 10 * max(1.0, norm(g)))


def under_peers(g, own, others):
    """Just under the peer bound: 9.9 x the lower median the reply meets (it is the largest of
    five, so the third smallest honest update norm)."""
    sizes = [distance(arrays_of(r), g) for r in others]
    return class_zero(g, 9.9 * lower_median([*sizes, math.inf]))


def boosted(g, own, others):
    """Its own honest update stretched to 9.9 x that median."""
    sizes = [distance(arrays_of(r), g) for r in others]
    scale = 9.9 * lower_median([*sizes, math.inf]) / distance(own, g)
    return {k: (g[k] + scale * (own[k].astype(np.float64) - g[k])).astype(g[k].dtype)
            for k in g}


def model_attack(make, control=False):
    """Replace the attacker's model by ``make(w_G, own model, honest replies)``; for SCAFFOLD
    also its Delta c_k, as the server recomputes it from that model (so it is consistent)."""
    def forge(strategy, message, answer, others):
        g = global_of(message)
        w = make(g, arrays_of(answer), others)
        answer.content[ARRAYS] = ArrayRecord({k: Array(v) for k, v in w.items()})
        if control:
            scale = np.float32(step_scale(answer.content[METRICS][LOCAL_STEPS], strategy.lr,
                                          strategy.momentum, strategy.divisor))
            c = arrays_of(message, CONTROL)
            answer.content[CONTROL_DELTA] = ArrayRecord({
                k: Array(((g[k] - w[k]) / scale - c[k]).astype(np.float32)) for k in c})
        return answer
    return forge


def fisher_attack(make):
    def forge(strategy, message, answer, others):
        own = arrays_of(answer, FISHER)
        peers = [norm(arrays_of(r, FISHER)) for r in others]
        answer.content[FISHER] = ArrayRecord({k: Array(v) for k, v in make(own, peers).items()})
        return answer
    return forge


def fisher_state(strategy):
    """FedCurv's state: the sums it sends from (every kept node's F_j and F_j * w_j; {}
    before any node's terms are kept)."""
    if not strategy.fisher:
        return {}
    return {f"{part}.{k}": pair[i] for k, pair in sums(strategy.fisher, strategy.weighted,
                                                       strategy.param_keys).items()
            for i, part in enumerate(("penalty", "anchor"))}


STATE = {"scaffold": lambda s: dict(s.control), "feddyn": lambda s: dict(s.h),
         "fedcurv": fisher_state}
AS_FOUND = {"scaffold": model_attack(as_found, control=True), "feddyn": model_attack(as_found),
            "fedcurv": fisher_attack(lambda own, peers: {k: np.full_like(v, FISHER_BOUND)
                                                         for k, v in own.items()})}


@pytest.mark.parametrize("method", ["scaffold", "feddyn", "fedcurv"])
def test_the_attacks_the_probe_found_are_rejected_and_change_nothing(method, fmnist_available,
                                                                     server_task):
    acc, model, clean = run(method, state_of=STATE[method])
    attacked_acc, attacked, grid = run(method, AS_FOUND[method], state_of=STATE[method])
    for (state, report), (clean_state, _) in zip(grid.rounds, clean.rounds):
        assert report.rejected_partitions == ["4"], report.rejected
        assert "over max_peer_ratio=30" in report.rejected[0] and report.refused_state == []
        assert all(state[k].tobytes() == clean_state[k].tobytes() for k in clean_state)
    assert all(attacked[k].tobytes() == model[k].tobytes() for k in model)
    print(f"{method}: {attacked_acc:.1%} attacked, {acc:.1%} without the attacker")
    assert attacked_acc == acc > 0.6


def test_scaffold_an_attacker_under_the_peer_bound_moves_c_within_it(fmnist_available,
                                                                     server_task):
    """Plain mean: each accepted Delta c_k is at most 10 x the round's lower median, so c moves
    by at most (1/K) sum_k ||Delta c_k|| a round; an offset it puts in c stays (the paper's c
    keeps the mean of every c_k, the attacker's forged one included)."""
    acc, _, clean = run("scaffold", state_of=STATE["scaffold"], rounds=4)
    attacked_acc, _, grid = run("scaffold", model_attack(boosted, control=True),
                                attack_rounds=(1, 2), state_of=STATE["scaffold"], rounds=4)
    old = {k: np.zeros_like(v) for k, v in grid.rounds[0][0].items()}
    for (c, report), replies in zip(grid.rounds, grid.sent):
        accepted = [arrays_of(r, CONTROL_DELTA) for r in replies
                    if str(r.metadata.src_node_id - 100) not in report.rejected_partitions]
        sizes = [norm(d) for d in accepted]
        assert max(sizes) <= 10 * lower_median(sizes)
        assert distance(c, old) <= sum(sizes) / 5 + 1e-9
        old = c
    norms = [round(norm(c), 3) for c, _ in grid.rounds]
    clean_norms = [round(norm(c), 3) for c, _ in clean.rounds]
    print(f"scaffold, boosted 9.9x in rounds 1-2: ||c|| {norms} (without it {clean_norms}), "
          f"accuracy {attacked_acc:.1%} vs {acc:.1%}")
    # the probe's c went 0 -> 57 and left no usable reply; here the honest clients train on
    assert all(report.clients >= 4 and set(report.rejected_partitions) <= {"4"}
               for _, report in grid.rounds)
    assert max(norms) < 10 and acc > 0.65 and attacked_acc > 0.55


@pytest.mark.parametrize("method", ["scaffold", "feddyn"])
def test_under_the_median_an_attacker_under_the_peer_bound_barely_moves_the_state(
        method, fmnist_available, server_task):
    """The class-0 push at 9.9 x the median update, every round: the median keeps it out of the
    model and (combine) out of c / h; once it stops the state follows the honest clients."""
    forge = model_attack(under_peers, control=method == "scaffold")
    extra = ["aggregation=median"]
    acc, _, clean = run(method, state_of=STATE[method], extra=extra)
    attacked_acc, _, grid = run(method, forge, state_of=STATE[method], extra=extra)
    stopped_acc, _, stopped = run(method, forge, (1, 2), STATE[method], extra=extra)
    scale = max(norm(state) for state, _ in clean.rounds)
    for run_grid in (grid, stopped):
        for (state, report), (clean_state, _) in zip(run_grid.rounds, clean.rounds):
            assert report.rejected == [] and report.refused_state == []  # all in the bounds
            assert distance(state, clean_state) <= 0.5 * scale
    print(f"{method}, median: accuracy {attacked_acc:.1%} attacked, {stopped_acc:.1%} after it "
          f"stopped, {acc:.1%} without it; state distance "
          f"{[round(distance(s, c), 4) for (s, _), (c, _) in zip(grid.rounds, clean.rounds)]}, "
          f"honest norm up to {scale:.3g}")
    assert attacked_acc > acc - 0.05 and stopped_acc > acc - 0.03


def test_fedcurv_a_fisher_spike_under_the_peer_bound_moves_no_sum_and_costs_little(fmnist_available,
                                                                             server_task):
    """F_k may be max_peer_ratio^2 = 100 x the median ||F_j||: the attacker puts 99 x that
    median on one weight (the sharpest penalty it can make). The reply passes the peer screen,
    but the sums it would make move by about 99 x the median term, over max_update_ratio x the
    round's honest scale (5 x the median change): the sums are refused and stay; honest
    clients still train."""
    def spike(own, peers):
        out = {k: np.zeros_like(v) for k, v in own.items()}
        out["head.weight"][0, 0] = 99 * lower_median([*peers, math.inf])
        return out
    acc, _, clean = run("fedcurv", state_of=STATE["fedcurv"])
    attacked_acc, _, grid = run("fedcurv", fisher_attack(spike), state_of=STATE["fedcurv"])
    norms = grid.strategy.norms
    assert all(report.rejected == [] and report.clients == 5 for _, report in grid.rounds)
    assert ATTACKER not in norms or norms[ATTACKER] <= 100 * lower_median(list(norms.values()))
    assert any("FedCurv's Fisher sums" in refused for _, report in grid.rounds
               for refused in report.refused_state)
    print(f"fedcurv, F_k spike at 99 x the median: accuracy {attacked_acc:.1%} vs {acc:.1%}; "
          f"||sums|| {[round(norm(s), 3) for s, _ in grid.rounds]} vs "
          f"{[round(norm(s), 3) for s, _ in clean.rounds]}")
    assert attacked_acc > acc - 0.04


# --- the guards alone, on hand-made replies --------------------------------------------------

def test_scaffold_c_that_would_explode_is_refused_logged_and_kept(caplog, server_task):
    """K = 1, c = 0: a Delta c_k of norm 10.7 would move c over 10 x max(1, 0); the model's
    update (6.6) is inside its own bound, so the aggregate is still used."""
    strategy, weights = scaffold_strategy("max_peer_ratio=1e6", clients=1)
    start_round(strategy, weights)
    message, delta = honest(strategy, weights, 1, 1.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = strategy.aggregate_train(1, [message])
    assert arrays is not None and strategy.report.rejected == []
    assert not any(c.any() for c in strategy.control.values())
    assert strategy.report.refused_state == [
        f"SCAFFOLD's c: it would move by {norm(delta):.3g}, over the bound 10 (max_update_ratio)"]
    assert "round 1: the update of SCAFFOLD's c refused" in caplog.text


def test_feddyn_h_that_would_explode_is_refused_with_the_model(caplog, server_task):
    """K = 1, alpha = 2: w_1 - w_G = (6, 0) (inside the reply bound 14.1) makes h = (-12, 0)."""
    strategy = FedDyn(param_keys=("w",), num_clients=1, alpha=2.0)
    start_round(strategy, {"w": np.ones(2, np.float32)}, nodes=(1, 2))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = strategy.aggregate_train(1, [reply(1, {"w": np.float32([7.0, 1.0])})])
    assert arrays is None and strategy.h is None
    assert strategy.report.refused_state == [
        "FedDyn's h: it would move by 12, over the bound 10 (max_update_ratio)"]
    assert "the update of FedDyn's h refused" in caplog.text


def test_fedcurv_sums_that_would_explode_are_refused_and_every_node_keeps_its_terms():
    strategy = FedCurv(param_keys=frozenset({"w"}), max_peer_ratio=1e9)  # screens off
    strategy.global_arrays = {"w": np.zeros(2, np.float32)}
    strategy.aggregate_train(1, [curv_reply(1, [1.0, 2.0], [0.5, 1.0]),
                                 curv_reply(2, [3.0, -1.0], [2.0, 0.0])])
    before = {k: v.copy() for k, v in fisher_state(strategy).items()}
    arrays, _ = strategy.aggregate_train(2, [curv_reply(1, [1.0, 1.0], [1e5, 0.0])])
    assert arrays is not None  # FedAvg's aggregate of a checked reply
    assert strategy.fisher[1]["w"].tolist() == [0.5, 1.0]
    assert all(np.array_equal(v, before[k]) for k, v in fisher_state(strategy).items())
    assert strategy.report.refused_state[0].startswith("FedCurv's Fisher sums: it would move")


def test_fedcurv_screens_a_fisher_against_the_kept_nodes_not_only_the_round():
    """Nodes 1-3 are kept with ||F|| = 1; a round where node 4 replies alone has no peers to
    outsize, but 500 is over 10^2 x the kept nodes' lower median; 20 is not."""
    strategy = FedCurv(param_keys=frozenset({"w"}), max_peer_ratio=10.0)
    strategy.global_arrays = {"w": np.zeros(2, np.float32)}
    strategy.aggregate_train(1, [curv_reply(n, [1.0, 1.0], [0.6, 0.8]) for n in (1, 2, 3)])
    arrays, _ = strategy.aggregate_train(2, [curv_reply(4, [1.0, 1.0], [300.0, 400.0])])
    assert arrays is None and set(strategy.fisher) == {1, 2, 3}
    assert "over max_peer_ratio=10^2 x the kept nodes' median 1" in strategy.report.rejected[0]
    arrays, _ = strategy.aggregate_train(3, [curv_reply(4, [1.0, 1.0], [12.0, 16.0])])
    assert arrays is not None and set(strategy.fisher) == {1, 2, 3, 4}


def test_under_the_median_one_huge_control_delta_is_ignored(server_task):
    """|S| = K = 5: c <- c + median(Delta c_k), coordinate-wise; the fifth reply's Delta c is
    ~40x the others' (the peer screen set wide to let it through) and does not move c."""
    strategy, weights = scaffold_strategy("aggregation=median", "max_peer_ratio=1e3", clients=5)
    start_round(strategy, weights, nodes=(1, 2, 3, 4, 5))
    shifts = [0.01, 0.012, 0.008, 0.011, 0.4]
    replies, deltas = zip(*(honest(strategy, weights, i + 1, s) for i, s in enumerate(shifts)))
    arrays, _ = strategy.aggregate_train(1, list(replies))
    assert arrays is not None and strategy.report.clients == 5
    for k in strategy.param_keys:
        expected = np.median(np.stack([d[k].astype(np.float64) for d in deltas]), axis=0)
        np.testing.assert_allclose(strategy.control[k], expected, rtol=1e-12)
        np.testing.assert_allclose(strategy.control[k], deltas[3][k], rtol=1e-6)  # 0.011


def test_under_the_median_feddyn_h_follows_the_median_update(server_task):
    strategy = FedDyn(param_keys=("w",), num_clients=4, alpha=0.5,
                      aggregation=MedianAggregation(), max_peer_ratio=1e3)
    start_round(strategy, {"w": np.ones(2, np.float32)}, nodes=(1, 2, 3))
    strategy.aggregate_train(1, [reply(n, {"w": np.float32(w)}) for n, w in
                                 ((1, [1.2, 1.0]), (2, [1.0, 1.4]), (3, [9.0, 1.0]))])
    # h = -alpha (|S|/K) median(w_k - w_G) = -0.5 * 0.75 * (0.2, 0)
    np.testing.assert_allclose(strategy.h["w"], [-0.075, 0.0], atol=1e-7)


def test_plain_aggregation_keeps_the_papers_formulas_to_the_bit(server_task):
    strategy, weights = scaffold_strategy()
    start_round(strategy, weights)
    (r1, d1), (r2, d2) = honest(strategy, weights, 1, 0.01), honest(strategy, weights, 2, -0.02)
    before = {k: v.copy() for k, v in strategy.control.items()}
    strategy.aggregate_train(1, [r1, r2])
    expected = update_control(before, [d1, d2], 4)
    assert all(strategy.control[k].tobytes() == expected[k].tobytes() for k in expected)
    dyn = FedDyn(param_keys=("w",), num_clients=4, alpha=0.5)
    start_round(dyn, {"w": np.ones(2, np.float32)}, nodes=(1, 2))
    models = [{"w": np.float32([2.0, 1.0])}, {"w": np.float32([1.0, 3.0])}]
    dyn.aggregate_train(1, [reply(n + 1, m) for n, m in enumerate(models)])
    h = next_h({"w": np.zeros(2)}, models, {"w": np.ones(2, np.float32)}, 0.5, 4)
    assert dyn.h["w"].tobytes() == h["w"].tobytes()
