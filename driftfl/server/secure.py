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
  every byte). It checks every stage's replies (secure_checks) before the workflow reads them.
- ``_run_protocol``: the four stages; a node lost before the collect stage is not asked about
  in the unmask stage (nobody holds a share of it), and an exception ends the round, not the run.

What moved, compared with a plain round: the server never holds one client's update, so the
per-reply checks on the model (keys, shapes, finite values, update norm, the peer screen
against the round's median, max_examples_ratio's weight cap) cannot run. What can still run is
run on each stage's replies' form, on the metrics each client sends in the clear (its example
count against the data survey, its step count against what the experiment makes of it, the
release's and the aggregation's own reject) and on the masked vector's shapes and range; a
reply that fails, in any stage, is left out as if its node had dropped out (the protocol then
removes its masks). The unmasked sum must be one the round's clients can make within the
clipping range, and its update is held to ``secure_bound``. Before unmasking, the release
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

from collections.abc import Callable, Iterable
from logging import WARNING
from types import SimpleNamespace

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import FitIns, Parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid
from flwr.supercore import log

from driftfl.common.error_replies import error_reason
from driftfl.common.errors import ConfigError
from driftfl.common.privacy import SecAggSettings, float_keys
from driftfl.common.protocol import CONFIG, LOCAL_STEPS, METRICS, NUM_EXAMPLES, PAYLOAD_SCALE
from driftfl.strategies import DriftStrategy
from driftfl.strategies.parts.aggregation import (ClientUpdate, model_norm, norm_bound,
                                                  read_metrics)
from driftfl.strategies.parts.release import SecureSum

from .secure_checks import in_range, shared_keys, stage_checks

# a secure round's update may be at most this many times the smallest update released before
# it (honest rounds' updates shrink slowly as training goes)
GROWTH = 3.0


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
    """The stages' grid: each stage's replies are checked (secure_checks) before the workflow
    reads them; one that fails, or is an error, is left out as if its node had dropped out."""

    def __init__(self, grid: Grid, checks: dict[str, Callable[[Message], str | None]]):
        self._grid, self.checks = grid, checks
        self.collected: list[Message] = []  # the collect-stage replies summed
        self.rejected: dict[int, str] = {}  # node -> why its reply was left out of the sum

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        messages = list(messages)
        if not messages:
            return []
        stage = messages[0].content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        asked, seen, kept = {m.metadata.dst_node_id for m in messages}, set(), []
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in asked or node in seen:
                continue  # the SuperLink's notice that a node is lost (counted as lost), or
            seen.add(node)  # a second reply from one node
            reason = (error_reason(reply.error) if reply.has_error()
                      else self.checks[stage](reply))
            if reason is None:
                kept.append(reply)
            else:
                self.refuse(stage, node, reason)
        if stage == Stage.SETUP:
            copied = shared_keys(kept)
            for node in copied:
                self.refuse(stage, node, "its public key is another client's too")
            kept = [r for r in kept if r.metadata.src_node_id not in copied]
        if stage == Stage.COLLECT_MASKED_VECTORS:
            self.collected = kept
        return kept

    def refuse(self, stage: str, node: int, reason: str) -> None:
        if stage == Stage.UNMASK:  # its update is in the sum: its masks are rebuilt from shares
            log(WARNING, "SecAgg+ unmask stage: node %d's reply left out: %s", node, reason)
        else:
            self.rejected[node] = reason if stage == Stage.COLLECT_MASKED_VECTORS else (
                f"SecAgg+ {stage} stage: {reason}")


def _clear_check(strategy: DriftStrategy):
    """What can be checked of a masked reply's clear metrics."""
    def check(msg: Message) -> str | None:
        content = msg.content
        if METRICS not in content.metric_records:
            return f"reply lacks the '{METRICS}' record"
        metrics = read_metrics(content.metric_records[METRICS])
        if isinstance(metrics, str):
            return metrics
        n, steps = metrics.get(NUM_EXAMPLES), metrics.get(LOCAL_STEPS)
        if not isinstance(n, float) or n <= 0:
            return f"'{NUM_EXAMPLES}' is missing or not a positive number"
        if not isinstance(steps, float) or steps < 1:
            return f"'{LOCAL_STEPS}' is {steps}; a reply must report at least one local step"
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


