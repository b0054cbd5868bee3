"""SecAgg+ with a failing or hostile client: one that raises, sends nothing in time or sends a
malformed reply in any of the four stages is a dropout (driftfl.server.secure_checks), and the
round releases the mean of the others; a masked vector outside the protocol releases nothing;
a protocol-following push is held to the honest scale."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message
from flwr.common import ndarray_to_bytes
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from driftfl.common.protocol import METRICS, TRAIN_LOSS
from driftfl.server.secure import GROWTH, secure_train_round
from driftfl.strategies.parts.aggregation import to_numpy
from test_secagg import RecordingGrid, check_aggregate, plain_updates, setup

HOSTILE = 102  # partition 2


def raises(reply, message):
    return Message(Error(code=0, reason="RuntimeError('hostile client')"), reply_to=message)


def times_out(reply, message):
    return None


def edits(**values):
    """The reply with its SecAgg+ record's ``values`` replaced (a value None: removed)."""
    def edit(reply, message):
        record = reply.content.config_records[RECORD_KEY_CONFIGS]
        kept = {k: v for k, v in record.items() if k not in values}
        reply.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
            {**kept, **{k: v for k, v in values.items() if v is not None}})
        return reply
    return edit


def masked(fill):
    """The masked vector made of ``fill(array)``, one per array, in its shapes."""
    def edit(reply, message):
        record = reply.content.config_records[RECORD_KEY_CONFIGS]
        from flwr.common import bytes_to_ndarray
        record[Key.MASKED_PARAMETERS] = [ndarray_to_bytes(fill(bytes_to_ndarray(b)))
                                         for b in record[Key.MASKED_PARAMETERS]]
        return reply
    return edit


def copies_keys(reply, message):
    return reply  # HostileGrid gives it node 100's keys


def nan_loss(reply, message):
    reply.content[METRICS][TRAIN_LOSS] = float("nan")
    return reply


class HostileGrid(RecordingGrid):
    """Node 102's reply in ``STAGE`` goes through ``BEHAVIOUR`` (None: it never arrives)."""

    STAGE, BEHAVIOUR = Stage.SETUP, raises

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout)
        if self.replies[-1][0] != self.STAGE:
            return replies
        out = []
        for reply in replies:
            if reply.metadata.src_node_id == HOSTILE:
                sent = next(m for m in messages if m.metadata.dst_node_id == HOSTILE)
                if self.BEHAVIOUR is copies_keys:
                    other = next(r for r in replies if r.metadata.src_node_id == 100)
                    reply.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
                        dict(other.content.config_records[RECORD_KEY_CONFIGS]))
                reply = type(self).BEHAVIOUR(reply, sent)
            if reply is not None:
                out.append(reply)
        return out


def hostile(stage, behaviour):
    return type("Hostile", (HostileGrid,), {"STAGE": stage, "BEHAVIOUR": staticmethod(behaviour)})


@pytest.fixture(scope="module")
def plain():
    """Each client's update in a plain round of the same experiment (deterministic)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = {n: getattr(TaskIdentity, n) for n in ("_run_id", "_node_id", "_task_id")}
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        setattr(TaskIdentity, name, value)
    _, _, _, record, arrays, clients = setup(RecordingGrid)
    updates = plain_updates(record, arrays, clients)
    for name, value in saved.items():
        setattr(TaskIdentity, name, value)
    return updates


DROPOUTS = [  # (stage, behaviour, why it is left out)
    (Stage.SETUP, raises, "SecAgg+ setup stage: error reply"),
    (Stage.SETUP, times_out, None),
    (Stage.SETUP, edits(**{Key.PUBLIC_KEY_1: None}), "not two distinct byte strings"),
    (Stage.SETUP, edits(**{Key.PUBLIC_KEY_2: b"not a key"}), "its public keys do not load"),
    (Stage.SHARE_KEYS, raises, "SecAgg+ share_keys stage: error reply"),
    (Stage.SHARE_KEYS, times_out, None),
    (Stage.SHARE_KEYS, edits(**{Key.DESTINATION_LIST: [1]}), "of one length"),
    (Stage.SHARE_KEYS, edits(**{Key.CIPHERTEXT_LIST: ["text", "text"]}), "of one length"),
    (Stage.SHARE_KEYS, edits(**{Key.DESTINATION_LIST: [100, 100]}), "exactly its neighbours"),
    (Stage.COLLECT_MASKED_VECTORS, raises, "error reply"),
    (Stage.COLLECT_MASKED_VECTORS, times_out, None),
    (Stage.COLLECT_MASKED_VECTORS, edits(**{Key.MASKED_PARAMETERS: None}), "cannot be read"),
    (Stage.COLLECT_MASKED_VECTORS, masked(lambda v: np.full(v.shape, np.nan)),
     "not integers in [0, secagg.modulus_range)"),
    (Stage.COLLECT_MASKED_VECTORS, masked(lambda v: v + 2 ** 40), "not integers in [0"),
    (Stage.COLLECT_MASKED_VECTORS, masked(lambda v: v[:1]), "shapes differ"),
    (Stage.COLLECT_MASKED_VECTORS, nan_loss, "'train-loss'"),
]


@pytest.mark.parametrize("stage, behaviour, reason", DROPOUTS)
def test_a_client_failing_in_a_stage_is_a_dropout_and_the_others_mean_is_released(
        stage, behaviour, reason, plain, fmnist_available, server_task):
    cfg, strategy, grid, record, arrays, clients = setup(hostile(stage, behaviour))
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    report = strategy.report
    assert new is not None and report.clients == 2 and report.refused_aggregate == ""
    if reason is None:  # nothing arrived: lost or late, never rejected
        assert report.rejected == []
    else:
        assert report.rejected_partitions == ["2"] and reason in report.rejected[0]
    others = sorted(n for n in plain if n != HOSTILE)
    check_aggregate(cfg, strategy, to_numpy(new), arrays, [plain[n][0] for n in others],
                    [plain[n][1] for n in others])


@pytest.mark.parametrize("behaviour", [
    raises, times_out, edits(**{Key.NODE_ID_LIST: [100]}), edits(**{Key.SHARE_LIST: None})])
def test_a_client_failing_in_the_unmask_stage_leaves_the_whole_mean(behaviour, plain,
                                                                   fmnist_available,
                                                                   server_task):
    """Its masked vector is already in the sum; its neighbours' shares rebuild its mask."""
    cfg, strategy, grid, record, arrays, clients = setup(hostile(Stage.UNMASK, behaviour))
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60)
    assert new is not None and strategy.report.clients == 3 and strategy.report.rejected == []
    nodes = sorted(plain)
    check_aggregate(cfg, strategy, to_numpy(new), arrays, [plain[n][0] for n in nodes],
                    [plain[n][1] for n in nodes])


