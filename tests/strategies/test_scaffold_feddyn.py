"""SCAFFOLD and FedDyn pinned on hand-worked cases: the clients' corrections and state updates,
the servers' state (c, h) and the checks on SCAFFOLD's control-delta."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, MetricRecord,
                      RecordDict)
from torch import nn

from driftfl.client.objectives import build_objective
from driftfl.client.objectives.dyn import STATE as DYN_STATE
from driftfl.client.objectives.dyn import dyn_term, next_grad_prev
from driftfl.client.objectives.scaffold import STATE as SCAFFOLD_STATE
from driftfl.client.objectives.scaffold import control_delta, step_scale
from driftfl.client.state import keep, recall
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.models import build_model
from driftfl.common.protocol import (ARRAYS, CONTROL, CONTROL_DELTA, LOCAL_STEPS, METRICS,
                                     NUM_EXAMPLES)
from driftfl.common.training import TrainSettings, train_locally
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies.methods.feddyn import FedDyn, corrected_model, next_h
from driftfl.strategies.parts.aggregation import ClientUpdate
from driftfl.strategies.methods.scaffold import CONTROL_TOLERANCE, update_control


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return build_model({"name": "mlp", "hidden": [5]}, (1, 2, 2), 3)


def tiny_data(n=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 2, 2, generator=g), torch.randint(0, 3, (n,), generator=g)


def params_of(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def fake_job(lr=0.1, momentum=0.0, control=None, context=None):
    """What an objective reads from a ClientJob: the experiment's SGD, the message's records
    and the node's context (its state)."""
    content = {} if control is None else {
        CONTROL: ArrayRecord({k: Array(np.asarray(v, np.float32)) for k, v in control.items()})}
    context = context or Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                                 run_config={})
    return SimpleNamespace(experiment=SimpleNamespace(lr=lr, momentum=momentum),
                           message=SimpleNamespace(content=content), context=context)


def train(model, objective, momentum=0.9, weight_decay=1e-3, epochs=2):
    x, y = tiny_data()
    return train_locally(model, x, y, TrainSettings(epochs, 8, 0.1, momentum, weight_decay),
                         objective, torch.Generator().manual_seed(3))


def metadata(node):
    return Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type="train")


def reply(node, arrays, n=10, steps=4, records=None):
    content = {ARRAYS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
               METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: steps})}
    for name, record in (records or {}).items():
        content[name] = ArrayRecord({k: Array(v) for k, v in record.items()})
    return Message(metadata=metadata(node), content=RecordDict(content))


class Grid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


class TwoWeights(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))


# --- SCAFFOLD: the client -------------------------------------------------------------------

def test_scaffold_with_zero_control_variates_trains_exactly_like_cross_entropy():
    plain, scaffold, no_job = tiny_model(), tiny_model(), tiny_model()
    train(plain, build_objective("ce", {}))
    job = fake_job(control={n: np.zeros(p.shape) for n, p in scaffold.named_parameters()})
    objective = build_objective("scaffold", {}, job)
    stats = train(scaffold, objective)
    train(no_job, build_objective("scaffold", {}))
    for name, value in params_of(plain).items():  # bit for bit
        assert torch.equal(params_of(scaffold)[name], value)
        assert torch.equal(params_of(no_job)[name], value)
    assert objective.diagnostics() == {"control-norm": 0.0}  # a node's first round
    objective.after_training(scaffold, stats)
    assert CONTROL_DELTA in objective.reply_records()


