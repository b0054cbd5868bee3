"""Robust aggregation (median, trimmed mean, Krum): hand-checked cases, refusals when a round has
too few replies, composition with other methods' objectives, and a real poisoning attack that
ruins FedAvg but not the robust rules."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from conftest import REPO
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict

from driftfl.common.config import compose
from driftfl.common.datasets import load_dataset, to_tensors
from driftfl.common.errors import ConfigError
from driftfl.common.evaluation import evaluate
from driftfl.common.models import build_model
from driftfl.common.protocol import ARRAYS, LOCAL_STEPS, METRICS, NUM_EXAMPLES
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies import AGGREGATIONS, FedAvg
from driftfl.strategies.parts.aggregation import Aggregation, check_reply, norm_bound
from driftfl.strategies.parts.robust import (KrumAggregation, MedianAggregation, RobustAggregation,
                                             TrimmedMeanAggregation)

GLOBAL = {"w": np.array([1.0, 1.0], np.float32), "count": np.array(5, np.int64)}


def reply(node, arrays, n):
    """A train reply as the SuperLink delivers it."""
    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type="train")
    record = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
    return Message(metadata=meta, content=RecordDict(
        {ARRAYS: record, METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: 1})}))


def updates(models, reference=GLOBAL, ns=None):
    """Checked replies, node i sending ``models[i]`` ({"w": ..., "count": ...} or w alone)."""
    out = []
    for i, model in enumerate(models):
        arrays = model if isinstance(model, dict) else {
            "w": np.asarray(model, np.float32), "count": np.array(10 + i, np.int64)}
        # the server's own check, with its default bound on the update's norm
        update = check_reply(reply(i + 1, arrays, ns[i] if ns else 10), reference,
                             max_update=norm_bound(reference, 10.0))
        assert not isinstance(update, str), update
        out.append(update)
    return out


# --- each rule on a hand-checked case -------------------------------------------------------

def test_median_is_coordinatewise_and_takes_counters_from_the_first_reply():
    out = MedianAggregation().aggregate(updates([[1, 5, -2], [3, 0, 7], [2, 9, 1]], ns=[1, 1, 99],
                                                reference={"w": np.zeros(3, np.float32),
                                                           "count": GLOBAL["count"]}),
                                        GLOBAL)
    assert out["w"].tolist() == [2, 5, 1]  # not weighted: node 3's 99 examples buy nothing
    assert out["w"].dtype == np.float32
    assert out["count"] == 10 and out["count"].dtype == np.int64 and out["count"].shape == ()


def test_trimmed_mean_with_beta_cutting_one_at_each_end():
    # 5 replies, beta 0.2: int(0.2 * 5) = 1 cut at each end of every coordinate
    models = [[1, 0], [2, -5], [10, 1], [3, 2], [4, 3]]
    out = TrimmedMeanAggregation(beta=0.2).aggregate(updates(models, ns=[1, 1, 1, 1, 500]), GLOBAL)
    assert np.allclose(out["w"], [(2 + 3 + 4) / 3, (0 + 1 + 2) / 3])
    assert out["count"] == 10
    # beta 0 cuts nothing: the plain, unweighted mean
    out = TrimmedMeanAggregation(beta=0.0).aggregate(updates(models, ns=[1, 1, 1, 1, 500]), GLOBAL)
    assert np.allclose(out["w"], np.mean(models, axis=0))


def test_krum_picks_the_central_update_and_multikrum_averages_the_best():
    # offsets from the global model [1, 1]: scores with f = 1 (sum of the n - f - 2 = 2 smallest
    # squared distances): a 1 + 1.44 = 2.44, b 1 + 3.25 = 4.25, c 1.44 + 3.69 = 5.13,
    # d 2.25 + 3.25 = 5.5, e (far away) 106.25 + 113 = 219.25
    offsets = {"e": [8, 8], "b": [1, 0], "a": [0, 0], "c": [-1.2, 0], "d": [0, 1.5]}
    models = [np.add(GLOBAL["w"], o) for o in offsets.values()]
    ups = updates(models, ns=[10, 30, 10, 10, 10])
    krum = KrumAggregation(num_malicious=1)
    assert krum.selected(ups, GLOBAL) == [2]  # a
    out = krum.aggregate(ups, GLOBAL)
    assert out["w"].tobytes() == ups[2].arrays["w"].tobytes()
    assert out["count"] == 12  # a's own counter
    multi = KrumAggregation(num_malicious=1, num_selected=2)
    assert multi.selected(ups, GLOBAL) == [1, 2]  # b and a, in node order
    out = multi.aggregate(ups, GLOBAL)
    assert np.allclose(out["w"], np.add(GLOBAL["w"], [0.75, 0]))  # by examples: 30 / 40 of b
    assert out["count"] == 11  # the first kept reply's, as weighted_average takes it
    # asking for more than n - f keeps n - f
    assert KrumAggregation(num_malicious=1, num_selected=5).selected(ups, GLOBAL) == [1, 2, 3, 4]


# --- too few replies: refused, never a crash ------------------------------------------------

@pytest.mark.parametrize("rule, n, reason", [
    (KrumAggregation(num_malicious=1), 4, "Krum with num_malicious=1 needs more than 4 replies"),
    (KrumAggregation(), 2, "Krum with num_malicious=0 needs more than 2 replies"),
    (TrimmedMeanAggregation(beta=0.2), 4, r"beta=0.2 cuts int\(0.2 \* 4\) = 0 of 4 replies"),
])
def test_a_round_with_too_few_replies_keeps_the_global_model(rule, n, reason, caplog):
    strategy = FedAvg(aggregation=rule)
    strategy.global_arrays = {k: v.copy() for k, v in GLOBAL.items()}
    replies = [reply(i + 1, {"w": np.float32([i, -i]), "count": np.array(i)}, 10)
               for i in range(n)]
    with caplog.at_level("WARNING", logger="flwr"):
        arrays, _ = strategy.aggregate_train(1, replies)
    if arrays is not None:  # None also keeps the global model
        assert np.array_equal(arrays["w"].numpy(), GLOBAL["w"])
        assert arrays["count"].numpy() == 5
    assert re.search(reason, caplog.text) and "global model stays" in caplog.text


def test_median_takes_any_number_of_replies():
    ups = updates([[3, 4], [1, 2]])
    assert MedianAggregation().aggregate(ups[:1], GLOBAL)["w"].tolist() == [3, 4]
    assert MedianAggregation().aggregate(ups, GLOBAL)["w"].tolist() == [2, 3]


@pytest.mark.parametrize("overrides, message", [
    (["aggregation=krum", "aggregation.num_malicious=4"],
     "aggregation=krum cannot work with the 10 clients per round that num_clients \\* fraction "
     "gives: Krum with num_malicious=4 needs more than 10 replies"),
    (["aggregation=krum", "aggregation.num_malicious=2", "aggregation.num_selected=9"],
     "num_selected=9 is more than the n - num_malicious = 8 replies"),
    (["aggregation=trimmed_mean", "num_clients=8", "fraction=0.5"],
     r"the 4 clients per round .* cuts int\(0.2 \* 4\) = 0 of 4 replies .* needs at least 5"),
])
def test_a_plan_with_too_few_clients_per_round_is_refused_before_anything_runs(overrides,
                                                                                message):
    with pytest.raises(ConfigError, match=message):  # what `driftfl run` checks first
        check_experiment(compose(overrides))


# --- config: composes with any method, bad settings in one line -----------------------------

@pytest.mark.parametrize("method", ["fedcsd", "fedprox", "fedavgm", "dcfl"])
@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum"])
def test_robust_rules_compose_with_any_methods_objective(method, rule):
    cfg = check_experiment(compose([f"strategy={method}", f"aggregation={rule}"]))
    strategy = build_strategy(cfg, build_model(cfg.model, (1, 28, 28), 10))
    assert type(strategy.aggregation) is AGGREGATIONS[rule]
    assert strategy.objective == cfg.strategy.objective


@pytest.mark.parametrize("override, message", [
    ("aggregation.beta=0.6", r"aggregation.beta must be in \[0, 0.5\), got 0.6"),
    ("aggregation.beta=-0.1", r"aggregation.beta must be in \[0, 0.5\), got -0.1"),
    ("+aggregation.bta=0.1", "unknown setting aggregation.bta; did you mean aggregation.beta?"),
])
def test_bad_trimmed_mean_settings_give_one_line(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_experiment(compose(["aggregation=trimmed_mean", override]))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("override, message", [
    ("aggregation.num_selected=0", r"aggregation.num_selected must be in \[1, 1000000\], got 0"),
    ("aggregation.num_malicious=-1", r"aggregation.num_malicious must be in \[0, 1000000\], got -1"),
    ("aggregation.num_malicious=1.5", "aggregation.num_malicious must be a whole number"),
])
def test_bad_krum_settings_give_one_line(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_experiment(compose(["aggregation=krum", override]))
    assert "\n" not in str(err.value)


def test_algorithms_md_lists_every_robust_rules_settings_with_their_defaults():
    text = (REPO / "docs" / "algorithms.md").read_text()
    for name, rule in AGGREGATIONS.items():
        if not issubclass(rule, RobustAggregation):
            continue
        section = next((s for s in re.split(r"\n### ", text)
                        if f"`aggregation={name}`" in s.splitlines()[0]), None)
        assert section, f"docs/algorithms.md has no section for aggregation={name}"
        assert "Flower" in section
        rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", section, re.M))
        defaults = {k: str(f.get_default()) for k, f in rule.Settings.model_fields.items()}
        assert rows == defaults, name


# --- the attack: large finite weights inside the server's update-norm bound -----------------

def state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def norm(arrays: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in arrays.values())))


@pytest.fixture(scope="module")
def poisoned_round(fmnist_available):
    """A small MLP trained a little on 300 Fashion-MNIST images (the global model), 4 honest
    clients' models after one local epoch on 100 images each, and an attacker's."""
    torch.manual_seed(0)
    data = load_dataset({"name": "fmnist", "subset": 700, "test_subset": 2000})
    x, y = to_tensors(data.train_x, data.train_y, data.mean, data.std)
    test = to_tensors(data.test_x, data.test_y, data.mean, data.std)
    model = build_model({"name": "mlp"}, data.shape, data.num_classes)

    def train(net, lo, hi, epochs):
        settings = TrainSettings(epochs=epochs, batch_size=32, lr=0.05, momentum=0.9,
                                 weight_decay=0.0)
        train_locally(net, x[lo:hi], y[lo:hi], settings, CrossEntropy(),
                      torch.Generator().manual_seed(lo))

    train(model, 0, 300, epochs=3)
    global_arrays = state(model)
    honest = []
    for k in range(4):
        local = copy.deepcopy(model)
        train(local, 300 + 100 * k, 400 + 100 * k, epochs=1)
        honest.append(state(local))
    # the attacker pushes class 0's logit up: a unit direction on the head's row 0 and bias 0,
    # 3 * max(1, ||w_G||) long, well inside the bound the server's reply check enforces
    direction = {k: np.zeros_like(v) for k, v in global_arrays.items()}
    direction["head.weight"][0] = 1.0
    direction["head.bias"][0] = 1.0
    scale = 3 * max(1.0, norm(global_arrays)) / norm(direction)
    attack = {k: v + scale * direction[k] for k, v in global_arrays.items()}
    delta = norm({k: attack[k] - global_arrays[k] for k in attack})
    assert np.isfinite(delta) and delta <= 10 * max(1.0, norm(global_arrays))

    def accuracy(arrays):
        net = copy.deepcopy(model)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
        return evaluate(net, *test, batch_size=1000, num_classes=data.num_classes)[1]

    ups = updates([*honest, attack], reference=global_arrays)  # every reply passes the checks
    return ups, global_arrays, accuracy


def test_a_finite_in_bound_attack_ruins_fedavg_but_not_median_or_trimmed_mean(poisoned_round):
    ups, global_arrays, accuracy = poisoned_round
    honest = accuracy(Aggregation().aggregate(ups[:4], global_arrays))
    acc = {"honest mean": honest, "global": accuracy(global_arrays)}
    for name, rule in [("fedavg", Aggregation()), ("median", MedianAggregation()),
                       ("trimmed_mean", TrimmedMeanAggregation(beta=0.2)),
                       ("krum", KrumAggregation(num_malicious=1))]:
        acc[name] = accuracy(rule.aggregate(ups, global_arrays))
    print("test accuracy: " + ", ".join(f"{k} {v:.1%}" for k, v in acc.items()))
    assert honest > 0.6
    assert acc["fedavg"] < 0.3  # class 0 everywhere
    assert acc["median"] > honest - 0.05
    assert acc["trimmed_mean"] > honest - 0.05
    assert acc["krum"] > honest - 0.1  # one honest client's model
    assert 5 not in [ups[i].node_id for i in KrumAggregation(num_malicious=1).selected(
        ups, global_arrays)]


def test_fedavg_refuses_the_push_by_its_size_but_one_just_under_the_bound_needs_a_robust_rule(
        poisoned_round):
    """The strategy's peer screen (max_peer_ratio x the round's lower median update) refuses
    the 3 x ||w_G|| push, 64 times the median update; the same push shortened to just under
    that bound is what an attacker inside every check can still do to FedAvg's mean."""
    ups, global_arrays, accuracy = poisoned_round
    honest, attack = ups[:4], ups[4]
    sizes = [norm({k: u.arrays[k] - global_arrays[k] for k in global_arrays}) for u in ups]
    median = sorted(sizes[:4] + sizes[4:])[2]  # the lower median of the five
    ratio = FedAvg().max_peer_ratio  # the default, 30
    assert sizes[4] > ratio * median  # the push is far outside its peers

    def fedavg(replies):
        strategy = FedAvg()
        strategy.global_arrays, strategy.trained = global_arrays, [u.node_id for u in replies]
        arrays, _ = strategy.aggregate_train(1, [u.message for u in replies])
        return strategy, {k: v.numpy() for k, v in arrays.items()}

    strategy, model = fedavg(ups)
    assert strategy.report.rejected_partitions == ["node5"]
    assert "max_peer_ratio" in strategy.report.rejected[0]
    honest_mean = Aggregation().aggregate(honest, global_arrays)
    assert all(np.array_equal(model[k], honest_mean[k]) for k in model)

    shrink = 0.99 * ratio * median / sizes[4]  # the push, 0.99 x the peer bound long
    shortened = {k: global_arrays[k] + shrink * (attack.arrays[k] - global_arrays[k])
                 for k in global_arrays}
    strategy, model = fedavg([*honest, *updates([shortened], reference=global_arrays)])
    # node 1 of updates() again: the shortened push, accepted, one reply of five
    assert strategy.report.clients == 5 and not strategy.report.rejected
    median = MedianAggregation().aggregate([*honest, *updates([shortened],
                                                              reference=global_arrays)],
                                           global_arrays)
    acc = {"honest": accuracy(honest_mean), "fedavg, push under the bound": accuracy(model),
           "median, push under the bound": accuracy(median)}
    print("test accuracy: " + ", ".join(f"{k} {v:.1%}" for k, v in acc.items()))
    # the screen bounds a reply's size, not its direction: under the bound the push still takes
    # FedAvg's mean (class 0 everywhere is 10 %); a robust rule is the answer, and the median
    # does not follow it
    assert acc["fedavg, push under the bound"] < acc["honest"] - 0.3
    assert acc["median, push under the bound"] > acc["honest"] - 0.05