def round_clipping_range(strategy: DriftStrategy, settings: SecAggSettings) -> float:
    """The range each coordinate of a client's weighted masked vector is clipped to this round:
    secagg.clipping_range, or under ``auto`` what an honest client's coordinate can reach: the
    release's bound (distributed DP: the clip C plus its noise share's reach), else the bound
    on one update's norm, max_update_ratio x max(1, the model's norm), which bounds each of
    its coordinates too."""
    if settings.clipping_range != "auto":
        return float(settings.clipping_range)
    return strategy.release.coordinate_reach(strategy.facts()) or norm_bound(
        strategy.global_arrays, strategy.max_update_ratio)


def secure_bound(strategy: DriftStrategy, released: list[float]) -> tuple[float, str]:
    """How far a secure round's update may move the model, and why (in words). The server
    cannot see one client's update, so the sum is held to what it knows an honest round moves:
    under distributed DP the release's bound (every honest update is clipped to C, so their
    mean is within C plus the noise's reach); otherwise the model's own norm (max(1, ||w||):
    an honest FedAvg round moves a fraction of it) and GROWTH x the smallest update released
    before (honest rounds' updates shrink slowly as training goes), and never beyond the
    aggregate check's bound. A push pinned at the bound every round leaves the smallest
    released update, and so the bound, where it was: it does not compound."""
    private = strategy.release.aggregate_bound(strategy.facts())
    if private:
        return private, "the release's bound: the clip plus the noise's reach"
    bounds = {"the aggregate check's bound": norm_bound(strategy.global_arrays,
                                                        strategy.max_update_ratio),
              "the model's norm": max(1.0, model_norm(strategy.global_arrays))}
    if released:
        bounds[f"{GROWTH:g} x the smallest update released before"] = GROWTH * min(released)
    why = min(bounds, key=bounds.get)
    return bounds[why], why


def secure_train_round(strategy: DriftStrategy, grid: Grid, settings: SecAggSettings,
                       server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       timeout: float, released: list[float] | None = None
                       ) -> ArrayRecord | None:
    """Round ``server_round``'s training through SecAgg+: the next global model the strategy
    makes of the secure sum (``aggregate_train``), or None. Under differential privacy every
    client weighs 1 (the release's unweighted mean). ``released``: the update norms earlier
    secure rounds released (this round's is appended when it releases one)."""
    released = [] if released is None else released
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
    clipping = round_clipping_range(strategy, settings)
    state = WorkflowState()
    wire = _ScreeningGrid(grid, stage_checks(
        state, [global_arrays[k].shape for k in keys] + list(payload.values()),
        settings.modulus_range, _clear_check(strategy)))
    workflow = SecAggPlusWorkflow(settings.num_shares, settings.reconstruction_threshold,
                                  max_weight=max_weight, clipping_range=clipping,
                                  quantization_range=settings.quantization_range,
                                  modulus_range=settings.modulus_range, timeout=timeout)
    halted = _run_protocol(workflow, wire, context, state, contents, strategy.release)
    mean = adapter.mean_update if not halted else None
    payload_sum = None
    if mean is not None:
        weights = sum(_quantised_ratio(float(m.content[METRICS][NUM_EXAMPLES]), settings,
                                       max_weight, unweighted) for m in wire.collected)
        # n clients within +-R sum to at most n R per coordinate (one level more for rounding)
        limit = (len(wire.collected) * clipping + 2 * clipping / settings.quantization_range
                 ) / weights
        if not in_range(mean, limit):
            mean, halted = None, (
                f"the unmasked sum of {len(wire.collected)} masked vectors holds values that "
                f"clients within secagg.clipping_range ({clipping:.3g}) cannot sum to: a "
                "masked vector did not follow the protocol, and which one cannot be told; "
                "nothing is released")
    if mean is not None and payload:  # the payload's part: back to the sum of the terms
        payload_sum = {name: part * weights * len(contents) for name, part in
                       zip(payload, mean[len(keys):], strict=True)}
        mean = mean[:len(keys)]
    held = ""
    if mean is not None:
        mean, held = _held_to(mean, *secure_bound(strategy, released))
        released.append(_norm(mean))
    updates = [ClientUpdate(m.metadata.src_node_id, {}, read_metrics(m.content[METRICS]), m)
               for m in strategy.clients.in_order(wire.collected)]
    answered = {m.metadata.src_node_id for m in wire.collected} | set(wire.rejected)
    arrays, _ = strategy.aggregate_train(server_round, SecureSum(
        updates, dict(wire.rejected), answered, mean, payload_sum, halted,
        unmasked=adapter.mean_update is not None))
    if held:
        log(WARNING, "round %d: %s", server_round, held)
        strategy.report.held = held
    return arrays


