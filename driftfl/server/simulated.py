"""Simulation without a data survey: the server tells each simulated node its partition.

Flower's simulation gives its nodes random ids, and asking 10,000 of them which partition they
hold took minutes (Flower's engine polls every node for every message it delivers). In
simulation every node is the experimenter's own, so the server assigns the partitions itself:
the i-th smallest node id holds partition i, each client's label histogram comes from the
partitioning, and every message a node receives names its partition (``ASSIGNED_PARTITION``,
added per message here, so that strategies build their messages as in deployment and the byte
counts stay those of deployment). A node heeds the key only when it runs in Flower's simulation
engine, a fact of its own process (``driftfl.client.node.in_simulation``); a deployed node reads
what its operator named and ignores it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from driftfl.common.protocol import ASSIGNED_PARTITION, CONFIG, NUM_PARTITIONS


def assign_partitions(nodes: Iterable[int], num_clients: int,
                      histograms: Callable[[], list[list[int]]]) -> list[dict]:
    """The clients as the data survey would report them: node i (by id) holds partition i."""
    chosen = sorted(nodes)[:num_clients]
    return [{"node_id": node, "partition_id": i, "num_examples": sum(histogram),
             "label_histogram": histogram}
            for i, (node, histogram) in enumerate(zip(chosen, histograms()))]


class AssigningGrid:
    """A Grid that adds each destination's partition to the config of every message."""

    def __init__(self, grid: Grid, clients: list[dict]):
        self._grid = grid
        self.partition_of = {c["node_id"]: c["partition_id"] for c in clients}
        self.num_partitions = len(clients)

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *args, **kwargs) -> Iterable[Message]:
        return self._grid.send_and_receive([self.stamp(m) for m in messages], *args, **kwargs)

    def stamp(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        if node not in self.partition_of or CONFIG not in msg.content.config_records:
            return msg
        config = ConfigRecord(dict(msg.content.config_records[CONFIG]))  # messages share one
        config[ASSIGNED_PARTITION] = self.partition_of[node]
        config[NUM_PARTITIONS] = self.num_partitions
        content = RecordDict({**msg.content, CONFIG: config})
        return Message(content, dst_node_id=node, message_type=msg.metadata.message_type,
                       ttl=msg.metadata.ttl, group_id=msg.metadata.group_id)
