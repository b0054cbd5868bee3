"""Count the bytes that cross the wire, whatever the strategy sends or receives: in all, and
by payload kind, the record of a message that holds them (every message counts: train,
evaluate and the queries of the data survey, FedCSD's prototype phase and DCFL's
pre-training)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from flwr.app import ConfigRecord, Message, MessageType
from flwr.serverapp import Grid

from driftfl.common.columns import BYTES_DOWN, BYTES_UP, SURVEY, column
from driftfl.common.protocol import (ARRAYS, CLASS_PHI, CLASSIFIER, CONDENSED, CONFIG, CONTROL,
                                     CONTROL_DELTA, CREDIBILITY, DATA_SUMMARY, FEATURE_PROTOTYPES,
                                     FISHER, FISHER_PENALTY, METRICS, PROTOTYPES, TEACHER)

# the records the protocol names, each its own payload kind; a record of any other name counts
# as OTHER, so that no client can add columns to the round's row by naming records
KINDS = frozenset({ARRAYS, CONFIG, METRICS, TEACHER, PROTOTYPES, CREDIBILITY, CLASS_PHI,
                   FISHER_PENALTY, FISHER, FEATURE_PROTOTYPES, CONTROL, CONTROL_DELTA, CONDENSED,
                   CLASSIFIER})
OTHER = "other"
# the data survey's records are one kind (the experiment out; partition, example count and
# label histogram back): round 0's row, or the row of the round a node rejoined in
QUERY_KINDS = {f"{MessageType.QUERY}.{DATA_SUMMARY}": SURVEY}


def payload_kind(message_type: str, record: str) -> str:
    """The column-safe kind (feature-prototypes -> feature_prototypes) of a message's record."""
    if message_type in QUERY_KINDS:
        return QUERY_KINDS[message_type]
    return column(record) if record in KINDS else OTHER


def count_bytes(record) -> int:
    """Flower's count_bytes of a record; it fails on an empty list or text in a ConfigRecord
    (SecAgg+'s unmask stage sends an empty list of dropped nodes), which count as their keys."""
    try:
        return record.count_bytes()
    except (IndexError, ValueError):
        if not isinstance(record, ConfigRecord):
            raise
        full = {k: v for k, v in record.items()
                if not (isinstance(v, (list, str, bytes)) and len(v) == 0)}
        return ConfigRecord(full).count_bytes() + sum(len(k) for k in record if k not in full)


def record_bytes(msg: Message) -> Counter[str]:
    """Bytes of a message's records by payload kind (Flower's count_bytes); none for an error
    reply."""
    tally: Counter[str] = Counter()
    if msg.has_content():
        for name, record in msg.content.items():
            tally[payload_kind(msg.metadata.message_type, name)] += count_bytes(record)
    return tally


def payload_bytes(msg: Message) -> int:
    """Bytes of all of a message's records (arrays, configs, metrics); 0 for an error reply."""
    return sum(record_bytes(msg).values())


class MeteredGrid:
    """A Grid that tallies payload bytes sent and received, by kind; everything else passes
    through."""

    def __init__(self, grid: Grid):
        self._grid = grid
        self.sent: Counter[str] = Counter()  # by kind
        self.received: Counter[str] = Counter()

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *args, **kwargs) -> Iterable[Message]:
        messages = list(messages)
        for msg in messages:
            self.sent.update(record_bytes(msg))
        replies = list(self._grid.send_and_receive(messages, *args, **kwargs))
        for reply in replies:
            self.received.update(record_bytes(reply))
        return replies

    def take(self) -> dict[str, int]:
        """The round's byte columns since the last call: bytes_sent and bytes_received in
        all, then bytes_down_<kind> and bytes_up_<kind> for each kind that crossed."""
        counts = {"bytes_sent": sum(self.sent.values()),
                  "bytes_received": sum(self.received.values()),
                  **{BYTES_DOWN + kind: n for kind, n in sorted(self.sent.items())},
                  **{BYTES_UP + kind: n for kind, n in sorted(self.received.items())}}
        self.sent, self.received = Counter(), Counter()
        return counts
