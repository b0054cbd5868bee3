"""FedCurv pinned on hand-worked cases: the penalty, the Fisher, the server's sums without the
node's own terms, and the checks on a reply's Fisher."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict

from driftfl.client.objectives import build_objective
from driftfl.client.objectives.curv import curvature_penalty, diagonal_fisher
from driftfl.common.models import DriftModel
from driftfl.common.protocol import (ARRAYS, FISHER, FISHER_PENALTY, LOCAL_STEPS, METRICS,
                                     NUM_EXAMPLES)
from driftfl.common.training import TrainSettings, train_locally
from driftfl.strategies.methods.fedcurv import FedCurv


def test_penalty_on_a_hand_worked_case():
    w = {"w": torch.tensor([1.0, 2.0])}
    penalty, anchor = {"w": torch.tensor([0.5, 2.0])}, {"w": torch.tensor([1.0, -1.0])}
    # 0.5 * 1 + 2 * 4 - 2 * (1 * 1 + (-1) * 2) = 8.5 + 2
    assert curvature_penalty(w, penalty, anchor).item() == pytest.approx(10.5)


def test_penalty_is_an_elastic_pull_towards_each_other_clients_model():
    """With P = sum_j F_j and Q = sum_j F_j w_j the penalty has the gradient of
    sum_j F_j (w - w_j)^2: each other client pulls w towards its model where its Fisher is big."""
    torch.manual_seed(0)
    fishers, models = torch.rand(3, 5), torch.randn(3, 5)
    w = torch.randn(5, requires_grad=True)
    curvature_penalty({"w": w}, {"w": fishers.sum(0)}, {"w": (fishers * models).sum(0)}).backward()
    elastic = w.detach().clone().requires_grad_(True)
    (fishers * (elastic - models) ** 2).sum().backward()
    assert torch.allclose(w.grad, elastic.grad, atol=1e-6)


def test_fisher_is_the_mean_of_squared_minibatch_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    fisher = diagonal_fisher(model, x, y, batch_size=2)  # batches of 2, 2 and 1, in order
    expected = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for start in (0, 2, 4):
        model.zero_grad()
        F.cross_entropy(model(x[start:start + 2]), y[start:start + 2]).backward()
        for k, p in model.named_parameters():
            expected[k] += p.grad ** 2 / 3
    for k in expected:
        assert torch.allclose(fisher[k], expected[k], atol=1e-7)


def test_with_lam_zero_a_client_trains_exactly_like_fedavg():
    torch.manual_seed(0)
    start = DriftModel(torch.nn.Identity(), 4, 3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    settings = TrainSettings(epochs=2, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.0)
    penalties = ArrayRecord({f"{kind}.{k}": Array(np.ones(tuple(p.shape), np.float32))
                             for kind in ("penalty", "anchor")
                             for k, p in start.named_parameters()})

    def trained(name, section):
        model = DriftModel(torch.nn.Identity(), 4, 3)
        model.load_state_dict(start.state_dict())
        objective = build_objective(name, section)
        if name == "curv":
            objective.job = type("Job", (), {"message": type("M", (), {
                "content": {FISHER_PENALTY: penalties}})(), "experiment": None})()
        train_locally(model, x, y, settings, objective, torch.Generator().manual_seed(1))
        return model.state_dict()

    curv, ce = trained("curv", {"lam": 0.0}), trained("ce", {})
    assert all(torch.equal(curv[k], ce[k]) for k in ce)
    assert not torch.equal(trained("curv", {"lam": 1.0})["head.weight"], ce["head.weight"])


# --- the server -------------------------------------------------------------------------------

def reply(node, w, fisher, n=10):
    content = {ARRAYS: ArrayRecord({"w": Array(np.asarray(w, np.float32))}),
               METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: 1})}
    if fisher is not None:
        content[FISHER] = ArrayRecord({"w": Array(np.asarray(fisher, np.float32))})
    metadata = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                        reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                        message_type="train")
    return Message(metadata=metadata, content=RecordDict(content))


def strategy_after(replies):
    strategy = FedCurv(param_keys=frozenset({"w"}))
    strategy.global_arrays = {"w": np.zeros(2, np.float32)}
    strategy.aggregate_train(1, replies)
    return strategy


def penalty_of(strategy, node):
    strategy.totals = {k: (sum(f[k] for f in strategy.fisher.values()),
                           sum(g[k] for g in strategy.weighted.values()))
                       for k in strategy.param_keys}
    record = strategy.node_knowledge(2, node)[FISHER_PENALTY]
    return record["penalty.w"].numpy().tolist(), record["anchor.w"].numpy().tolist()


def test_each_node_gets_the_others_terms_without_its_own():
    strategy = strategy_after([reply(1, [1.0, 2.0], [0.5, 1.0]),
                               reply(2, [3.0, -1.0], [2.0, 0.0])])
    assert penalty_of(strategy, 1) == ([2.0, 0.0], [6.0, 0.0])  # node 2's F and F * w
    assert penalty_of(strategy, 2) == ([0.5, 1.0], [0.5, 2.0])  # node 1's
    assert penalty_of(strategy, 3) == ([2.5, 1.0], [6.5, 2.0])  # a newcomer: everyone's
    # the aggregate is FedAvg's: the method acts through the clients' loss only
    assert strategy.last_aggregate["w"].tolist() == [2.0, 0.5]


def test_round_one_sends_no_penalty():
    strategy = FedCurv(param_keys=frozenset({"w"}))
    strategy.totals = {}
    assert strategy.node_knowledge(1, 7) == {}


@pytest.mark.parametrize("fisher, reason", [
    (None, "lacks the 'fisher' record"),
    ([np.nan, 0.0], "not finite"),
    ([-1.0, 0.0], "non-negative"),
    ([1e7, 0.0], "within"),
    ([1.0, 0.0, 0.0], "float32[3]"),
])
def test_a_bad_fisher_is_refused_and_never_kept(fisher, reason):
    strategy = strategy_after([reply(1, [1.0, 2.0], [0.5, 1.0]), reply(2, [3.0, 3.0], fisher)])
    assert strategy.report.clients == 1 and reason in strategy.report.rejected[0]
    assert set(strategy.fisher) == {1} and set(strategy.weighted) == {1}
    assert strategy.last_aggregate["w"].tolist() == [1.0, 2.0]  # node 2's model unused too
