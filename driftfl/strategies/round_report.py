"""What a round saw, for its row of metrics.csv and its round line."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from driftfl.common.error_replies import error_reason


@dataclass
class RoundReport:
    """What the last round's training saw (and its federated evaluation's metrics)."""

    clients: int = 0
    rejected: list[str] = field(default_factory=list)  # "partition 3 (node 81...): reason"
    rejected_partitions: list[str] = field(default_factory=list)  # as clients.name gives them
    # of those, the replies that failed for want of a resource (who, reason): logged in one
    # line for the round (error_replies.log_refused), not one a reply
    starved: list[tuple[str, str]] = field(default_factory=list)
    # (partition, what it lacked): replies that failed for want of a resource, not rejected
    failed: list[tuple[str, str]] = field(default_factory=list)
    # the others, by node id: those a check of the reply alone refused (strikes: guard.py)...
    offenders: list[int] = field(default_factory=list)
    # ... and those a peer bar refused: evidence of other clients' replies, no strike
    outsized: list[int] = field(default_factory=list)
    silent: list[int] = field(default_factory=list)  # sent a train message, sent nothing back
    # of those, the lost (by name, and their node ids): the SuperLink reported them
    # unavailable, or (the federation settles it) they are no longer connected
    lost: list[str] = field(default_factory=list)
    lost_nodes: list[int] = field(default_factory=list)
    late: list[str] = field(default_factory=list)  # the others: over round_timeout
    dropped: list[str] = field(default_factory=list)  # heterogeneity: dropped before training
    refused_aggregate: str = ""  # why the aggregate did not replace the global model
    held: str = ""  # SecAgg+: how the released update was held to its bound ("": it was not)
    # whether the round's aggregate replaced the global model: under DP also a round with no
    # usable reply, whose release is its noise alone
    model_updated: bool = False
    refused_state: list[str] = field(default_factory=list)  # "<state>: reason", state kept
    train_metrics: dict[str, float] = field(default_factory=dict)
    evaluate_metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of_round(cls, trained: list[int], answered: set[int], gone: set[int],
                 dropped: Iterable[int], name: Callable[[int], str]) -> RoundReport:
        """A round's report as its replies come in: who was sent a train message and sent
        nothing back (``silent``), of those the ``gone`` (lost) and the others (late), and
        who heterogeneity dropped before training; ``name`` names a node."""
        silent = [n for n in trained if n not in answered]
        lost = [n for n in silent if n in gone]
        return cls(silent=silent, lost_nodes=lost, lost=[name(n) for n in lost],
                   late=[name(n) for n in silent if n not in gone],
                   dropped=[name(n) for n in dropped])


def superlink_notices(replies: list[Message], sent: list[Message]) -> dict[int, Error]:
    """The SuperLink's own error replies, by the node whose message ``sent`` they answer."""
    sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in sent
               if m.metadata.message_id}
    return {sent_to[msg.metadata.reply_to_message_id]: msg.error for msg in replies
            if msg.has_error() and msg.metadata.src_node_id == SUPERLINK_NODE_ID
            and msg.metadata.reply_to_message_id in sent_to}


def lost_to_superlink(replies: list[Message], sent: list[Message]) -> set[int]:
    """The nodes the SuperLink reported unavailable: its error reply answers the message
    ``sent`` to the node. (Whether the other silent nodes are still connected is the
    federation's to settle.)"""
    return {node for node, error in superlink_notices(replies, sent).items()
            if error.code == ErrorCode.NODE_UNAVAILABLE}


def superlink_failures(replies: list[Message], sent: list[Message]) -> dict[int, str]:
    """Node -> why, for the messages the SuperLink itself failed (any notice of its own but
    "node unavailable": its database locked, a reply's objects lost): the SuperLink's fault,
    neither the node's nor lateness."""
    return {node: "the SuperLink failed: " + error_reason(error).removeprefix("error reply: ")
            for node, error in superlink_notices(replies, sent).items()
            if error.code != ErrorCode.NODE_UNAVAILABLE}
