"""The client's half of secure aggregation: Flower's own ``secaggplus_mod`` (key agreement,
secret sharing, quantisation and masking, all Flower's cryptography), and the two small mods
that fit it to driftfl's train handler.

- ``only_secagg(secaggplus_mod)``: Flower's mod reads the SecAgg+ config record of every TRAIN
  message unconditionally (a KeyError on a plain driftfl train message); wrapped, it runs only
  on messages that carry that record, and every other message passes through untouched.
- ``updates_for_secagg``: in the collect stage Flower's mod calls the ClientApp and reads the
  reply as a legacy ``FitRes`` (``fitres.parameters``, ``fitres.num_examples``). This mod makes
  driftfl's train reply into one: the model *update* (reply minus received model, the float
  arrays in the received record's order: an update stays well inside ``clipping_range``, a
  whole model might not), its weight (the example count; under differential privacy every
  client the weight 1, since DP-FedAvg averages unweighted), and the
  metrics record kept in the clear. A method's payload that the server takes as a sum (the
  record and arrays the train message names: SCAFFOLD's control delta, FedCurv's Fisher
  terms, the class prototypes) rides in
  the same masked vector, after the update, times the round's ``payload-scale`` over the
  client's weight: SecAgg+'s weighted sum then holds each payload term over the round's m
  clients. The full model, and any other record, never leaves.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import FitRes, Status, Code, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import (RECORD_KEY_CONFIGS,
                                                                  RECORD_KEY_STATE, Key, Stage)
from flwr.compat.common import recorddict_compat as compat

from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import (ARRAYS, CONFIG, EXPERIMENT, METRICS, NUM_EXAMPLES,
                                     PAYLOAD_SCALE, summed_payload)

from . import node


def is_secagg(msg: Message) -> bool:
    return msg.has_content() and RECORD_KEY_CONFIGS in msg.content.config_records


def only_secagg(mod: Mod) -> Mod:
    """``mod`` for messages of the SecAgg+ protocol; any other message goes straight on."""
    def guarded(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        return mod(msg, context, call_next) if is_secagg(msg) else call_next(msg, context)
    return guarded


def float_keys(record: ArrayRecord) -> list[str]:
    """The arrays SecAgg+ carries, in the record's order (the server reads the same)."""
    return [k for k in record if np.issubdtype(np.dtype(record[k].dtype), np.floating)]


def client_weight(experiment: ExperimentConfig, num_examples: float) -> int:
    """The weight a client's update enters the secure mean with: its example count, or under
    differential privacy 1 for every client (DP-FedAvg's unweighted mean; the server then
    runs the round with max_weight 1)."""
    return 1 if experiment.privacy.enabled else int(num_examples)


def payload_terms(reply: Message, summed: tuple[str, list[str]] | None,
                  scale: float) -> list[np.ndarray]:
    """The reply's summed payload (``summed``: the record and arrays the train message names),
    each array times ``scale``, in that order."""
    if summed is None or summed[0] not in reply.content.array_records:
        return []
    record = reply.content.array_records[summed[0]]
    return [record[k].numpy().astype(np.float64) * scale for k in summed[1] if k in record]