def _run_protocol(workflow: SecAggPlusWorkflow, wire: _ScreeningGrid, context,
                  state: WorkflowState, contents: dict[int, RecordDict], release) -> str:
    """Flower's four stages over the screening grid: "" when the unmask stage delivered the
    sum, else why the round releases nothing. A client lost (an error, no reply in time, a
    reply that fails its stage's check) is a dropout; the round goes on while each
    neighbourhood keeps the reconstruction threshold."""
    stages = [("setup", workflow.setup_stage), ("share keys", workflow.share_keys_stage),
              ("collect masked vectors", workflow.collect_masked_vectors_stage),
              ("unmask", workflow.unmask_stage)]
    if len(contents) < 2:
        return "secure aggregation needs at least 2 clients in the round"
    for name, stage in stages:
        if name == "unmask" and not release.enough(len(wire.collected)):
            # the server stops before it could learn the sum
            return (f"{len(wire.collected)} masked replies arrived, fewer than the release "
                    "needs: the server does not unmask them")
        try:
            completed = stage(wire, context, state)
        except Exception as err:  # noqa: BLE001 - a reply no check foresaw: the round fails
            log(WARNING, "SecAgg+ %s stage failed: %r", name, err)
            return (f"secure aggregation failed in the {name} stage ({type(err).__name__}); "
                    "nothing is released")
        if not completed:
            return (f"secure aggregation halted in the {name} stage: {len(state.active_node_ids)} "
                    f"of {len(contents)} clients stayed, too few for a neighbourhood's "
                    f"reconstruction threshold of {state.threshold}")
        if name == "setup":  # the strategy's own train content, one RecordDict per node
            state.nid_to_fitins = {n: RecordDict(dict(contents[n])) for n in state.nid_to_fitins}
        if name == "share keys":
            # a node lost in the first two stages sent no share to anyone and nobody masks
            # with it: there is nothing of it to rebuild (Flower's unmask stage would ask its
            # neighbours for shares they never received, and fail)
            state.sampled_node_ids = set(state.active_node_ids)
    return ""


def _norm(arrays: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in arrays)))


def _held_to(mean: list[np.ndarray], bound: float, why: str) -> tuple[list[np.ndarray], str]:
    """The mean update scaled down to norm ``bound`` where it is longer, and how (in words)."""
    norm = _norm(mean)
    if norm <= bound:
        return mean, ""
    return [v * (bound / norm) for v in mean], (
        f"secure update scaled from norm {norm:.3g} to {bound:.3g} ({why})")


def _quantised_ratio(num_examples: float, settings: SecAggSettings, max_weight: float,
                     unweighted: bool) -> float:
    """A client's weight as SecAgg+ sums it: weight / max_weight, quantised as its mod does."""
    weight = 1.0 if unweighted else float(int(num_examples))
    return round(weight / max_weight * settings.quantization_range) / settings.quantization_range