def test_scaffold_corrects_each_gradient_by_c_minus_c_k():
    """L = w0^2 + 3 w1 at w = (1, 2): grad (2, 3); c = (0.5, -1), c_k = (0.25, 1), so the step
    follows (2 + 0.25, 3 - 2) = (2.25, 1); SGD lr 0.1 without momentum: w' = (0.775, 1.9)."""
    model = TwoWeights([1.0, 2.0])
    job = fake_job(control={"w": [0.5, -1.0]})
    keep(job.context, SCAFFOLD_STATE, {"w": torch.tensor([0.25, 1.0])})
    objective = build_objective("scaffold", {}, job)
    objective.prepare(model, torch.zeros(1), None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    (model.w[0] ** 2 + 3 * model.w[1]).backward()
    objective.before_step(model)
    assert model.w.grad.tolist() == [2.25, 1.0]
    optimizer.step()
    assert model.w.detach().tolist() == pytest.approx([0.775, 1.9])
    assert objective.diagnostics()["control-norm"] == pytest.approx(math.hypot(0.25, 1.0))


def test_scaffold_step_scale_is_the_effective_step_count_times_lr():
    assert step_scale(3, 0.1, 0.0) == pytest.approx(0.3)  # a_k = tau_k without momentum
    # rho = 0.5, two steps: the first gradient moves the weights in both steps (1 + 0.5), the
    # second in one: a = 2.5
    assert step_scale(2, 0.1, 0.5) == pytest.approx(0.25)
    assert step_scale(2, 0.1, 0.5, "steps") == pytest.approx(0.2)  # the paper's tau_k lr


def test_scaffold_control_delta_on_a_hand_worked_case():
    """c = (1, -1), w_G = 0, w_k = (-0.5, 0.25), a_k lr = 0.25: (w_G - w_k)/(a_k lr) = (2, -1),
    Delta c_k = (2 - 1, -1 + 1) = (1, 0); with c_k = (3, 3): c_k+ = (4, 3)
    = c_k - c + (w_G - w_k)/(a_k lr)."""
    delta = control_delta({"w": torch.tensor([1.0, -1.0])}, {"w": torch.zeros(2)},
                          {"w": torch.tensor([-0.5, 0.25])}, 0.25)
    assert delta["w"].tolist() == [1.0, 0.0]
    assert (torch.tensor([3.0, 3.0]) + delta["w"]).tolist() == [4.0, 3.0]


@pytest.mark.parametrize("momentum, divisor", [(0.0, "effective"), (0.9, "effective"),
                                               (0.9, "steps")])
def test_scaffold_keeps_c_k_plus_and_replies_its_change(momentum, divisor):
    model = tiny_model()
    w_global = params_of(model)
    rng = np.random.default_rng(0)
    c = {n: rng.normal(size=p.shape).astype(np.float32) for n, p in w_global.items()}
    c_k = {n: torch.from_numpy(rng.normal(size=p.shape).astype(np.float32))
           for n, p in w_global.items()}
    job = fake_job(lr=0.1, momentum=momentum, control=c)
    keep(job.context, SCAFFOLD_STATE, c_k)
    objective = build_objective("scaffold", {"divisor": divisor}, job)
    stats = train(model, objective, momentum=momentum)
    objective.after_training(model, stats)

    steps = stats.steps  # 2 epochs of 3 batches
    assert steps == 6
    a = (steps - 0.9 * (1 - 0.9 ** steps) / 0.1) / 0.1 if momentum and divisor == "effective" \
        else steps
    kept, sent = recall(job.context, SCAFFOLD_STATE), objective.reply_records()[CONTROL_DELTA]
    for n, w_k in params_of(model).items():
        expected = (c_k[n].double() - torch.from_numpy(c[n]).double()
                    + (w_global[n].double() - w_k.double()) / (a * 0.1))
        assert torch.allclose(kept[n].double(), expected, rtol=1e-5, atol=1e-5)
        assert np.allclose(sent[n].numpy(), (expected - c_k[n].double()).numpy(), atol=1e-5)
    assert objective.diagnostics()["control-norm"] == pytest.approx(
        math.sqrt(sum(float((v.double() ** 2).sum()) for v in c_k.values())), rel=1e-6)

    # the next round starts from the kept c_k+
    again = build_objective("scaffold", {"divisor": divisor}, job)
    again.prepare(tiny_model(), torch.zeros(1), None)
    assert all(torch.equal(again.local[n], kept[n]) for n in kept)


# --- SCAFFOLD: the server -------------------------------------------------------------------

def scaffold_strategy(*overrides, clients=4):
    """Clients train 1 epoch in batches of 3: 10 examples make 4 steps, 30 make 10."""
    cfg = check_experiment(compose(["strategy=scaffold", f"num_clients={clients}", "lr=0.1",
                                    "momentum=0.5", "local_epochs=1", "batch_size=3",
                                    *overrides]))
    model = tiny_model()
    strategy = build_strategy(cfg, model)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return strategy, weights


def start_round(strategy, weights, server_round=1, nodes=(1, 2, 3, 4)):
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    return list(strategy.configure_train(server_round, arrays, ConfigRecord(), Grid(nodes)))


def honest(strategy, weights, node, shift, steps=4, n=10):
    """A reply whose model moved by ``shift`` and whose Delta c_k follows from it (float32)."""
    model = {k: (v + shift).astype(v.dtype) for k, v in weights.items()}
    scale = step_scale(steps, strategy.lr, strategy.momentum, strategy.divisor)
    delta = {k: ((weights[k] - model[k]) / np.float32(scale) - strategy.sent[k]).astype(np.float32)
             for k in strategy.param_keys}
    return reply(node, model, n=n, steps=steps, records={CONTROL_DELTA: delta}), delta


def test_scaffold_sends_c_and_adds_the_sum_of_the_changes_over_k(server_task):
    strategy, weights = scaffold_strategy()
    messages = start_round(strategy, weights)
    for message in messages:  # round 1: c = 0, every trainable parameter
        control = message.content[CONTROL]
        assert set(control.keys()) == set(strategy.param_keys)
        assert not any(control[k].numpy().any() for k in control.keys())
    r1, d1 = honest(strategy, weights, 1, 0.01)
    r2, d2 = honest(strategy, weights, 2, -0.02, steps=10, n=30)
    arrays, _ = strategy.aggregate_train(1, [r1, r2])
    assert strategy.report.rejected == [] and arrays is not None
    for k in strategy.param_keys:  # c + (|S|/K) mean = c + (1/K) sum, K = 4
        assert np.allclose(strategy.control[k], (d1[k].astype(np.float64) + d2[k]) / 4)
    for k, v in weights.items():  # FedAvg's example-weighted mean, as configured
        assert np.allclose(arrays[k].numpy(), v + 0.25 * 0.01 - 0.75 * 0.02, atol=1e-6)

    # round 2 sends the new c, and a reply's Delta c_k is checked against it
    new = {k: arrays[k].numpy() for k in weights}
    messages = start_round(strategy, new, 2)
    sent = messages[0].content[CONTROL]
    assert all(np.allclose(sent[k].numpy(), strategy.control[k]) for k in strategy.param_keys)
    before = {k: v.copy() for k, v in strategy.control.items()}
    r3, d3 = honest(strategy, new, 3, 0.005)
    strategy.aggregate_train(2, [r3])
    assert strategy.report.rejected == []
    for k in strategy.param_keys:
        assert np.allclose(strategy.control[k], before[k] + d3[k] / 4)
    assert update_control({"w": np.ones(2)}, [{"w": np.full(2, 4.0)}], 8)["w"].tolist() == [1.5] * 2


def test_scaffold_refuses_forged_or_inconsistent_control_deltas_and_leaves_c_unchanged(server_task):
    strategy, weights = scaffold_strategy()
    start_round(strategy, weights)
    good, delta = honest(strategy, weights, 1, 0.01)
    key = strategy.param_keys[0]

    def forged(node, change=None, drop=False, steps=4):
        message, d = honest(strategy, weights, node, 0.01, steps=steps)
        d = dict(d)
        if change:
            d[key] = change(d[key])
        record = ArrayRecord({k: Array(v) for k, v in d.items()})
        if drop:
            del message.content[CONTROL_DELTA]
        else:
            message.content[CONTROL_DELTA] = record
        return message

    def with_steps(node, steps):  # Delta c_k for 4 steps, a reply that says otherwise
        message = forged(node)
        message.content[METRICS][LOCAL_STEPS] = steps
        return message

    nan = lambda v: np.where(np.arange(v.size).reshape(v.shape) == 0, np.nan, v).astype(v.dtype)
    bad = {
        2: (forged(2, drop=True), "lacks the 'control-delta' record"),
        3: (forged(3, change=lambda v: v[:1]), "is float32[1"),
        4: (forged(4, change=lambda v: v.astype(np.float64)), "float64"),
        5: (forged(5, change=nan), "NaN or infinite"),
        6: (forged(6, change=lambda v: v * 1.01), "differs from -c + (w_G - w_k)/(a_k lr)"),
        7: (with_steps(7, 5), "'local-steps' is 5, but 1 epoch of its 10 examples in batches "
                              "of 3 make 4"),
    }
    extra = forged(8)
    extra.content[CONTROL_DELTA]["extra"] = Array(np.zeros(1, np.float32))
    bad[8] = (extra, "keys differ")
    arrays, _ = strategy.aggregate_train(1, [good] + [m for m, _ in bad.values()])
    assert strategy.report.clients == 1
    for (node, (_, reason)), rejected in zip(sorted(bad.items()), strategy.report.rejected):
        assert f"node {node}" in rejected and reason in rejected, rejected
    for k in strategy.param_keys:  # only the good reply counts, in c and in the model
        assert np.allclose(strategy.control[k], delta[k] / 4)
    for k, v in weights.items():
        assert np.allclose(arrays[k].numpy(), v + 0.01)

    before = {k: v.copy() for k, v in strategy.control.items()}
    start_round(strategy, {k: arrays[k].numpy() for k in weights}, 2)
    arrays, _ = strategy.aggregate_train(2, [forged(6, change=lambda v: v + 1e-3)])
    assert arrays is None and len(strategy.report.rejected) == 1
    assert all(np.array_equal(strategy.control[k], before[k]) for k in before)


def test_scaffold_tolerance_admits_float32_client_arithmetic(server_task):
    """The client's own control_delta in float32, on weights and c of very different sizes,
    passes the server's float64 recomputation with room to spare."""
    strategy, weights = scaffold_strategy()
    rng = np.random.default_rng(1)
    strategy.control = {k: rng.normal(scale=50.0, size=weights[k].shape)
                        for k in strategy.param_keys}
    start_round(strategy, weights)
    model = {k: (v + rng.normal(scale=1e-3, size=v.shape)).astype(np.float32)
             for k, v in weights.items()}
    scale = step_scale(4, strategy.lr, strategy.momentum)
    t = lambda a: {k: torch.from_numpy(np.asarray(a[k])) for k in strategy.param_keys}
    delta = control_delta(t(strategy.sent), t(weights), t(model), scale)
    message = reply(1, model, steps=4, records={CONTROL_DELTA: {k: v.numpy()
                                                                 for k, v in delta.items()}})
    update = ClientUpdate(1, model, {NUM_EXAMPLES: 10.0, LOCAL_STEPS: 4.0}, message)
    assert strategy.reject(update) is None
    assert 1e-7 < CONTROL_TOLERANCE <= 1e-4


def test_scaffold_needs_its_own_objective():
    # refused by the check `driftfl run` makes up front and the ServerApp makes again
    with pytest.raises(ConfigError, match="^strategy=scaffold needs objective=scaffold "):
        check_experiment(compose(["strategy=scaffold", "strategy.objective=ce"]))


def test_scaffold_trains_two_rounds_with_real_clients(fmnist_available, server_task):
    """Two rounds in process: no real client's control-delta is refused (the tolerance holds
    for float32 training) and round 2 trains with c_k != 0."""
    from test_methods import TINY, surveyed

    from driftfl.common.protocol import model_to_arrays

    _, model, strategy, grid, record = surveyed(["strategy=scaffold", *TINY])
    strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=2,
                   train_config=record, evaluate_config=ConfigRecord(dict(record)))
    assert strategy.report.rejected == [] and strategy.report.clients == 2
    assert strategy.report.train_metrics["control-norm"] > 0


