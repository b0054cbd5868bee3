"""A node's privacy against a server that deviates from the protocol: each message an outside
audit's deviating ServerApp sent, fed to the real ClientApp in this process. What the node
releases is decided by its own model and floor, never by what the message claims; every
message it answers is under its floor; SecAgg+'s parameters are checked before it sends
anything. (The ledger's cases are tests/server/test_ledger.py's; a deviating ServerApp against
real SuperNodes is tests/e2e/test_e2e_deployment.py's.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from driftfl.common.config import compose
from driftfl.common.models import build_model
from driftfl.common.protocol import (ARRAYS, CSD_PROTOTYPES, DATA_SUMMARY, DCFL_CONDENSE, METHOD,
                                     METRICS, NUM_EXAMPLES, SERVER_ROUND, TEACHER)
from support.messages import answer, arrays_of, experiment_json, message, node_context, record

NODE = {"dataset": "fmnist", "partition-id": 0, "num-partitions": 3}
# what the audit's nodes accepted: distributed DP, sigma 2 on a clip of 1, m_min 2
DISTRIBUTED = ["privacy=distributed", "privacy.noise_multiplier=2", "privacy.clip=1",
               "num_clients=3", "privacy.min_survivors=2"]
FLOOR = {**NODE, "min-privacy": "distributed", "min-noise-multiplier": 2, "max-clip": 1,
         "max-cohort": 4}


def train_message(experiment: str, arrays: ArrayRecord):
    return message(MessageType.TRAIN, experiment, {ARRAYS: arrays},
                   **{METHOD: "ce", SERVER_ROUND: 1})


def initial_arrays() -> ArrayRecord:
    cfg = compose(["model=mlp"])
    return arrays_of(build_model(cfg.model, (1, 28, 28), 10))


def test_an_array_the_server_types_otherwise_is_refused_and_never_released_unnoised(
        fmnist_available, server_task):
    """The audit sent features.1.weight as int64: load_state_dict cast it into the float
    parameter, the node trained it and, keying its release by the message's dtypes, sent its
    update back unclipped and unnoised (norm 10.81 against a clip of 1). Now the node checks
    every received array against its own model first."""
    experiment = experiment_json(DISTRIBUTED)
    honest = initial_arrays()
    forged = record({k: (v.numpy().astype(np.int64) if k == "features.1.weight" else v.numpy())
                     for k, v in honest.items()})
    said = answer(train_message(experiment, forged), node_context(FLOOR))
    assert said == ("the 'arrays' record holds features.1.weight as int64 (200, 784); this "
                    "model has float32 (200, 784): refused"), said
    renamed = record({("head.w" if k == "head.weight" else k): v.numpy()
                      for k, v in honest.items()})
    assert answer(train_message(experiment, renamed), node_context(FLOOR)) == (
        "the 'arrays' record's arrays are not this model's: lacks head.weight; has no such "
        "entry head.w: refused")

    # the honest message: every float coordinate is released clipped and noised, as the
    # node's own model has it, with the noise of one share, sigma C / sqrt(m_min)
    reply = answer(train_message(experiment, honest), node_context(FLOOR))
    sent = reply.content.array_records[ARRAYS]
    assert {k: sent[k].numpy().dtype for k in sent} == {k: honest[k].numpy().dtype
                                                       for k in honest}
    update = np.concatenate([(sent[k].numpy() - honest[k].numpy()).ravel() for k in honest])
    cfg = compose(DISTRIBUTED)
    share = cfg.privacy.share_noise_std(cfg.privacy.noise_shares(cfg.clients_per_round))
    assert np.linalg.norm(update) == pytest.approx(share * math.sqrt(update.size), rel=0.02)
    assert set(reply.content.metric_records[METRICS]) <= {NUM_EXAMPLES, "local-steps"}


@pytest.mark.parametrize("message_type, says", [
    (MessageType.EVALUATE, "evaluate asks for this node's exact loss and accuracy on its data"),
    (f"query.{CSD_PROTOTYPES}", "the prototype query asks for this node's exact mean logits per "
                                "class"),
    (f"query.{DCFL_CONDENSE}", "the condensation query asks for images made from this node's "
                               "data and its trained classifier"),
])
def test_under_differential_privacy_a_node_answers_no_message_its_release_does_not_cover(
        message_type, says, fmnist_available, server_task):
    """Under the experiment a floor accepts, the audit's evaluate returned the exact loss and
    accuracy of any model it chose, and the prototype query exact mean logits per class of any
    teacher: now refused on the node, in one line, as an honest server refuses to send them."""
    arrays = initial_arrays()
    records = {ARRAYS: arrays, TEACHER: arrays}
    for node_config, overrides in ((FLOOR, DISTRIBUTED), (NODE, DISTRIBUTED),
                                   (NODE, ["privacy=central"])):
        said = answer(message(message_type, experiment_json(overrides), records,
                              **{SERVER_ROUND: 1}), node_context(node_config))
        assert said == f"{says}, which no noise covers; under differential privacy this node " \
                       "answers none: refused", said
    # without DP and without a floor the same messages are answered (the methods need them)
    reply = answer(message(MessageType.EVALUATE, experiment_json(), {ARRAYS: arrays}),
                   node_context(NODE))
    assert reply.content.metric_records[METRICS][NUM_EXAMPLES] > 0
    # the data survey: what every mode discloses (a node's counts are public to the accounting)
    survey = answer(message(f"query.{DATA_SUMMARY}", experiment_json(DISTRIBUTED)),
                    node_context(FLOOR))
    assert not isinstance(survey, str)


def setup_stage(sample: int, shares: int, threshold: int):
    return message(MessageType.TRAIN, experiment_json(DISTRIBUTED), {
        RECORD_KEY_CONFIGS: ConfigRecord({
            Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: sample, Key.SHARE_NUMBER: shares,
            Key.THRESHOLD: threshold, Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 1 << 22,
            Key.MOD_RANGE: 1 << 32, Key.MAX_WEIGHT: 1000.0})})


@pytest.mark.parametrize("sample, shares, threshold, says", [
    # the audit's round: one client, one share, a threshold of one
    (1, 1, 1, "the server asks for a round of 1 client(s) in neighbourhoods of 1; this node "
              "joins 2 at least (min-secagg-clients)"),
    (3, 3, 1, "the server asks for a reconstruction threshold of 1; this node accepts 2 at "
              "least (min-secagg-threshold)"),
    (5, 5, 2, "the server asks for a threshold of 2 of 5 shares, not more than half of them: "
              "two halves of its neighbours could give the server both this node's mask seed "
              "and its key"),
])
def test_secaggplus_parameters_below_the_nodes_floor_are_refused_before_it_sends_a_key(
        sample, shares, threshold, says, server_task):
    required = {**NODE, "require-secagg": True}
    said = answer(setup_stage(sample, shares, threshold), node_context(required))
    assert said == f"SecAgg+: {says}: refused", said
    # the protocol's defaults for three clients pass, and the node answers with its keys
    reply = answer(setup_stage(3, 3, 2), node_context(required))
    assert not isinstance(reply, str), reply
    assert Key.PUBLIC_KEY_1 in reply.content.config_records[RECORD_KEY_CONFIGS]
    # an operator may ask for more than the defaults
    stricter = {**required, "min-secagg-clients": 4}
    assert "joins 4 at least" in answer(setup_stage(3, 3, 2), node_context(stricter))


def test_a_key_set_of_this_node_alone_and_an_unmask_of_its_own_key_are_refused(server_task):
    """After a setup the floor accepts, the audit's key set held the node alone; and an unmask
    stage may ask for a node's mask seed and its key at once, or for this node's own key."""
    context = node_context(NODE)
    reply = answer(setup_stage(3, 3, 2), context)
    keys = reply.content.config_records[RECORD_KEY_CONFIGS]
    alone = message(MessageType.TRAIN, experiment_json(), {RECORD_KEY_CONFIGS: ConfigRecord({
        Key.STAGE: Stage.SHARE_KEYS, "7": [keys[Key.PUBLIC_KEY_1], keys[Key.PUBLIC_KEY_2]]})})
    assert answer(alone, context) == ("SecAgg+: the key set holds 1 client(s); this node shares "
                                      "its secrets among 2 at least (min-secagg-clients): "
                                      "refused")
    for active, dead, says in (([7, 8, 9], [9], "both the mask seed and the key of node(s) "
                                                "[9]"),
                               ([8, 9], [7], "this node's own key after it sent its masked "
                                             "vector")):
        unmask = message(MessageType.TRAIN, experiment_json(), {RECORD_KEY_CONFIGS: ConfigRecord(
            {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: active,
             Key.DEAD_NODE_ID_LIST: dead})})
        said = answer(unmask, node_context(NODE))
        assert said.startswith(f"SecAgg+: the server asks for {says}"), said
