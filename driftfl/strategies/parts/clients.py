"""The clients a strategy knows: what the data survey found of each node, and how nodes are
named and ordered everywhere (logs, sums, the round plan's draws). A part of every strategy
(``DriftStrategy.clients``); its state is the survey's, kept in checkpoints."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from flwr.app import Message


class KnownClients:
    """The surveyed clients: node id -> partition id, example count, label histogram."""

    def __init__(self) -> None:
        self.node_rank: dict[int, int] = {}  # node id -> partition id (data survey)
        self.surveyed: dict[int, int] | None = None  # node id -> num_examples (data survey)
        self.histograms: dict[int, np.ndarray] = {}  # node id -> label histogram (data survey)
        # clients excluded for repeated rejected replies (ReplyGuard.count_offences), by name:
        # a name stays with its partition when a node comes back under a new id
        self.excluded: list[str] = []

    def meet(self, clients: list[dict]) -> None:
        """What the data survey found, before the first round: each client's node_id,
        partition_id, num_examples and label_histogram."""
        self.node_rank = {c["node_id"]: c["partition_id"] for c in clients}
        self.surveyed = {c["node_id"]: c["num_examples"] for c in clients}
        # a survey always has one; unit tests' hand-made clients may not (then: not checked)
        self.histograms = {c["node_id"]: np.asarray(c["label_histogram"]) for c in clients
                           if "label_histogram" in c}

    def usable(self, node: int) -> bool:
        """Whether the data survey accepted this node (every node before a survey) and it was
        not excluded since."""
        return ((self.surveyed is None or node in self.surveyed)
                and self.name(node) not in self.excluded)

    def exclude(self, node: int) -> bool:
        """Exclude this node's client from the rest of the run (False: it already was)."""
        if self.name(node) in self.excluded:
            return False
        self.excluded.append(self.name(node))
        return True

    def nodes(self) -> list[int]:
        """Every node the survey accepted, in rank order."""
        return sorted(self.surveyed or [], key=self.rank)

    def name(self, node: int) -> str:
        """A client as logs and the run directory name it: its partition id, or for a node
        with its own data (no partition) its node id."""
        partition = self.node_rank.get(node, -1)
        return str(partition) if partition >= 0 else f"node{node}"

    def count(self, node: int) -> float:
        """The examples the data survey found on this node: the most a reply may claim
        (unbounded before a survey, in unit tests; 0 for a node the survey refused)."""
        return math.inf if self.surveyed is None else self.surveyed.get(node, 0)

    def describe(self, node: int) -> str:
        partition = self.node_rank.get(node, -1)
        return f"partition {partition} (node {node})" if partition >= 0 else f"node {node}"

    def rank(self, node: int) -> tuple[float, int]:
        """A node's place in every ordering: its partition id, then its node id."""
        return self.node_rank.get(node, math.inf), node

    def in_order(self, replies: Iterable[Message]) -> list[Message]:
        """Replies sorted by node, not by arrival: sums in floating point depend on the order,
        and arrival order would make runs with the same seed differ."""
        return sorted(replies, key=lambda msg: self.rank(msg.metadata.src_node_id))

    def key(self, node: int) -> int:
        """The node's key in the round plan's draws: its partition id (a node with its own
        data, which has none: its node id)."""
        partition = self.node_rank.get(node, -1)
        return partition if partition >= 0 else node % 2**31
