"""One train round through Flower's SecAgg+ protocol, for driftfl's Message-API strategies.

Reused from Flower, unchanged: ``SecAggPlusWorkflow`` and its four stage methods (setup, share
keys, collect masked vectors, unmask: the server's half of the protocol and its cryptography)
and, on the clients, ``secaggplus_mod`` (driftfl.client.secure). Written here, because the
workflow serves only Flower's legacy strategies and LegacyContext: a thin shim.

- ``_LegacyStrategy``: what the stages call. Its ``configure_fit`` returns the nodes the
  DriftStrategy sampled (its own ``configure_train``); its ``aggregate_fit`` keeps the one
  thing the unmask stage hands it, the unmasked weighted mean of the clients' updates.
- A minimal context (the round, an empty parameter record, the adapter, a node count).
- After the setup stage, each node's train content is the strategy's own message content (the
  global model, the experiment, its knowledge), not a legacy FitIns: the collect stage adds
  the secret shares to it and the ClientApp trains on it as on any train message.
- ``_ScreeningGrid``: the grid the stages talk through (the metered grid under it still counts
  every byte). It checks each collect-stage reply before the workflow sums it.

What moved, compared with a plain round: the server never holds one client's update, so the
per-reply checks on the model (keys, shapes, finite values, update norm, the peer screen
against the round's median, max_examples_ratio's weight cap) cannot run. What can still run is
run on the metrics each client sends in the clear (its example count against the data survey,
its step count against what the experiment makes of it, the release's and the aggregation's
own reject) and on the masked vector's shapes; a reply that fails is left out of the sum as if
its node had dropped out (the protocol then removes its masks). Before unmasking, the release
says whether the sum may be unmasked at all (privacy=distributed: at least min_survivors noise
shares in it); if not, the server stops there and learns nothing. The round then goes to the
strategy's own ``aggregate_train`` as a ``SecureSum``: the same release, aggregation, aggregate
check and method state update as any round (FedAvgM's momentum, FedGKD's teacher buffer).

A method's payload that the server takes as a sum (``DriftStrategy.payload``: SCAFFOLD's
Delta c_k, the class prototypes) rides in the same masked vector after the update. Each client
sends its term times ``payload-scale`` = W / m over its weight (W the round's max weight, m its
clients), so SecAgg+'s weighted sum holds sum_k term_k / m: the terms keep their own scale
inside the quantisation range. The server multiplies the unmasked mean back by the sum of the
weights and by m, and hands the method the sum (``payload_sum``).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import FitIns, Parameters, bytes_to_ndarray, parameters_to_ndarrays
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid

from driftfl.common.error_replies import error_reason
from driftfl.common.errors import ConfigError
from driftfl.common.privacy import SecAggSettings, float_keys
from driftfl.common.protocol import CONFIG, LOCAL_STEPS, METRICS, NUM_EXAMPLES, PAYLOAD_SCALE
from driftfl.strategies import DriftStrategy
from driftfl.strategies.parts.aggregation import ClientUpdate, read_metrics
from driftfl.strategies.parts.release import SecureSum


def check_weights(settings: SecAggSettings, clients: list[dict], unweighted: bool) -> None:
    """ConfigError, after the data survey, when a client's example count exceeds max_weight:
    its weighted update would leave the quantisation range."""
    over = [c for c in clients if c["num_examples"] > settings.max_weight]
    if over and not unweighted:
        most = max(c["num_examples"] for c in over)
        raise ConfigError(f"secagg.max_weight={settings.max_weight:g} is below a client's "
                          f"{most} examples (partition {over[0]['partition_id']}): SecAgg+ "
                          f"would overflow; set secagg.max_weight={most} or more")


class _LegacyStrategy:
    """The two calls SecAggPlusWorkflow's stages make of a legacy Strategy."""

    def __init__(self, nodes: list[int]):
        self.nodes = nodes
        self.mean_update: list[np.ndarray] | None = None

    def configure_fit(self, server_round, parameters, client_manager):
        empty = FitIns(Parameters(tensors=[], tensor_type="numpy.ndarray"), {})
        return [(SimpleNamespace(node_id=node), empty) for node in self.nodes]

    def aggregate_fit(self, server_round, results, failures):
        if results:  # the unmask stage gave every result the same aggregate
            self.mean_update = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}  # the DriftStrategy makes the model, not the workflow


class _ScreeningGrid:
    """The stages' grid: collect-stage replies that fail ``check`` never reach the sum."""

    def __init__(self, grid: Grid, check):
        self._grid, self.check = grid, check
        self.collected: list[Message] = []  # the collect-stage replies summed (errors too)
        self.rejected: dict[int, str] = {}  # node -> why its reply was left out

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        messages = list(messages)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        if not messages or messages[0].content.config_records[RECORD_KEY_CONFIGS].get(
                Key.STAGE) != Stage.COLLECT_MASKED_VECTORS:
            return replies
        kept = []
        for reply in replies:
            if reply.has_error() and reply.metadata.src_node_id == SUPERLINK_NODE_ID:
                continue  # the SuperLink's notice that a node is lost: counted as lost
            reason = error_reason(reply.error) if reply.has_error() else self.check(reply)
            if reason is None:
                kept.append(reply)
            else:
                self.rejected[reply.metadata.src_node_id] = reason
        self.collected = kept
        return kept


