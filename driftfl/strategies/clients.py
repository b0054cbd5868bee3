"""The clients a strategy knows: what the data survey found of each node, which nodes train in
a round, and how nodes are named and ordered everywhere (logs, sums, the round plan's draws).
A mixin of ``DriftStrategy``, whose constructor sets the state it reads: ``node_rank``,
``surveyed``, ``histograms``, ``selection`` and ``aggregation``."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from .selection import ExploredClients


class KnownClients:
    """Meeting the clients, sampling them, naming and ordering them."""

    def meet(self, clients: list[dict]) -> None:
        """What the data survey found, before the first round: each client's node_id,
        partition_id, num_examples and label_histogram."""
        self.node_rank = {c["node_id"]: c["partition_id"] for c in clients}
        self.surveyed = {c["node_id"]: c["num_examples"] for c in clients}
        # a survey always has one; unit tests' hand-made clients may not (then: not checked)
        self.histograms = {c["node_id"]: np.asarray(c["label_histogram"]) for c in clients
                           if "label_histogram" in c}
        self.aggregation.meet(clients)

    def rejoin(self, clients: list[dict], moved: dict[int, int]) -> None:
        """Clients came back under new node ids (old -> new): meet them all again."""
        self.meet(clients)
        self.rekey(moved)

    def rekey(self, moved: dict[int, int]) -> None:
        """State kept by node id follows its client to a new node id (old -> new): a restarted
        SuperNode, a resumed run. FedAvg keeps none."""

    # -- which clients train -------------------------------------------------------------
    def sample(self, server_round: int, grid: Grid) -> list[int]:
        """floor(fraction * nodes) clients (at least min_train_nodes), chosen by the selection
        among the surveyed nodes (a node the survey refused never trains)."""
        nodes = self.available(server_round, grid)
        return self.selection.select(server_round, nodes, self.train_count(len(nodes)),
                                     self.explored_clients())

    def available(self, server_round: int, grid: Grid) -> list[int]:
        """The surveyed nodes the grid offers this round (the federation sets them: in
        deployment the roster's connected clients), in rank order."""
        return sorted(filter(self.usable, grid.get_node_ids()), key=self.rank)

    def train_count(self, available: int) -> int:
        count = max(self.min_train_nodes, math.floor(available * self.fraction_train + 1e-9))
        return min(count, available)

    def explored_clients(self) -> ExploredClients | None:
        """What the strategy knows of the clients, for a selection that needs it (DCFL)."""
        return None

    def usable(self, node: int) -> bool:
        """Whether the data survey accepted this node (every node before a survey)."""
        return self.surveyed is None or node in self.surveyed

    def client_name(self, node: int) -> str:
        """A client as logs and the run directory name it: its partition id, or for a node
        with its own data (no partition) its node id."""
        partition = self.node_rank.get(node, -1)
        return str(partition) if partition >= 0 else f"node{node}"

    def survey_count(self, node: int) -> float:
        """The examples the data survey found on this node: the most a reply may claim
        (unbounded before a survey, in unit tests; 0 for a node the survey refused)."""
        return math.inf if self.surveyed is None else self.surveyed.get(node, 0)

    def describe(self, node: int) -> str:
        partition = self.node_rank.get(node, -1)
        return f"partition {partition} (node {node})" if partition >= 0 else f"node {node}"

    def rank(self, node: int) -> tuple[float, int]:
        """A node's place in every ordering: its partition id, then its node id."""
        return self.node_rank.get(node, math.inf), node

    def in_node_order(self, replies: Iterable[Message]) -> list[Message]:
        """Replies sorted by node, not by arrival: sums in floating point depend on the order,
        and arrival order would make runs with the same seed differ."""
        return sorted(replies, key=lambda msg: self.rank(msg.metadata.src_node_id))

    def plan_key(self, node: int) -> int:
        """The node's key in the round plan's draws: its partition id (a node with its own
        data, which has none: its node id)."""
        partition = self.node_rank.get(node, -1)
        return partition if partition >= 0 else node % 2**31
