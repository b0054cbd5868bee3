"""Deployment's clients round by round: nodes are lost and come back.

A SuperNode that dies mid-round becomes an error reply (Flower waits two missed heartbeats),
and the round finishes with the others. Before each later round the roster

- surveys every node that connected since (a restarted SuperNode gets a new node id, unless
  node authentication ties its id to its key): one that claims the partition of a client no
  longer connected takes its place, one that claims a partition a connected node holds is
  refused (with an owners file, a node may only ever take its own key's partition); a client
  whose node id is connected again is back;
- waits up to ``rejoin_wait`` seconds, once per loss, for missing clients to come back;
- goes on with the clients that are connected, or stops the run with one line when fewer than
  ``min_clients`` are.

Simulation has no roster: its nodes are never lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from driftfl.common.errors import ConfigError
from driftfl.common.owners import Owner

from .survey import OWN_DATA, admit, ask_summaries


class Roster:
    """The surveyed clients, and which of them are connected now."""

    def __init__(self, grid: Grid, experiment_record: ConfigRecord, clients: list[dict], *,
                 num_partitions: int, min_clients: int, rejoin_wait: float, timeout: float,
                 on_change: Callable[[list[dict], dict[int, int]], None], poll: float = 1.0,
                 owners: dict[int, Owner] | None = None):
        self.grid, self.record = grid, experiment_record
        self.clients = list(clients)  # one per partition (own-data nodes: one each)
        self.known = {c["node_id"] for c in clients}  # every node surveyed, refused ones too
        self.num_partitions, self.min_clients = num_partitions, min_clients
        self.rejoin_wait, self.timeout, self.poll = rejoin_wait, timeout, poll
        self.on_change = on_change  # the strategy meets them again: (clients, old -> new node)
        self.owners = owners  # node id -> its key's partition (the owners file); None: none
        self.waited: set[str] = set()  # missing clients already waited for once
        self.missing: list[str] = []  # as the last call found them

    def nodes(self, server_round: int, lost: list[int] = ()) -> list[int]:
        """The node ids of the clients connected now, after surveying newcomers; stops the run
        (ConfigError) when fewer than ``min_clients`` are connected. ``lost``: the nodes whose
        reply the last round lost (one that is connected again is back)."""
        gone = {c["node_id"] for c in self.clients
                if name(c) in self.missing or c["node_id"] in lost}
        deadline = time.monotonic() + self.rejoin_wait
        while True:
            connected = set(self.grid.get_node_ids())
            self.meet_newcomers(connected - self.known, connected)
            missing = [name(c) for c in self.clients if c["node_id"] not in connected]
            if not set(missing) - self.waited or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        if set(missing) - self.waited:
            print(f"round {server_round}: {describe(missing)} did not come back within "
                  f"rejoin_wait={self.rejoin_wait:g} s", flush=True)
        self.waited = set(missing)  # a client that is back may be waited for again later
        present = [c["node_id"] for c in self.clients if c["node_id"] in connected]
        if len(present) < self.min_clients:
            raise ConfigError(
                f"round {server_round}: only {len(present)} of {len(self.clients)} clients are "
                f"connected ({describe(missing)} lost), fewer than min_clients="
                f"{self.min_clients}; restart their SuperNodes, or lower min_clients")
        for back in [c for c in self.clients if c["node_id"] in gone and name(c) not in missing]:
            # the same node id again (an authenticated node restarted with its key); one that
            # came back with a new id rejoined above
            print(f"round {server_round}: {name(back)} is back (node {back['node_id']})",
                  flush=True)
        if missing and set(missing) != set(self.missing):  # once per change, not per call
            print(f"round {server_round}: going on with {len(present)} of {len(self.clients)} "
                  f"clients; {describe(missing)} missing", flush=True)
        self.missing = missing
        return present

    def connected_count(self) -> int:
        """How many of the clients are connected now."""
        connected = set(self.grid.get_node_ids())
        return sum(c["node_id"] in connected for c in self.clients)

    def meet_newcomers(self, newcomers: set[int], connected: set[int]) -> None:
        """Survey nodes never seen; one may take the partition of a client that is gone."""
        if not newcomers:
            return
        self.known |= newcomers
        replies = ask_summaries(self.grid, self.record, sorted(newcomers), self.timeout)
        held = {c["partition_id"]: c["node_id"] for c in self.clients
                if c["partition_id"] != OWN_DATA and c["node_id"] in connected}
        joined = admit(replies, self.record, self.num_partitions, claimed=held,
                       owners=self.owners)
        if not joined:
            return
        moved = {}
        for client in joined:
            old = [c for c in self.clients if client["partition_id"] != OWN_DATA
                   and c["partition_id"] == client["partition_id"]]
            self.clients = [c for c in self.clients if c not in old] + [client]
            moved.update({c["node_id"]: client["node_id"] for c in old})
            print(f"{name(client)} {'rejoined' if old else 'joined'} as node "
                  f"{client['node_id']}", flush=True)
        self.clients.sort(key=lambda c: (c["partition_id"], c["node_id"]))
        self.on_change(self.clients, moved)


def name(client: dict) -> str:
    partition = client["partition_id"]
    return f"partition {partition}" if partition != OWN_DATA else f"node {client['node_id']}"


def describe(names: list[str]) -> str:
    return ", ".join(names) if names else "no client"
