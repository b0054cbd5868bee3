"""Count the bytes that cross the wire, whatever the strategy sends or receives."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid


def payload_bytes(msg: Message) -> int:
    """Bytes of a message's records (arrays, configs, metrics); 0 for an error reply."""
    if not msg.has_content():
        return 0
    content = msg.content
    return sum(r.count_bytes() for group in (content.array_records, content.config_records,
                                             content.metric_records) for r in group.values())


class MeteredGrid:
    """A Grid that tallies payload bytes sent and received; everything else passes through."""

    def __init__(self, grid: Grid):
        self._grid = grid
        self.sent = 0
        self.received = 0

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *args, **kwargs) -> Iterable[Message]:
        messages = list(messages)
        self.sent += sum(payload_bytes(m) for m in messages)
        replies = list(self._grid.send_and_receive(messages, *args, **kwargs))
        self.received += sum(payload_bytes(r) for r in replies)
        return replies

    def take(self) -> tuple[int, int]:
        """Bytes (sent, received) since the last call."""
        counts = (self.sent, self.received)
        self.sent = self.received = 0
        return counts
