"""heterogeneity=: the drawn epochs, stragglers' budgets and dropouts, what the server sends
each client and how it checks and aggregates what comes back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from driftfl.common.conditions import (ASSIGNED_EPOCHS, ASSIGNED_MAX_STEPS, ASSIGNMENT,
                                       HeterogeneitySettings, assignments, drawn_epochs)
from driftfl.common.config import compose
from driftfl.methods import check_experiment
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import LOCAL_STEPS
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally
from driftfl.common.models import build_model
from driftfl.strategies import FedAvg, FedNovaAggregation, Selection
from driftfl.strategies.parts.round_plan import RoundPlan
from test_aggregation import GLOBAL, reply
from test_strategy_base import FakeGrid

EPOCHS = HeterogeneitySettings(name="epochs", min_epochs=1, max_epochs=5)
LOCAL = TrainSettings(epochs=1, batch_size=5, lr=0.1, momentum=0.0, weight_decay=0.0)
NODES = [11, 12, 13, 14]  # partitions 0..3, 12 examples each: ceil(12 / 5) = 3 steps an epoch


def test_drawn_epochs_are_seeded_in_range_and_differ_between_clients():
    draws = [drawn_epochs(EPOCHS, 0, 1, p, 1) for p in range(20)]
    assert draws == [drawn_epochs(EPOCHS, 0, 1, p, 1) for p in range(20)]  # same seed: same
    assert set(draws) <= {1, 2, 3, 4, 5} and len(set(draws)) > 1  # differ between clients
    assert draws != [drawn_epochs(EPOCHS, 1, 1, p, 1) for p in range(20)]  # the seed matters
    assert draws != [drawn_epochs(EPOCHS, 0, 2, p, 1) for p in range(20)]  # and the round
    fixed = EPOCHS.model_copy(update={"per_round": False})
    assert len({drawn_epochs(fixed, 0, r, 3, 1) for r in range(1, 30)}) == 1  # per client
    assert drawn_epochs(HeterogeneitySettings(), 0, 1, 3, 4) == 4  # none: local_epochs


def test_the_share_that_straggles_or_drops_is_seeded_and_sized():
    drop = HeterogeneitySettings(name="dropout", share=0.2)
    plan = assignments(drop, 0, 5, list(range(10)), 1)
    assert sum(a.dropped for a in plan.values()) == 2
    assert plan == assignments(drop, 0, 5, list(range(10)), 1)
    late = HeterogeneitySettings(name="stragglers", share=0.5, step_budget=0.5)
    plan = assignments(late, 0, 5, list(range(4)), 2)
    assert sorted(a.budget for a in plan.values() if a.budget) == [0.5, 0.5]
    assert not any(a.dropped for a in plan.values())
    assert plan[next(p for p, a in plan.items() if a.budget)].max_steps(7) == 3  # floor(3.5)
    dropped = late.model_copy(update={"stragglers": "drop"})
    assert sum(a.dropped for a in assignments(dropped, 0, 5, list(range(4)), 2).values()) == 2


def strategy(heterogeneity, aggregation=None, examples=12):
    s = FedAvg(selection=Selection(seed=0), fraction_train=1.0, min_train_nodes=1,
               min_available_nodes=len(NODES), local_training=LOCAL,
               **({"aggregation": aggregation} if aggregation else {}))
    s.meet([{"node_id": n, "partition_id": i, "num_examples": examples}
            for i, n in enumerate(NODES)])
    s.plan = RoundPlan(heterogeneity, seed=0, local_epochs=1)
    return s


def sent(s, server_round=2):  # round 2: partitions 0..3 draw 1, 3, 5, 4 epochs
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    messages = s.configure_train(server_round, arrays, ConfigRecord({}), FakeGrid(NODES))
    return {m.metadata.dst_node_id: dict(m.content.config_records[ASSIGNMENT])
            for m in messages}


def test_a_client_asked_for_e_epochs_reports_e_times_its_batches_and_is_accepted(server_task):
    s = strategy(EPOCHS)
    asked = sent(s)
    epochs = {n: asked[n][ASSIGNED_EPOCHS] for n in NODES}
    assert epochs == {n: drawn_epochs(EPOCHS, 0, 2, i, 1) for i, n in enumerate(NODES)}
    assert len(set(epochs.values())) > 1 and all(a[ASSIGNED_MAX_STEPS] == 0
                                                 for a in asked.values())
    honest = [reply(n, [1.0, 1.0], n=12, steps=epochs[n] * 3) for n in NODES]
    s.aggregate_train(1, honest)
    assert s.report.clients == 4 and not s.report.rejected
    # one that claims a step more than it was asked for (or the experiment's 1 epoch) is refused
    liar = NODES[0]
    for claim in (epochs[liar] * 3 + 1, 3 if epochs[liar] != 1 else 6):
        s.aggregate_train(1, [reply(liar, [1.0, 1.0], n=12, steps=claim), *honest[1:]])
        assert s.report.clients == 3 and len(s.report.rejected) == 1
        assert f"is {claim}, but {epochs[liar]} epoch" in s.report.rejected[0]


def test_the_client_loop_takes_exactly_e_times_its_batches_or_its_budget():
    torch.manual_seed(0)
    x, y = torch.randn(12, 1, 2, 2), torch.randint(0, 3, (12,))

    def steps(settings):
        model = build_model(validated_mlp(), [1, 2, 2], 3)
        return train_locally(model, x, y, settings, CrossEntropy(),
                             torch.Generator().manual_seed(0)).steps

    three = TrainSettings(3, 5, 0.1, 0.0, 0.0)
    assert steps(three) == three.steps(12) == 9
    budget = TrainSettings(3, 5, 0.1, 0.0, 0.0, max_steps=4)
    assert steps(budget) == budget.steps(12) == 4


def validated_mlp():
    from driftfl.common.models import model_settings
    return model_settings({"name": "mlp"})


def test_stragglers_send_their_budgeted_steps_and_no_more(server_task):
    late = HeterogeneitySettings(name="stragglers", share=0.5, step_budget=0.5)
    s = strategy(late)
    asked = sent(s)
    budgets = {n: a[ASSIGNED_MAX_STEPS] for n, a in asked.items()}
    assert sorted(budgets.values()) == [0, 0, 1, 1]  # floor(0.5 x 3 steps) for two of four
    replies = [reply(n, [1.0, 1.0], n=12, steps=budgets[n] or 3) for n in NODES]
    s.aggregate_train(1, replies)
    assert s.report.clients == 4
    straggler = next(n for n in NODES if budgets[n])
    s.aggregate_train(1, [reply(straggler, [1.0, 1.0], n=12, steps=3)])
    assert "stopped after 1 steps" in s.report.rejected[0]


def test_fednova_weights_follow_the_drawn_steps(server_task):
    nova = FedNovaAggregation(momentum=0.0, param_keys=frozenset({"w"}))
    s = strategy(EPOCHS, nova)
    asked = sent(s)
    first, second = NODES[0], next(n for n in NODES
                                   if asked[n][ASSIGNED_EPOCHS] != asked[NODES[0]][ASSIGNED_EPOCHS])
    tau = np.array([asked[first][ASSIGNED_EPOCHS] * 3, asked[second][ASSIGNED_EPOCHS] * 3], float)
    w = np.array([[3.0, 1.0], [1.0, -5.0]])
    arrays, _ = s.aggregate_train(1, [reply(first, w[0], n=12, steps=tau[0]),
                                      reply(second, w[1], n=12, steps=tau[1])])
    assert s.report.clients == 2
    # equal examples: gamma = 1/2 each; d_k = (w_G - w_k) / tau_k; w_G - tau_eff sum gamma d_k
    gamma, d = np.array([0.5, 0.5]), (np.array([1.0, 1.0]) - w) / tau[:, None]
    expected = np.array([1.0, 1.0]) - (gamma @ tau) * (gamma @ d)
    assert np.allclose(arrays["w"].numpy(), expected)
    assert not np.allclose(expected, w.mean(0))  # FedAvg's mean would differ here


def test_dropout_aggregates_the_remaining_replies_as_if_only_they_were_asked(server_task):
    s = strategy(HeterogeneitySettings(name="dropout", share=0.5))
    asked_nodes = sorted(sent_nodes(s))
    assert len(asked_nodes) == 2 and set(asked_nodes) < set(NODES)
    dropped = sorted(set(NODES) - set(asked_nodes))
    ws = {n: [1 + n / 100, 1 - n / 100] for n in asked_nodes}
    arrays, _ = s.aggregate_train(1, [reply(n, ws[n], n=12, steps=3) for n in asked_nodes])
    assert np.allclose(arrays["w"].numpy(), np.mean([ws[n] for n in asked_nodes], 0))
    assert s.report.dropped == [str(NODES.index(n)) for n in dropped]
    assert not s.report.lost and not s.report.late  # dropped is not lost: nothing was sent
    plain = strategy(HeterogeneitySettings())
    plain.global_arrays = s.global_arrays
    reference, _ = plain.aggregate_train(1, [reply(n, ws[n], n=12, steps=3) for n in asked_nodes])
    assert np.array_equal(arrays["w"].numpy(), reference["w"].numpy())


def sent_nodes(s):
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    return [m.metadata.dst_node_id
            for m in s.configure_train(1, arrays, ConfigRecord({}), FakeGrid(NODES))]


def test_without_heterogeneity_the_messages_carry_no_assignment(server_task):
    s = strategy(HeterogeneitySettings())
    arrays = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})
    messages = list(s.configure_train(1, arrays, ConfigRecord({}), FakeGrid(NODES)))
    assert len(messages) == 4 and all(ASSIGNMENT not in m.content.config_records
                                      for m in messages)


@pytest.mark.parametrize("override, message", [
    (["heterogeneity=epochs", "heterogeneity.min_epochs=4", "heterogeneity.max_epochs=2"],
     "heterogeneity.min_epochs=4 exceeds heterogeneity.max_epochs=2"),
    (["heterogeneity=dropout", "heterogeneity.share=1"], "heterogeneity.share must be in"),
    (["heterogeneity=dropout", "heterogeneity.step_budget=0.3"],
     "heterogeneity.step_budget is not a setting of heterogeneity=dropout; heterogeneity "
     "options that have it: stragglers"),
    (["heterogeneity=stragglers", "strategy=dcfl"], "heterogeneity=stragglers with strategy=dcfl"),
    (["heterogeneity=fast"], "unknown heterogeneity 'fast'; valid: dropout, epochs, none, "
     "stragglers"),
])
def test_bad_heterogeneity_is_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        check_experiment(compose(override))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_config_group_composes_with_its_defaults():
    assert compose([]).heterogeneity.name == "none"
    cfg = compose(["heterogeneity=epochs"])
    assert (cfg.heterogeneity.min_epochs, cfg.heterogeneity.max_epochs) == (1, 5)
    assert compose(["heterogeneity=stragglers"]).heterogeneity.stragglers == "partial"
    assert compose(["heterogeneity=dropout"]).heterogeneity.share == 0.2
    assert LOCAL_STEPS == "local-steps"


# --- the real ClientApp, as a SuperNode runs it --------------------------------------------

def client_train(node_cfg: dict, assignment: dict, overrides=()):
    """One train message through the real ClientApp, with the server's assignment record."""
    from flwr.app import Context, Message, RecordDict

    from driftfl.client.app import app
    from driftfl.common.protocol import (ARRAYS, CONFIG, DATASET_META, EXPERIMENT, METHOD,
                                         SERVER_ROUND, model_to_arrays)
    from test_node_boundary import FMNIST_META, TINY

    cfg = compose([*TINY, "batch_size=64", *overrides])
    model = build_model(cfg.model, FMNIST_META.shape, len(FMNIST_META.classes))
    content = RecordDict({ARRAYS: model_to_arrays(model),
                          CONFIG: ConfigRecord({EXPERIMENT: cfg.to_json(),
                                                DATASET_META: FMNIST_META.to_json(),
                                                SERVER_ROUND: 1, METHOD: "ce"}),
                          ASSIGNMENT: ConfigRecord(assignment)})
    message = Message(content, dst_node_id=7, message_type="train")
    context = Context(run_id=1, node_id=7, node_config=node_cfg, state=RecordDict(),
                      run_config={})
    return app(message, context)


