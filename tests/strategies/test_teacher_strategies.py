"""Server-side knowledge: FedCSD's prototype phase and EMA teacher, FedGKD's buffer teacher."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import (Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord,
                      RecordDict)

from driftfl.common.config import compose
from driftfl.common.models import build_model
from driftfl.common.protocol import (ARRAYS, CONFIG, LOCAL_STEPS, METRICS, NUM_EXAMPLES,
                                     PROTOTYPES, PROTOTYPES_IN_REPLY, TEACHER)
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies.methods.fedcsd import check_prototypes, global_prototypes
from driftfl.strategies.methods.teacher import ema, mean_of


def metadata(node, kind="train"):
    return Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type=kind)


def prototype_reply(node, prototypes, counts):
    record = ArrayRecord({"prototypes": Array(np.asarray(prototypes, np.float32)),
                          "counts": Array(np.asarray(counts, np.int64))})
    return Message(metadata=metadata(node, "query.csd_prototypes"),
                   content=RecordDict({PROTOTYPES: record}))


def train_reply(node, arrays, n=10):
    record = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return Message(metadata=metadata(node), content=RecordDict(
        {ARRAYS: record, METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: 1})}))


def test_global_prototypes_average_over_the_clients_holding_each_class():
    a = [[1, 1, 1, 1], [2, 2, 2, 2], [0, 0, 0, 0], [0, 0, 0, 0]]  # holds classes 0, 1
    b = [[0, 0, 0, 0], [4, 4, 4, 4], [6, 6, 6, 6], [0, 0, 0, 0]]  # holds classes 1, 2
    p = global_prototypes([(np.array(a, float), np.array([5, 1, 0, 0])),
                           (np.array(b, float), np.array([0, 9, 3, 0]))], 4)
    assert p[0].tolist() == [1] * 4  # only a holds class 0
    assert p[1].tolist() == [3] * 4  # (2 + 4) / 2: uniform over clients, not by counts
    assert p[2].tolist() == [6] * 4
    assert p[3].tolist() == [0] * 4  # nobody holds class 3: zero row


def test_prototype_replies_are_checked():
    good = prototype_reply(1, np.zeros((3, 3)), [1, 0, 2])
    assert isinstance(check_prototypes(good, 3), tuple)
    assert "for 3 classes" in check_prototypes(prototype_reply(1, np.zeros((2, 2)), [1, 1]), 3)
    nan = np.zeros((3, 3))
    nan[0, 0] = np.nan
    assert "not finite" in check_prototypes(prototype_reply(1, nan, [1, 0, 2]), 3)
    # the probe's attack: prototypes of 3e38 and NaN counts, once forwarded to every client
    assert "within +-10000" in check_prototypes(prototype_reply(1, np.full((3, 3), 3e38),
                                                                [1, 0, 2]), 3)
    nan_counts = ArrayRecord({"prototypes": Array(np.zeros((3, 3), np.float32)),
                              "counts": Array(np.array([1.0, np.nan, 2.0]))})
    msg = Message(metadata=metadata(1, "query.csd_prototypes"),
                  content=RecordDict({PROTOTYPES: nan_counts}))
    assert "counts are not whole" in check_prototypes(msg, 3)
    assert "counts are not whole" in check_prototypes(prototype_reply(1, np.zeros((3, 3)),
                                                                      [1, -1, 2]), 3)
    assert "at most 2" in check_prototypes(good, 3, num_examples=2)  # more than it holds
    error = Message(metadata=metadata(2), error=Error(code=1, reason="boom"))
    assert "boom" in check_prototypes(error, 3)


def test_ema_updates_parameters_and_batchnorm_statistics():
    teacher = {"w": np.array([1.0, 1.0], np.float32), "bn.running_mean": np.array([0.0], np.float32),
               "bn.num_batches_tracked": np.array(3, np.int64)}
    new = {"w": np.array([3.0, -1.0], np.float32), "bn.running_mean": np.array([10.0], np.float32),
           "bn.num_batches_tracked": np.array(8, np.int64)}
    out = ema(teacher, new, 0.9)
    assert np.allclose(out["w"], [0.9 + 0.3, 0.9 - 0.1])
    assert np.allclose(out["bn.running_mean"], [1.0])  # buffers are averaged too
    assert out["bn.num_batches_tracked"] == 8 and out["w"].dtype == np.float32


class Grid:
    """Answers the prototype query with prepared replies; knows the node ids."""

    def __init__(self, nodes, replies):
        self.nodes, self.replies, self.sent = nodes, replies, []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, timeout=None):
        self.sent.extend(messages)
        return self.replies


def csd_strategy(*overrides, clients=3):
    cfg = check_experiment(compose(["strategy=fedcsd", f"num_clients={clients}", *overrides]))
    model = build_model({"name": "mlp", "hidden": [4]}, (1, 2, 2), 3)
    torch.manual_seed(0)
    return build_strategy(cfg, model), {k: v.detach().numpy().copy()
                                        for k, v in model.state_dict().items()}


def test_fedcsd_round_prototypes_first_then_train_only_for_the_nodes_that_answered(server_task):
    strategy, weights = csd_strategy()
    bad = np.zeros((3, 3))
    bad[1, 1] = np.inf
    grid = Grid([1, 2, 3], [prototype_reply(1, np.eye(3), [4, 0, 1]),
                            prototype_reply(2, bad, [1, 1, 1]),
                            Message(metadata=metadata(3), error=Error(code=1, reason="gone"))])
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    messages = list(strategy.configure_train(1, arrays, ConfigRecord({"x": 1}), grid))
    assert {m.metadata.message_type for m in grid.sent} == {"query.csd_prototypes"}
    assert all(TEACHER in m.content.array_records for m in grid.sent)
    assert [m.metadata.dst_node_id for m in messages] == [1]  # 2 and 3 gave no usable reply
    content = messages[0].content
    assert {ARRAYS, TEACHER, PROTOTYPES} <= set(content.array_records)
    p_g = content[PROTOTYPES]["prototypes"].numpy()
    assert np.allclose(p_g, [[1, 0, 0], [0, 0, 0], [0, 0, 1]])  # node 1's; class 1 unheld
    for key, value in weights.items():  # round 1: the teacher is the initial global model
        assert np.array_equal(content[TEACHER][key].numpy(), value)
    assert content[CONFIG]["method"] == "csd"


def test_fedcsd_teacher_is_an_ema_of_the_global_models_or_the_global_without_tma(server_task):
    for overrides, alpha in (([], 0.9), (["strategy.tma=false"], 0.0)):
        strategy, weights = csd_strategy(*overrides, clients=1)
        grid = Grid([1], [prototype_reply(1, np.eye(3), [1, 1, 1])])
        strategy.configure_train(1, ArrayRecord({k: Array(v) for k, v in weights.items()}),
                                 ConfigRecord(), grid)
        new = {k: v + 1.0 if v.dtype.kind == "f" else v for k, v in weights.items()}
        arrays, _ = strategy.aggregate_train(1, [train_reply(1, new)])
        for key, value in weights.items():
            assert np.allclose(strategy.teacher[key], alpha * value + (1 - alpha) * new[key])
        if alpha == 0.0:
            assert all(np.array_equal(strategy.teacher[k], arrays[k].numpy()) for k in weights)


def test_fedgkd_teacher_is_the_mean_of_the_last_m_global_models(server_task):
    cfg = check_experiment(compose(["strategy=fedgkd", "strategy.buffer_size=3", "num_clients=1"]))
    strategy = build_strategy(cfg, None)
    globals_ = [{"w": np.array([float(i)], np.float32)} for i in range(6)]
    grid = Grid([1], [])
    messages = list(strategy.configure_train(1, ArrayRecord({"w": Array(globals_[0]["w"])}),
                                             ConfigRecord(), grid))
    assert TEACHER not in messages[0].content.array_records  # no distillation in round 1
    for i in range(1, 6):
        strategy.aggregate_train(i, [train_reply(1, globals_[i])])
        window = [g["w"][0] for g in globals_[max(0, i - 2): i + 1]]
        assert strategy.teacher["w"][0] == np.mean(window)
    messages = list(strategy.configure_train(6, ArrayRecord({"w": Array(globals_[5]["w"])}),
                                             ConfigRecord(), grid))
    assert messages[0].content[TEACHER]["w"].numpy()[0] == np.mean([3.0, 4.0, 5.0])
    assert mean_of([{"c": np.array(1)}, {"c": np.array(7)}])["c"] == 7  # counters: newest


def test_fedcsd_one_exchange_reuses_the_previous_rounds_prototypes(server_task):
    strategy, weights = csd_strategy("strategy.prototypes=previous", clients=2)
    grid = Grid([1, 2], [])
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert grid.sent == []  # no prototype phase
    assert len(messages) == 2
    assert messages[0].content[CONFIG][PROTOTYPES_IN_REPLY]  # the replies bring P_k
    assert not messages[0].content[PROTOTYPES]["prototypes"].numpy().any()  # round 1: zeros

    replies = []
    for node, protos, counts in ((1, np.eye(3), [3, 0, 1]), (2, 3 * np.eye(3), [1, 1, 0])):
        reply = train_reply(node, weights)
        reply.content[PROTOTYPES] = prototype_reply(node, protos, counts).content[PROTOTYPES]
        replies.append(reply)
    strategy.aggregate_train(1, replies)
    messages = list(strategy.configure_train(2, arrays, ConfigRecord(), grid))
    p_g = messages[0].content[PROTOTYPES]["prototypes"].numpy()
    assert np.allclose(p_g, [[2, 0, 0], [0, 3, 0], [0, 0, 1]])  # from round 1's train replies
    assert grid.sent == []
