"""Simulation without a data survey: the server tells each simulated node its partition.

Flower's simulation gives its nodes random ids, and asking 10,000 of them which partition they
hold took minutes (Flower's engine polls every node for every message it delivers). In
simulation every node is the experimenter's own, so the server assigns the partitions itself:
the i-th node Flower registered holds partition i (the partition-id Flower's own node config
gives it), each client's label histogram comes from the partitioning, and every message a node
receives names its partition (``ASSIGNED_PARTITION``, added per message here, so that
strategies build their messages as in deployment and the byte counts stay those of deployment).
A node heeds the key only when it runs in Flower's simulation engine, a fact of its own process
(``driftfl.client.node.in_simulation``); a deployed node reads what its operator named and
ignores it.

Registration order matters for speed: Flower's engine queues a round's messages for its actors
in the order it registered the nodes, so partition i's message is queued i-th, as every run of
the experiment (and benchmarks/overhead.py's floor) hands them out. Assigned by node id, the
random ids put the partitions in a new random order every run, and a large partition queued last
kept one actor busy while the other idled: 5 % on a median run of 10 unequal clients on 2 actors,
16 % at worst (benchmarks/serving_order.py, docs/benchmarks.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from driftfl.common.protocol import ASSIGNED_PARTITION, CONFIG, NUM_PARTITIONS

from .progress import gather, step_of

# the pause between looks for replies: 1 ms per awaited reply, within 5 ms and Flower's 0.1 s
PULL_SECONDS_PER_REPLY = 0.001
PULL_SECONDS = (0.005, 0.1)


def registration_order(grid: Grid, nodes: Iterable[int]) -> list[int]:
    """``nodes`` in the order Flower registered them (its NodeInfo's ``registered_at``, the
    node id breaking a tie or standing in where a grid does not say)."""
    def moment(stamp: str) -> datetime:  # Flower's stamps are in UTC
        return datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc)

    registered = {info.node_id: moment(info.registered_at)
                  for info in grid.get_nodes() if info.registered_at}
    unknown = datetime.max.replace(tzinfo=timezone.utc)
    return sorted(nodes, key=lambda node: (registered.get(node, unknown), node))


def assign_partitions(nodes: Iterable[int], num_clients: int,
                      histograms: Callable[[], list[list[int]]]) -> list[dict]:
    """The clients as the data survey would report them: the i-th of ``nodes`` (in
    registration order) holds partition i."""
    chosen = list(nodes)[:num_clients]
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

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages([self.stamp(m) for m in messages])

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        """Flower's InMemoryGrid.send_and_receive, looking for the replies more often when few
        are awaited (``pause``), with a progress line while a round waits long."""
        messages = list(messages)
        return gather(self, set(self.push_messages(messages)), timeout, self.pause,
                      step_of(messages))

    @staticmethod
    def pause(awaited: int) -> float:
        """Seconds to the next look for replies: Flower's look every 0.1 s cost each exchange
        50 ms on average, most of a round whose clients answer in milliseconds, while a look
        costs microseconds per awaited reply."""
        return min(max(PULL_SECONDS_PER_REPLY * awaited, PULL_SECONDS[0]), PULL_SECONDS[1])

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


def warm_up(grid: AssigningGrid, clients: list[dict], experiment_record: ConfigRecord,
            cfg) -> None:
    """Before round 1, one query (the data survey's) to as many nodes as run at once, so that
    Ray's workers start, import the ClientApp and load their data now, in the run's start-up,
    and round 1 trains as every later round does. Their replies tell the server nothing it
    does not know; a node that cannot answer fails in round 1 as it would have."""
    from .survey import ask_summaries

    at_once = max(1, (os.cpu_count() or 1) // cfg.simulation.client_cpus)  # Ray's actors here
    ask_summaries(grid, experiment_record, [c["node_id"] for c in clients[:at_once]],
                  cfg.round_timeout)