def test_a_copied_public_key_leaves_out_both_holders_and_the_round_releases_nothing(
        fmnist_available, server_task):
    """Which of two replies copied the other's key cannot be told: neither is used (with 3
    clients, the one left is below the threshold); the round ends, the run does not."""
    cfg, strategy, grid, record, arrays, clients = setup(hostile(Stage.SETUP, copies_keys))
    assert secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60) is None
    assert sorted(strategy.report.rejected_partitions) == ["0", "2"]
    assert all("another client's too" in r for r in strategy.report.rejected)
    assert "halted in the setup stage: 1 of 3 clients stayed" in \
        strategy.report.refused_aggregate


def test_a_masked_vector_outside_the_protocol_releases_nothing_and_names_nobody(
        fmnist_available, server_task):
    """Node 102 adds half the modulus to its masked vector: integers in range, so no check of
    its reply can see it, but the unmasked sum holds what no in-range clients can sum."""
    cfg, strategy, grid, record, arrays, clients = setup(hostile(
        Stage.COLLECT_MASKED_VECTORS,
        masked(lambda v: (v + cfg_modulus() // 2) % cfg_modulus())))
    assert secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60) is None
    assert strategy.report.rejected == []
    assert "a masked vector did not follow the protocol" in strategy.report.refused_aggregate


def cfg_modulus() -> int:
    from driftfl.common.privacy import SecAggSettings
    return SecAggSettings(name="secaggplus").modulus_range


def test_a_secure_update_is_held_to_the_honest_scale_of_the_rounds_released_before(
        fmnist_available, server_task):
    """A round whose sum is three times longer than GROWTH x the smallest update released
    before is scaled down to that, not refused: the run goes on, nobody named."""
    cfg, strategy, grid, record, arrays, clients = setup(RecordingGrid)
    honest = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60, [])
    step = np.sqrt(sum(np.sum((to_numpy(honest)[k] - to_numpy(arrays)[k]) ** 2.0)
                       for k in to_numpy(arrays) if to_numpy(arrays)[k].dtype.kind == "f"))
    released = [step / (3 * GROWTH), step]  # an earlier round moved a third of the bound
    cfg, strategy, grid, record, arrays, clients = setup(RecordingGrid)
    new = secure_train_round(strategy, grid, cfg.secagg, 1, arrays, record, 60, released)
    moved = {k: to_numpy(new)[k] - to_numpy(arrays)[k] for k in to_numpy(arrays)
             if to_numpy(arrays)[k].dtype.kind == "f"}
    norm = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in moved.values()))
    assert norm == pytest.approx(step / 3, rel=1e-3)
    assert released[-1] == pytest.approx(step / 3, rel=1e-6)
    assert strategy.report.model_updated and strategy.report.rejected == []
    assert strategy.report.held.startswith("secure update scaled from norm")
    assert "3 x the smallest update released before" in strategy.report.held


def test_a_push_inside_the_protocol_is_held_and_nobody_honest_is_rejected(
        fmnist_available, server_task, monkeypatch):
    """Node 102 masks its update times -10^4 (within the protocol: Flower's mod clips it to the
    range) in rounds 1 and 2. Before, the aggregate check refused every such round and, once a
    push got through, the honest clients' NaN losses were recorded as rejected; now each round
    releases its sum held to the bound, the model stays finite, and nobody is named."""
    import importlib

    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    module = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    honest = module._collect_masked_vectors

    def pushing(state, configs, num_examples, parameters):
        if state.nid == HOSTILE:
            parameters = ndarrays_to_parameters(
                [-1e4 * a for a in parameters_to_ndarrays(parameters)])
        return honest(state, configs, num_examples, parameters)

    monkeypatch.setattr(module, "_collect_masked_vectors", pushing)
    cfg, strategy, grid, record, arrays, clients = setup(RecordingGrid)
    first_norm = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2)
                             for v in to_numpy(arrays).values() if v.dtype.kind == "f"))
    released: list[float] = []
    for server_round in (1, 2):
        new = secure_train_round(strategy, grid, cfg.secagg, server_round, arrays, record, 60,
                                 released)
        report = strategy.report
        assert new is not None and report.model_updated and report.clients == 3
        assert report.rejected == [] and report.refused_aggregate == ""
        assert report.held.startswith("secure update scaled from norm")
        assert all(np.isfinite(v).all() for v in to_numpy(new).values())
        arrays = new
    # round 1 held to the model's norm, round 2 to at most 3 x round 1's: it cannot compound
    assert released[0] == pytest.approx(max(1.0, first_norm), rel=1e-6)
    assert released[1] <= GROWTH * released[0] * (1 + 1e-9)
