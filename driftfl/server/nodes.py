"""Waiting for a federation's nodes to connect."""

from __future__ import annotations

import math
import time
from logging import WARNING

from flwr.serverapp import Grid
from flwr.supercore import log

from driftfl.common.errors import ConfigError


def wait_for_nodes(grid: Grid, minimum: int, timeout: float = math.inf,
                   every: float = 10.0) -> list[int]:
    """The connected nodes, once at least ``minimum`` are there (deployment nodes join late)."""
    started = last = time.monotonic()
    while len(nodes := list(grid.get_node_ids())) < minimum:
        waited = time.monotonic() - started
        if waited > timeout:
            raise ConfigError(
                f"only {len(nodes)} of num_clients={minimum} nodes connected in {timeout:.0f} s; "
                "in simulation pass --federation-config \"num_supernodes=<num_clients>\" to flwr "
                "run, in deployment start more SuperNodes (or lower num_clients)")
        if time.monotonic() - last > every:
            log(WARNING, "waiting for nodes: %d of num_clients=%d connected after %.0f s",
                len(nodes), minimum, waited)
            last = time.monotonic()
        time.sleep(0.5)
    return nodes
