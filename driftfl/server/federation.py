"""The federation a run trains across: Flower's simulation or a real deployment.

What differs between the two lives here and nowhere else:

- **meeting the clients**: a simulation's server assigns the partitions itself (simulated.py);
  a deployed node says what it holds (the data survey, survey.py), bound by an owners file if
  the experiment names one;
- **the grid the strategy talks through** (metered: every byte counted); in simulation every
  message names its node's partition;
- **which nodes a round may use**: all of them in simulation, where nodes are never lost; in
  deployment the roster's (roster.py): nodes lost and coming back, newcomers surveyed, the run
  stopped below min_clients;
- **which silent nodes were lost and which are late**: the strategy names the nodes that sent
  nothing back (and those the SuperLink reported unavailable); a deployed node no longer
  connected is lost too;
- **whether nodes claim their example counts** (deployment: a reply's weight is capped).

The strategy sees only the grid (Flower's interface): its ``get_node_ids`` are the round's
nodes, so no strategy code asks who is connected or waits for anyone.
"""

from __future__ import annotations

import math
import sys
from logging import WARNING
from pathlib import Path

from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from driftfl.common.errors import ConfigError
from driftfl.common.owners import read_owners, undeclared_counts

from . import checkpoint
from .nodes import wait_for_nodes
from .progress import GatheringGrid
from .roster import Roster
from .simulated import AssigningGrid, assign_partitions, registration_order, warm_up
from .survey import survey_clients
from .traffic import MeteredGrid

SIMULATION_NODES_GRACE = 5.0  # seconds: the engine registers its nodes just after starting


class RoundGrid:
    """The grid a strategy sees: the metered grid, whose ``get_node_ids`` are this round's
    nodes once the federation has set them (``nodes``)."""

    def __init__(self, grid: MeteredGrid):
        self.metered = grid
        self.nodes: list[int] | None = None

    def __getattr__(self, name):
        return getattr(self.metered, name)

    def get_node_ids(self):
        return list(self.nodes) if self.nodes is not None else self.metered.get_node_ids()


class Federation:
    """What a simulated and a deployed federation share."""

    claims_counts = False  # nodes claim their example counts (their weights are capped)
    startup = "loading the data, meeting the clients"  # what a run's start-up is spent on

    def __init__(self, grid: Grid, cfg):
        self.raw, self.cfg = grid, cfg
        self.grid: RoundGrid | None = None  # made when the clients are met

    @staticmethod
    def of(grid: Grid, cfg) -> Federation:
        """Flower's simulation runs the ServerApp in its own process over an InMemoryGrid;
        any other grid reaches deployed nodes."""
        # only a simulation has loaded Flower's in-memory grid: a deployed ServerApp does not
        # import it (SQLAlchemy and Alembic with it, about 1.5 s of its start-up)
        simulated = sys.modules.get("flwr.superlink.grid.inmemory_grid")
        if simulated is not None and isinstance(grid, simulated.InMemoryGrid):
            return SimulatedFederation(grid, cfg)
        return DeployedFederation(grid, cfg)

    def meet(self, experiment_record: ConfigRecord, histograms) -> list[dict]:
        """The clients: each one's node_id, partition_id, num_examples, label_histogram."""
        raise NotImplementedError

    def start(self, clients: list[dict], run_dir: Path, experiment_record: ConfigRecord,
              on_change) -> None:
        """Before the first round, the end of the run's start-up: ``on_change(clients,
        moved)`` when clients rejoin."""

    def record_moves(self, recorder, clients: list[dict], moved: dict[int, int]) -> None:
        """A resumed run found clients under other node ids than its checkpoint's."""

    def begin_round(self, server_round: int) -> None:
        """Set the nodes this round may use (the grid's ``get_node_ids``)."""

    def settle(self, strategy) -> None:
        """After a round's training: which of the nodes that sent nothing back were lost (the
        SuperLink reported them unavailable, or they are no longer connected) and which are
        late; one line each."""
        report = strategy.report
        gone = set(report.lost_nodes) | self.disconnected(report.silent)
        report.lost_nodes = [n for n in report.silent if n in gone]
        report.lost = [strategy.clients.name(n) for n in report.lost_nodes]
        report.late = [strategy.clients.name(n) for n in report.silent if n not in gone]
        for node in report.silent:
            log(WARNING, "round reply from %s %s", strategy.clients.describe(node),
                "lost: the node disconnected" if node in gone else
                f"late: none within round_timeout={self.cfg.round_timeout:g} s, the node is "
                "still connected")

    def disconnected(self, nodes: list[int]) -> set[int]:
        """Of ``nodes``, those no longer connected (simulated nodes never leave)."""
        return set()

    def connected_count(self) -> int | None:
        """How many clients are connected at the end (None: not known, all of them)."""
        return None