def _reply_check(strategy: DriftStrategy, shapes: list[tuple[int, ...]]):
    """What can be checked of a masked reply: its clear metrics and its vector's shapes."""
    def check(msg: Message) -> str | None:
        content = msg.content
        if METRICS not in content.metric_records or RECORD_KEY_CONFIGS not in content:
            return f"reply lacks the '{METRICS}' or the SecAgg+ record"
        metrics = read_metrics(content.metric_records[METRICS])
        if isinstance(metrics, str):
            return metrics
        n, steps = metrics.get(NUM_EXAMPLES), metrics.get(LOCAL_STEPS)
        if not isinstance(n, float) or n <= 0:
            return f"'{NUM_EXAMPLES}' is missing or not a positive number"
        if not isinstance(steps, float) or steps < 1:
            return f"'{LOCAL_STEPS}' is {steps}; a reply must report at least one local step"
        try:
            vector = [bytes_to_ndarray(b) for b in
                      content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        except Exception as err:  # missing or unreadable bytes
            return f"its masked vector cannot be read: {err!r}"
        if [v.shape for v in vector] != [(1,), *shapes]:
            return "its masked vector's shapes differ from the global model's"
        return strategy.reject(ClientUpdate(msg.metadata.src_node_id, {}, metrics, msg))
    return check


def round_max_weight(strategy: DriftStrategy, nodes: list[int], settings: SecAggSettings,
                     unweighted: bool) -> float:
    """The max_weight the round's clients scale their weights by: the largest example count
    the data survey found among them (so the largest client's weight is 1: the finest
    quantisation SecAgg+ allows), at most secagg.max_weight; 1 when every client weighs 1."""
    if unweighted:
        return 1.0
    if strategy.clients.surveyed is None or not nodes:
        return settings.max_weight
    return float(min(settings.max_weight, max(strategy.clients.count(n) for n in nodes)))


def secure_train_round(strategy: DriftStrategy, grid: Grid, settings: SecAggSettings,
                       server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       timeout: float) -> ArrayRecord | None:
    """Round ``server_round``'s training through SecAgg+: the next global model the strategy
    makes of the secure sum (``aggregate_train``), or None. Under differential privacy every
    client weighs 1 (the release's unweighted mean)."""
    messages = list(strategy.configure_train(server_round, arrays, config, grid))
    contents = {m.metadata.dst_node_id: m.content for m in messages}
    global_arrays = strategy.global_arrays
    keys = float_keys(global_arrays)
    unweighted = not strategy.release.weighs_examples
    max_weight = round_max_weight(strategy, list(contents), settings, unweighted)
    for content in contents.values():  # (the messages may share one config record)
        content[CONFIG] = ConfigRecord({**content[CONFIG],
                                        PAYLOAD_SCALE: max_weight / max(1, len(contents))})
    payload = strategy.payload()
    adapter = _LegacyStrategy(list(contents))
    context = SimpleNamespace(
        state=RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND:
                                                             server_round}),
                          MAIN_PARAMS_RECORD: ArrayRecord()}),
        strategy=adapter, client_manager=SimpleNamespace(num_available=lambda: len(contents)),
        history=None)
    wire = _ScreeningGrid(grid, _reply_check(strategy, [global_arrays[k].shape for k in keys]
                                             + list(payload.values())))
    workflow = SecAggPlusWorkflow(settings.num_shares, settings.reconstruction_threshold,
                                  max_weight=max_weight,
                                  clipping_range=settings.clipping_range,
                                  quantization_range=settings.quantization_range,
                                  modulus_range=settings.modulus_range, timeout=timeout)
    state = WorkflowState()
    halted = ("secure aggregation halted: too few clients stayed for the protocol's "
              "reconstruction threshold")
    completed = len(contents) >= 2 and workflow.setup_stage(wire, context, state)
    if completed:  # the strategy's own train content, one RecordDict per node
        state.nid_to_fitins = {n: RecordDict(dict(contents[n])) for n in state.nid_to_fitins}
        completed = (workflow.share_keys_stage(wire, context, state)
                     and workflow.collect_masked_vectors_stage(wire, context, state))
    if completed and not strategy.release.enough(len(wire.collected)):
        completed = False  # the server stops before it could learn the sum
        halted = (f"{len(wire.collected)} masked replies arrived, fewer than the release "
                  "needs: the server does not unmask them")
    completed = completed and workflow.unmask_stage(wire, context, state)
    mean = adapter.mean_update if completed else None
    payload_sum = None
    if mean is not None and payload:  # the payload's part: back to the sum of the terms
        weights = sum(_quantised_ratio(float(m.content[METRICS][NUM_EXAMPLES]), settings,
                                       max_weight, unweighted) for m in wire.collected)
        payload_sum = {name: part * weights * len(contents) for name, part in
                       zip(payload, mean[len(keys):], strict=True)}
        mean = mean[:len(keys)]
    updates = [ClientUpdate(m.metadata.src_node_id, {}, read_metrics(m.content[METRICS]), m)
               for m in strategy.clients.in_order(wire.collected)]
    answered = {m.metadata.src_node_id for m in wire.collected} | set(wire.rejected)
    arrays, _ = strategy.aggregate_train(server_round, SecureSum(
        updates, dict(wire.rejected), answered, mean, payload_sum, "" if completed else halted))
    return arrays


def _quantised_ratio(num_examples: float, settings: SecAggSettings, max_weight: float,
                     unweighted: bool) -> float:
    """A client's weight as SecAgg+ sums it: weight / max_weight, quantised as its mod does."""
    weight = 1.0 if unweighted else float(int(num_examples))
    return round(weight / max_weight * settings.quantization_range) / settings.quantization_range