NODE = {"dataset": "fmnist", "partition-id": 0, "num-partitions": 2}


def test_a_real_client_takes_exactly_its_assigned_epochs_or_budget(fmnist_available,
                                                                    server_task):
    from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE
    from driftfl.common.protocol import METRICS, NUM_EXAMPLES

    metrics = client_train(NODE, {ASSIGNED_EPOCHS: 3, ASSIGNED_MAX_STEPS: 0}).content[METRICS]
    n = metrics[NUM_EXAMPLES]
    assert metrics[LOCAL_STEPS] == 3 * -(-n // 64)  # E x ceil(n / B)
    assert ACC_BEFORE not in metrics  # not asked for
    budget = client_train(NODE, {ASSIGNED_EPOCHS: 3, ASSIGNED_MAX_STEPS: 5,
                                 "client-eval": 1}, ["client_test_fraction=0.25"])
    metrics = budget.content[METRICS]
    assert metrics[LOCAL_STEPS] == 5 and metrics[NUM_EXAMPLES] == n - round(0.25 * n)
    assert 0 <= metrics[ACC_BEFORE] <= 1 and 0 <= metrics[ACC_AFTER] <= 1


def test_assigned_epochs_over_the_operators_cap_are_refused(server_task):
    with pytest.raises(Exception, match="the assigned local epochs 4 exceeds this node's "
                                        "max-local-epochs=3"):
        client_train({**NODE, "max-local-epochs": 3}, {ASSIGNED_EPOCHS: 4})