class SimulatedFederation(Federation):
    """Flower's simulation: every node is the experimenter's; the server assigns partitions."""

    startup = "the SuperLink, Ray, loading the data, the clients' first message"

    def __init__(self, grid: Grid, cfg):
        super().__init__(grid, cfg)
        if cfg.owners is not None:
            raise ConfigError("owners= binds deployed nodes to partitions; a simulation assigns "
                              "them itself: leave owners out")
        try:  # the engine registers them just after starting the ServerApp: a moment's grace
            self.nodes = wait_for_nodes(grid, cfg.num_clients, timeout=SIMULATION_NODES_GRACE,
                                        every=math.inf)
        except ConfigError:
            have = len(list(grid.get_node_ids()))
            raise ConfigError(
                f"this simulation has {have} SuperNodes but num_clients={cfg.num_clients}; give "
                f"flwr run --federation-config \"num_supernodes={cfg.num_clients}\" (or set "
                f"num_clients={have})") from None

    def meet(self, experiment_record, histograms):
        clients = assign_partitions(registration_order(self.raw, self.nodes),
                                    self.cfg.num_clients, histograms)
        self.assigning = AssigningGrid(self.raw, clients)
        self.grid = RoundGrid(MeteredGrid(self.assigning))
        return clients

    def start(self, clients, run_dir, experiment_record, on_change):
        print("driftfl: the clients start (Ray's workers import the ClientApp and load their "
              "data)", flush=True)
        warm_up(self.assigning, clients, experiment_record, self.cfg)  # not metered: no round's


class DeployedFederation(Federation):
    """Real SuperNodes: each reads only its operator's data and says what it holds; nodes are
    lost and come back."""

    claims_counts = True
    startup = "loading the data, waiting for the nodes, the data survey"

    def __init__(self, grid: Grid, cfg):
        super().__init__(grid, cfg)
        # the owners file (read on the SuperLink's machine), checked before anything runs
        self.owners = (read_owners(Path(cfg.owners), cfg.num_clients)
                       if cfg.owners is not None else None)
        # nodes claim their counts in the survey: say what one that lies gets, where it can
        if says := undeclared_counts(self.owners, cfg.num_clients, cfg.max_examples_ratio):
            log(WARNING, says)
        # Flower's own grid waits for replies with a progress line (a test's grid as it is)
        own = type(grid).__module__.startswith("flwr.")
        self.grid = RoundGrid(MeteredGrid(GatheringGrid(grid) if own else grid))
        self.roster = None
        self.lost: list[int] = []  # the last round's lost nodes: the roster waits for them

    def meet(self, experiment_record, histograms):
        return survey_clients(self.grid, experiment_record, self.cfg.num_clients,
                              self.cfg.node_wait, self.cfg.round_timeout, self.owners)

    def start(self, clients, run_dir, experiment_record, on_change):
        print(f"driftfl: each round is saved in {run_dir / checkpoint.CHECKPOINT}; should the "
              f"run stop, go on with resume={run_dir} (driftfl run superlink=...) or "
              "resume=true in the same run config (flwr run)", flush=True)
        cfg = self.cfg
        self.roster = Roster(self.grid.metered, experiment_record, clients,
                             num_partitions=cfg.num_clients, min_clients=cfg.min_clients,
                             rejoin_wait=cfg.rejoin_wait, timeout=cfg.round_timeout,
                             on_change=on_change, owners=self.owners)

    def record_moves(self, recorder, clients, moved):
        if moved:  # (simulated node ids are new every run: nothing to record there)
            recorder.clients_moved(clients, moved)

    def begin_round(self, server_round):
        self.grid.nodes = None
        self.grid.nodes = self.roster.nodes(server_round, self.lost)

    def settle(self, strategy):
        super().settle(strategy)
        self.lost = list(strategy.report.lost_nodes)

    def disconnected(self, nodes):
        connected = set(self.grid.metered.get_node_ids())
        return {n for n in nodes if n not in connected}

    def connected_count(self):
        return self.roster.connected_count() if self.roster else None