# --- FedDyn: the client ---------------------------------------------------------------------

def test_dyn_term_and_its_gradient_on_a_hand_worked_case():
    """w = (1, 2), w_G = (0, 1), g_k = (0.5, -1), alpha = 0.2:
    -<g_k, w> = -(0.5 - 2) = 1.5; alpha/2 ||w - w_G||^2 = 0.1 * 2 = 0.2; the term is 1.7 and
    its gradient -g_k + alpha (w - w_G) = (-0.5 + 0.2, 1 + 0.2) = (-0.3, 1.2)."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    term = dyn_term({"w": w}, {"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([0.5, -1.0])},
                    0.2)
    assert term.item() == pytest.approx(1.7)
    term.backward()
    assert w.grad.tolist() == pytest.approx([-0.3, 1.2])


def test_dyn_updates_and_keeps_the_previous_gradient():
    """g_k - alpha (w_k - w_G) = (0.5, -1) - 0.2 (1, 1) = (0.3, -1.2)."""
    out = next_grad_prev({"w": torch.tensor([0.5, -1.0])}, {"w": torch.tensor([1.0, 2.0])},
                         {"w": torch.tensor([0.0, 1.0])}, 0.2)
    assert out["w"].tolist() == pytest.approx([0.3, -1.2])

    model = tiny_model()
    w_global = params_of(model)
    job = fake_job()
    objective = build_objective("dyn", {"alpha": 0.3}, job)
    assert objective.weight == 1.0
    stats = train(model, objective)
    objective.after_training(model, stats)
    kept = recall(job.context, DYN_STATE)
    for n, w_k in params_of(model).items():  # from g_k = 0
        assert torch.allclose(kept[n], -0.3 * (w_k - w_global[n]))
    assert objective.diagnostics()["grad-prev-norm"] > 0
    again = build_objective("dyn", {"alpha": 0.3}, job)
    again.prepare(tiny_model(), torch.zeros(1), None)
    assert all(torch.equal(again.grad_prev[n], kept[n]) for n in kept)


def test_dyn_with_alpha_zero_trains_exactly_like_cross_entropy():
    plain, dyn = tiny_model(), tiny_model()
    train(plain, build_objective("ce", {}))
    objective = build_objective("dyn", {"alpha": 0.0}, fake_job())
    train(dyn, objective)
    assert all(torch.equal(params_of(dyn)[n], v) for n, v in params_of(plain).items())


# --- FedDyn: the server ---------------------------------------------------------------------

def dyn_strategy(alpha, clients=4):
    return FedDyn(param_keys=("w",), num_clients=clients, alpha=alpha)


def dyn_round(strategy, weights, replies, server_round=1):
    start_round(strategy, weights, server_round, nodes=(1, 2))
    return strategy.aggregate_train(server_round, replies)


def test_feddyn_server_state_and_corrected_model_on_a_hand_worked_case(server_task):
    """K = 4, alpha = 0.5, w_G = (1, 1); w_1 = (2, 1) on 10 examples, w_2 = (1, 3) on 30:
    m = 0.25 w_1 + 0.75 w_2 = (1.25, 2.5); h = -(0.5/4)((1, 0) + (0, 2)) = (-0.125, -0.25);
    w_G <- m - h/0.5 = (1.5, 3.0). The buffer "b" stays the mean, 0.25*2 + 0.75*6 = 5."""
    strategy = dyn_strategy(0.5)
    weights = {"w": np.array([1.0, 1.0], np.float32), "b": np.array([0.0], np.float32)}
    arrays, _ = dyn_round(strategy, weights, [
        reply(1, {"w": np.array([2.0, 1.0], np.float32), "b": np.array([2.0], np.float32)}, 10),
        reply(2, {"w": np.array([1.0, 3.0], np.float32), "b": np.array([6.0], np.float32)}, 30)])
    assert np.allclose(strategy.h["w"], [-0.125, -0.25]) and set(strategy.h) == {"w"}
    assert np.allclose(arrays["w"].numpy(), [1.5, 3.0]) and arrays["w"].numpy().dtype == np.float32
    assert np.allclose(arrays["b"].numpy(), [5.0])

    # round 2 from (1.5, 3): one reply (2.5, 3) -> h = (-0.125 - 0.125, -0.25), m = (2.5, 3),
    # w_G = (2.5 + 0.5, 3 + 0.5)
    arrays, _ = dyn_round(strategy, {"w": np.array([1.5, 3.0], np.float32),
                                     "b": np.array([5.0], np.float32)},
                          [reply(1, {"w": np.array([2.5, 3.0], np.float32),
                                     "b": np.array([5.0], np.float32)})], 2)
    assert np.allclose(strategy.h["w"], [-0.25, -0.25])
    assert np.allclose(arrays["w"].numpy(), [3.0, 3.5])

    h = next_h({"w": np.zeros(1)}, [{"w": np.array([3.0])}], {"w": np.array([1.0])}, 0.4, 8)
    assert h["w"].tolist() == [-0.1]
    assert corrected_model({"w": np.array([1.0]), "c": np.array(3)}, {"w": np.array([-0.1])},
                           0.4)["w"].tolist() == [1.25]


def test_feddyn_refused_corrected_model_leaves_h_and_the_model_alone(server_task):
    """K = 1: the corrected model is m + (w_1 - w_G) = 2 w_1 - w_G. From w_G = (1, 1) (the
    bound on an update: 10 x max(1, ||w_G||) = 14.1) the reply (10, 1) moves 9, within it; the
    corrected model (19, 1) moves 18, beyond it."""
    strategy = dyn_strategy(0.1, clients=1)
    weights = {"w": np.array([1.0, 1.0], np.float32)}
    arrays, _ = dyn_round(strategy, weights, [reply(1, {"w": np.array([10.0, 1.0], np.float32)})])
    assert strategy.report.rejected == []
    assert arrays is None and strategy.h is None
    assert "the corrected model" in strategy.report.refused_aggregate


def test_feddyn_with_alpha_zero_is_fedavg(server_task):
    replies = lambda: [reply(1, {"w": np.array([2.0, 1.0], np.float32)}, 10),
                       reply(2, {"w": np.array([1.0, 3.0], np.float32)}, 30)]
    weights = {"w": np.array([1.0, 1.0], np.float32)}
    dyn = dyn_strategy(0.0)
    arrays, _ = dyn_round(dyn, weights, replies())
    from driftfl.strategies import FedAvg
    avg = FedAvg()
    start_round(avg, weights, nodes=(1, 2))
    expected, _ = avg.aggregate_train(1, replies())
    assert np.array_equal(arrays["w"].numpy(), expected["w"].numpy()) and dyn.h is None


def test_feddyn_needs_its_own_objective_and_takes_alpha_from_the_section():
    cfg = check_experiment(compose(["strategy=feddyn", "strategy.alpha=0.3", "num_clients=7"]))
    strategy = build_strategy(cfg, tiny_model())
    assert (strategy.alpha, strategy.num_clients) == (0.3, 7)
    assert strategy.param_keys == tuple(n for n, _ in tiny_model().named_parameters())
    with pytest.raises(ConfigError, match="^strategy=feddyn needs objective=dyn "):
        check_experiment(compose(["strategy=feddyn", "strategy.objective=ce"]))
    with pytest.raises(ConfigError, match="strategy.alpha must be >= 0"):
        check_experiment(compose(["strategy=feddyn", "strategy.alpha=-1"]))
