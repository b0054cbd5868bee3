"""What the server can establish of each SecAgg+ stage's replies before Flower's workflow reads
them (driftfl.server.secure). Flower's SecAggPlusWorkflow trusts every reply that is not an
error: a missing key, a value of the wrong type, a public key that does not load or a share list
that does not match ends the round with an exception, and a malformed value it forwards makes
the honest neighbours who receive it fail. A reply that fails here is treated as its node's
dropout instead: the protocol goes on without it while enough of each neighbourhood stays.

Only the form of a reply can be checked (the cryptography is Flower's and stays unread): an
encrypted share that is well-formed bytes but wrong, or a masked vector that does not follow
the protocol, passes; what the server does about a sum it cannot explain is in secure.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Message
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

# a stage's check of one reply: why it cannot be used (None: it can)
Check = Callable[[Message], str | None]


def _record(msg: Message):
    return msg.content.config_records.get(RECORD_KEY_CONFIGS) if msg.has_content() else None


def _is_list_of(value, kind: type) -> bool:
    # bool is an int in Python; a node id never is one
    return isinstance(value, list) and all(type(v) is kind for v in value)


def _shares_problem(ids, shares, expected: set[int], whose: str,
                    empty: bool = True) -> str | None:
    """Why ``ids`` and ``shares`` are not byte strings (non-empty unless ``empty``), one per id,
    for exactly the ``expected`` nodes, each once (None: they are); ``whose`` ends the second
    refusal."""
    if not (_is_list_of(ids, int) and _is_list_of(shares, bytes)) or len(ids) != len(shares) \
            or not (empty or all(shares)):
        return "its share lists are not node ids and byte strings of one length"
    if len(set(ids)) != len(ids) or set(ids) != expected:
        return f"its shares are not {whose}"
    return None


def setup_check(msg: Message) -> str | None:
    """Two distinct public keys that load (Flower's own loader)."""
    record = _record(msg)
    if record is None:
        return "reply lacks the SecAgg+ record"
    keys = [record.get(Key.PUBLIC_KEY_1), record.get(Key.PUBLIC_KEY_2)]
    if not all(isinstance(k, bytes) for k in keys) or keys[0] == keys[1]:
        return "its public keys are not two distinct byte strings"
    try:
        for key in keys:
            bytes_to_public_key(key)
    except Exception as err:  # noqa: BLE001 - any failure to load is the same refusal
        return f"its public keys do not load: {type(err).__name__}"
    return None


def share_keys_check(state: WorkflowState) -> Check:
    """One encrypted share for each neighbour the node was sent keys of, and no other."""
    def check(msg: Message) -> str | None:
        record = _record(msg)
        if record is None:
            return "reply lacks the SecAgg+ record"
        node = msg.metadata.src_node_id
        return _shares_problem(
            record.get(Key.DESTINATION_LIST), record.get(Key.CIPHERTEXT_LIST),
            (state.nid_to_neighbours[node] & state.active_node_ids) - {node},
            "addressed to exactly its neighbours")
    return check


def collect_check(state: WorkflowState, shapes: list[tuple[int, ...]], modulus: int,
                  clear: Check) -> Check:
    """The masked vector's form (integers below the modulus, the model's shapes after the
    weight), then ``clear``: the checks of the clear metrics."""
    def check(msg: Message) -> str | None:
        record = _record(msg)
        if record is None:
            return "reply lacks the SecAgg+ record"
        try:
            vector = [bytes_to_ndarray(b) for b in record[Key.MASKED_PARAMETERS]]
        except Exception as err:  # noqa: BLE001 - missing, not bytes, or unreadable
            return f"its masked vector cannot be read: {type(err).__name__}"
        if [v.shape for v in vector] != [(1,), *shapes]:
            return "its masked vector's shapes differ from the global model's"
        if not all(v.dtype.kind in "iu" and v.min(initial=0) >= 0
                   and v.max(initial=0) < modulus for v in vector):
            return "its masked vector is not integers in [0, secagg.modulus_range)"
        return clear(msg)
    return check


def unmask_check(state: WorkflowState) -> Check:
    """One share for each neighbour the server asked about, and no other."""
    def check(msg: Message) -> str | None:
        record = _record(msg)
        if record is None:
            return "reply lacks the SecAgg+ record"
        node = msg.metadata.src_node_id
        return _shares_problem(
            record.get(Key.NODE_ID_LIST), record.get(Key.SHARE_LIST),
            state.nid_to_neighbours[node] & state.sampled_node_ids,
            "of exactly the neighbours it was asked about", empty=False)
    return check


def stage_checks(state: WorkflowState, shapes: list[tuple[int, ...]], modulus: int,
                 clear: Check) -> dict[str, Check]:
    return {Stage.SETUP: setup_check, Stage.SHARE_KEYS: share_keys_check(state),
            Stage.COLLECT_MASKED_VECTORS: collect_check(state, shapes, modulus, clear),
            Stage.UNMASK: unmask_check(state)}


def shared_keys(replies: list[Message]) -> set[int]:
    """The setup replies whose public key another reply also carries: a copied key would make
    every neighbour of both fail ("Some public keys are identical"); which of them copied it
    cannot be told, so neither is used."""
    owners: dict[bytes, set[int]] = {}
    for msg in replies:
        record = _record(msg)
        for key in (record[Key.PUBLIC_KEY_1], record[Key.PUBLIC_KEY_2]):
            owners.setdefault(key, set()).add(msg.metadata.src_node_id)
    return {node for nodes in owners.values() if len(nodes) > 1 for node in nodes}


def in_range(mean: list[np.ndarray], limit: float) -> bool:
    """Whether every coordinate of an unmasked mean is one the round's clients could make
    within the clipping range (``limit``: n R / the summed weights)."""
    return all(np.isfinite(v).all() and np.abs(v).max(initial=0.0) <= limit for v in mean)