def secagg_floor(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Every SecAgg+ stage checked against this node's floor before the node sends anything:
    the protocol's parameters are the server's to choose, and a server choosing one share, a
    threshold of one or a key set of this node alone would unmask its vector (docs/privacy.md).
    ConfigError in one line naming the parameter; the node's floor is its operator's
    --node-config (min-secagg-clients, min-secagg-threshold), checked whatever else it says."""
    if not is_secagg(msg):
        return call_next(msg, context)
    floor = node.node_config(context.node_config)
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    if problem := secagg_problem(str(configs.get(Key.STAGE, "")), configs, floor, msg, context):
        raise ConfigError(f"SecAgg+: {problem}: refused")
    return call_next(msg, context)


def secagg_problem(stage: str, configs, floor, msg: Message, context: Context) -> str | None:
    """Why this SecAgg+ stage asks for less than the node accepts (None: it does not)."""
    fewest = floor.min_secagg_clients
    if stage == Stage.SETUP:
        sample, shares = int(configs[Key.SAMPLE_NUMBER]), int(configs[Key.SHARE_NUMBER])
        threshold = int(configs[Key.THRESHOLD])
        if sample < fewest or shares < fewest:
            return (f"the server asks for a round of {sample} client(s) in neighbourhoods of "
                    f"{shares}; this node joins {fewest} at least (min-secagg-clients)")
        if threshold < floor.min_secagg_threshold:
            return (f"the server asks for a reconstruction threshold of {threshold}; this node "
                    f"accepts {floor.min_secagg_threshold} at least (min-secagg-threshold)")
        if 2 * threshold <= shares:
            return (f"the server asks for a threshold of {threshold} of {shares} shares, not "
                    "more than half of them: two halves of its neighbours could give the "
                    "server both this node's mask seed and its key")
    elif stage == Stage.SHARE_KEYS:
        keys = [k for k in configs if k != Key.STAGE]
        if len(keys) < fewest:
            return (f"the key set holds {len(keys)} client(s); this node shares its secrets "
                    f"among {fewest} at least (min-secagg-clients)")
    elif stage == Stage.COLLECT_MASKED_VECTORS:
        state = context.state.config_records.get(RECORD_KEY_STATE, {})
        experiment = ExperimentConfig.from_json(str(msg.content[CONFIG][EXPERIMENT]))
        if experiment.privacy.name == "distributed":
            shares = experiment.privacy.noise_shares(experiment.clients_per_round)
            if int(state.get("sample_num", 0)) < shares:
                return (f"the round's sample of {state.get('sample_num', 0)} client(s) is "
                        f"smaller than the {shares} noise shares (m_min) this node's noise "
                        "assumes in the sum")
    elif stage == Stage.UNMASK:
        active = set(configs[Key.ACTIVE_NODE_ID_LIST])
        dead = set(configs[Key.DEAD_NODE_ID_LIST])
        if active & dead:
            return ("the server asks for both the mask seed and the key of node(s) "
                    f"{sorted(active & dead)[:3]}, which unmasks their own vectors")
        if msg.metadata.dst_node_id in dead:
            return "the server asks for this node's own key after it sent its masked vector"
    return None


def updates_for_secagg(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """In SecAgg+'s collect stage, driftfl's train reply as the FitRes Flower's mod masks."""
    # Flower's mod calls on only in the collect stage, the one whose record carries the
    # forwarded key shares (it has taken the stage's name out of the record by then)
    if not (is_secagg(msg) and Key.CIPHERTEXT_LIST in msg.content.config_records[
            RECORD_KEY_CONFIGS]):
        return call_next(msg, context)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    received = msg.content.array_records[ARRAYS]
    trained = reply.content.array_records[ARRAYS]
    # in float64: Flower's mod quantises in the update's precision, and float32 would round
    # (x + clipping_range) by more than a quantisation level's share
    update = [trained[k].numpy().astype(np.float64) - received[k].numpy()
              for k in float_keys(trained)]
    metrics = reply.content.metric_records[METRICS]
    config = msg.content.config_records[CONFIG]
    experiment = ExperimentConfig.from_json(str(config[EXPERIMENT]))
    weight = client_weight(experiment, metrics[NUM_EXAMPLES])
    update += payload_terms(reply, summed_payload(config),
                            float(config.get(PAYLOAD_SCALE, 1.0)) / weight)
    fitres = FitRes(Status(Code.OK, "Success"), ndarrays_to_parameters(update), weight, {})
    content = compat.fitres_to_recorddict(fitres, keep_input=False)
    content[METRICS] = MetricRecord(dict(metrics))  # in the clear: the server checks them
    return Message(content, reply_to=msg)


# outermost first: the node's floor, Flower's protocol, then the reply made into what it masks
SECAGG_MODS: list[Mod] = [secagg_floor, only_secagg(secaggplus_mod), updates_for_secagg]
