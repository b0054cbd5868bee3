"""The round, as every driftfl strategy runs it, and how a strategy is built from config.

A round is a pipeline of parts, each chosen once from config and held by the strategy:

    plan      round_plan.RoundPlan: what each node is asked (heterogeneity, per-client eval)
    select    the ``selection`` part among the round's nodes (the federation's grid offers
              them), or the release's secret sample (central DP)
    send      ``configure_train``: the global model, the method's knowledge, each assignment
    receive   the grid (or SecAgg+'s protocol: driftfl.server.secure hands a SecureSum over)
    guard     check_reply, the survey's counts, the step count, the method's payload checks,
              the release's own; screens against the round's peers where the release allows
              them; repeat offenders excluded (``guard``: guard.ReplyGuard)
    bound     where clients are not trusted, each reply's model within the round's honest
              spread (``aggregation.bound_updates``: bounded.BoundedAggregation)
    release   ``release`` (release/): plain, secure sum, central or distributed DP
    aggregate the ``aggregation`` part, and the aggregate's own check
    update    the method's state update: its ``aggregate_train`` override, after super()

A method is hooks on this class and never reads which release or federation it runs under:
what it sends (``knowledge``, ``node_knowledge``, ``before_train``), its summed payload
(``payload_record``, ``payload()``) and the checks of it (``check_payload``, ``screen``), and its
state update. The parts it calls: ``clients`` (who the survey found, how nodes are named and
ordered), ``guard`` (peer screens, state bounds, weight caps) and ``evaluation`` (federated
evaluation).

A strategy takes its settings as constructor arguments, as Flower's own do; ``from_config``
builds any of them from a checked experiment. Flower's FedProx and FedAvgM are reused by
inheriting from them *and* from this class: their ``configure_train``/``aggregate_train`` call
``super()``, which the MRO routes here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log
from torch import nn

from driftfl.common.config import ExperimentConfig
from driftfl.common.protocol import (
    ARRAYS,
    CONFIG,
    LOCAL_STEPS,
    METHOD,
    SERVER_ROUND,
    SUMMED_ARRAYS,
    SUMMED_PAYLOAD,
)
from driftfl.common.settings import StrategySettings
from driftfl.common.training import TrainSettings
from driftfl.specs import MethodSpec, declare_method, variants_of
from driftfl.strategies.parts import AGGREGATIONS, SELECTIONS
from driftfl.strategies.parts.aggregation import (
    Aggregation,
    ClientUpdate,
    apply_update,
    check_reply,
    example_weights,
    mean_metrics,
    norm_bound,
    to_numpy,
    to_record,
    update_norm,
)
from driftfl.strategies.parts.bounded import bounded_for
from driftfl.strategies.parts.clients import KnownClients
from driftfl.strategies.parts.federated_evaluation import FederatedEvaluation
from driftfl.strategies.parts.guard import ReplyGuard
from driftfl.strategies.parts.release import Release, Released, RoundFacts, SecureSum, build_release
from driftfl.strategies.parts.round_plan import RoundPlan
from driftfl.strategies.parts.selection import ExploredClients, Selection
from driftfl.strategies.registry import Method, register
from driftfl.strategies.round_report import RoundReport, lost_to_superlink, superlink_failures

if TYPE_CHECKING:
    from driftfl.strategies.parts.aux_set import AuxSet


class DriftStrategy(FedAvg):
    """Flower's FedAvg message flow with driftfl's round (above) and parts."""

    # what the method declares (driftfl.specs: checked before torch or Flower loads), copied
    # onto the class: the name ``strategy=`` takes, the objective its clients run unless
    # strategy.objective says otherwise and whether the server's update holds only with it,
    # its settings, what it sends, and what the release cannot cover (MethodSpec). A method
    # of one's own may instead set these on its class (docs/adding-a-method.md), and
    # ``variants``: other methods that are this server with another objective, by name.
    spec: ClassVar[MethodSpec | None] = None
    method: ClassVar[str] = ""
    default_objective: ClassVar[str] = "ce"
    objective_fixed: ClassVar[bool] = False
    variants: ClassVar[dict[str, str]] = {}
    Settings: ClassVar[type[StrategySettings]] = StrategySettings
    provides: ClassVar[frozenset[str]] = frozenset()  # records and config keys sent to clients
    # the row columns ``server_metrics`` may write: a client metric of the same name is left
    # out of the row, in rounds where the strategy measures nothing too
    server_columns: ClassVar[frozenset[str]] = frozenset()
    # those of them that record the clients' own figures, which clients may send (DCFL's)
    client_figures: ClassVar[frozenset[str]] = frozenset()
    unprotected: ClassVar[str] = ""
    # a payload the method takes as a sum over its clients, which privacy and secure
    # aggregation cover beside the update (SCAFFOLD's Delta c_k): the reply record holding each
    # client's term ("": none), what it is in words, and privacy.payload_clip's default for it
    payload_record: ClassVar[str] = ""
    payload_words: ClassVar[str] = ""
    payload_clip: ClassVar[float] = 1.0
    step_budget: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        on_class = spec is None and "method" in cls.__dict__  # declared on its class alone
        if on_class:
            spec = MethodSpec(cls.method, cls.Settings, cls.default_objective,
                              cls.objective_fixed, cls.provides, cls.unprotected,
                              cls.protection_problem, cls.payload_record, cls.payload_clip,
                              cls.step_budget)
        if spec is None:
            return
        # the classes' registry first: a name another class holds stops here, before the
        # declaration would replace that class's
        register(spec.name, Method(cls, spec.objective, spec.objective_fixed))
        if on_class:
            declare_method(spec, cls.__dict__.get("variants", {}))
        cls.spec, cls.method, cls.Settings, cls.provides = (spec, spec.name, spec.Settings,
                                                            spec.provides)
        cls.default_objective, cls.objective_fixed = spec.objective, spec.objective_fixed
        cls.unprotected, cls.step_budget = spec.unprotected, spec.step_budget
        cls.payload_record, cls.payload_clip = spec.payload_record, spec.payload_clip
        cls.variants = variants_of(spec.name)
        for name, objective in cls.variants.items():
            register(name, Method(cls, objective))

    def __init__(self, *, selection: Selection | None = None,
                 aggregation: Aggregation | None = None, objective: str = "ce",
                 round_timeout: float = 3600.0, max_update_ratio: float = 10.0,
                 max_peer_ratio: float = 30.0, local_training: TrainSettings | None = None,
                 max_examples_ratio: float = math.inf, exclude_after: int = 0,
                 **kwargs) -> None:
        super().__init__(**kwargs)  # Flower's own settings (fraction_train, ...)
        self.assemble(selection, aggregation, objective, round_timeout, max_update_ratio,
                      max_peer_ratio, local_training, max_examples_ratio, exclude_after)

    def assemble(self, selection: Selection | None, aggregation: Aggregation | None,
                 objective: str, round_timeout: float, max_update_ratio: float,
                 max_peer_ratio: float, local_training: TrainSettings | None,
                 max_examples_ratio: float, exclude_after: int = 0) -> None:
        """Take the parts, and start with no state."""
        self.selection = selection or Selection()
        self.aggregation = aggregation or Aggregation()
        self.objective = objective  # the clients' local objective
        self.round_timeout = round_timeout  # for exchanges a strategy runs in configure_train
        # a reply's (and the aggregate's) update may be this many times the model's norm
        self.max_update_ratio = max_update_ratio
        # a reply's update, and each payload that feeds strategy state, may be this many times
        # the round's lower median of the same (guard.py): one reply cannot outweigh its peers
        self.max_peer_ratio = max_peer_ratio
        # how the clients train: a reply's local-steps must be what it makes of its examples
        # (FedNova and SCAFFOLD scale by it); None: not checked (unit tests' bare strategies)
        self.local_training = local_training
        # a reply weighs as at most this many times the median surveyed example count
        # (``weight_cap``): deployment's nodes claim their counts; inf: never capped
        self.max_examples_ratio = max_examples_ratio
        # which replies enter what the round releases, and how (release/): plain by default
        self.release = Release()
        self.released: Released | None = None  # what the last round released
        # where the release sums payloads (DP, secure aggregation): this round's sum of the
        # payload terms (noised under DP), which the method takes instead of each payload
        self.payload_sum: dict[str, np.ndarray] | None = None
        # heterogeneity and per-client evaluation: what each node is asked to do this round
        self.plan = RoundPlan()
        self.clients = KnownClients()  # what the data survey found
        self.guard = ReplyGuard(max_peer_ratio=max_peer_ratio,
                                max_update_ratio=max_update_ratio,
                                max_examples_ratio=max_examples_ratio, clients=self.clients,
                                exclude_after=exclude_after)
        self.evaluation = FederatedEvaluation(fraction=self.fraction_evaluate,
                                              min_nodes=self.min_evaluate_nodes,
                                              clients=self.clients,
                                              weight_cap=self.guard.weight_cap)
        self.report = RoundReport()
        # (node, why, by a peer bar) for the replies of this round's exchanges before training
        # that were refused (FedCSD's prototype phase): recorded and counted with its replies
        self.refused_before: list[tuple[int, str, bool]] = []
        self.global_arrays: dict[str, np.ndarray] = {}  # the model sent this round
        self.last_aggregate: dict[str, np.ndarray] = {}  # what the aggregation made of it
        self.last_updates: list[ClientUpdate] = []  # the replies that passed the checks
        self.trained: list[int] = []  # the nodes sent this round's train message
        self.train_messages: list[Message] = []  # those messages (the grid gives them their ids)

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model: nn.Module,
                    aux_set: AuxSet | None = None, claims_counts: bool = False
                    ) -> DriftStrategy:
        """This strategy for a checked experiment (``driftfl.methods.check_experiment``);
        ``aux_set`` is the server's held-back set, for strategies that measure models on it.
        ``claims_counts``: the nodes claim their example counts (deployment), so
        max_examples_ratio caps their weights (in simulation the server assigns the
        partitions: nothing to cap)."""
        flwr_logger = logging.getLogger("flwr")
        level = flwr_logger.level
        flwr_logger.setLevel(logging.ERROR)  # Flower warns of settings chosen on purpose (mu=0)
        try:
            strategy = cls(selection=SELECTIONS[cfg.selection.name].from_config(cfg, model),
                       aggregation=AGGREGATIONS[cfg.aggregation.name].from_config(cfg, model),
                       objective=cfg.strategy.objective, round_timeout=cfg.round_timeout,
                       max_update_ratio=cfg.max_update_ratio,
                       max_peer_ratio=cfg.max_peer_ratio,
                       local_training=TrainSettings.local_stage(cfg),
                       max_examples_ratio=(cfg.max_examples_ratio if claims_counts
                                           else math.inf),
                       exclude_after=cfg.exclude_after,
                       fraction_train=cfg.fraction, fraction_evaluate=cfg.fraction_evaluate,
                       min_train_nodes=1, min_evaluate_nodes=0,
                       min_available_nodes=cfg.num_clients,
                       **cls.arguments(cfg.strategy, model=model, aux_set=aux_set,
                                       experiment=cfg))
        finally:
            flwr_logger.setLevel(level)
        strategy.aggregation = bounded_for(cfg, strategy.aggregation, claims_counts)
        strategy.plan = RoundPlan.from_config(cfg)
        strategy.release = build_release(cfg)
        # (after: whether a method sends its payload may depend on the release, FedCurv's does)
        strategy.release.payload = strategy.payload_words if strategy.sends_payload else ""
        return strategy

    @classmethod
    def protection_problem(cls, settings: Any) -> str | None:
        """For a method declared on its class alone: why these strategy settings keep privacy
        and secure aggregation from covering what the server takes, and what to set instead
        (None: nothing keeps them). A declared method says it in its MethodSpec."""
        return None

    @classmethod
    def arguments(cls, settings: Any, *, model: nn.Module, aux_set: AuxSet | None,
                  experiment: ExperimentConfig) -> dict[str, Any]:
        """This class's own constructor arguments, from the method's checked settings (and the
        experiment's, for the few a strategy needs: the seed, ...)."""
        return {}

    # -- who trains ----------------------------------------------------------------------
    def meet(self, clients: list[dict]) -> None:
        """What the data survey found, before the first round: each client's node_id,
        partition_id, num_examples and label_histogram."""
        self.clients.meet(clients)
        self.aggregation.meet(clients)

    def rejoin(self, clients: list[dict], moved: dict[int, int]) -> None:
        """Clients came back under new node ids (old -> new): meet them all again."""
        self.meet(clients)
        self.follow_clients(moved)

    def follow_clients(self, moved: dict[int, int]) -> None:
        """State kept by node id, the method's and its aggregation's, follows its client to a
        new node id (old -> new)."""
        self.rekey(moved)
        self.aggregation.rekey(moved)

    def rekey(self, moved: dict[int, int]) -> None:
        """State kept by node id follows its client to a new node id (old -> new): a restarted
        SuperNode, a resumed run. FedAvg keeps none."""

    def sample(self, server_round: int, grid: Grid) -> list[int]:
        """floor(fraction * nodes) clients (at least min_train_nodes), chosen by the selection
        among the round's surveyed nodes, or by the release's own secret sample."""
        return self.release.sample(self.available(server_round, grid), lambda nodes: (
            self.selection.select(server_round, nodes, self.train_count(len(nodes)),
                                  self.explored_clients())))

    def available(self, server_round: int, grid: Grid) -> list[int]:
        """The surveyed nodes the grid offers this round (the federation sets them: in
        deployment the roster's connected clients), in rank order."""
        return sorted(filter(self.clients.usable, grid.get_node_ids()), key=self.clients.rank)

    def train_count(self, available: int) -> int:
        count = max(self.min_train_nodes, math.floor(available * self.fraction_train + 1e-9))
        return min(count, available)

    def explored_clients(self) -> ExploredClients | None:
        """What the strategy knows of the clients, for a selection that needs it (DCFL)."""
        return None

    # -- what they receive ---------------------------------------------------------------
    def before_train(self, server_round: int, nodes: list[int], config: ConfigRecord,
                     grid: Grid) -> list[int]:
        """An exchange a method runs before training (FedCSD's prototype phase); returns the
        nodes that go on to train. None for FedAvg."""
        return nodes

    @property
    def sends_payload(self) -> bool:
        """Whether the clients' train replies carry ``payload_record``."""
        return bool(self.payload_record)

    def payload(self) -> dict[str, tuple[int, ...]]:
        """The summed arrays of ``payload_record`` (name -> shape, in the order they are
        summed) for this round; {} when the method sends none."""
        return {}

    def check_payload(self, update: ClientUpdate) -> str | None:
        """Why a reply's payload, as its client computed it, cannot be used (None: it can):
        the method's own checks, run wherever the release shows the server raw payloads."""
        return None

    def facts(self) -> RoundFacts:
        """What the release needs to know of this round."""
        population = self.clients.nodes() if self.clients.surveyed is not None \
            else list(self.trained)
        return RoundFacts(self.global_arrays, list(self.trained), self.payload(),
                          self.payload_record, population)

    def knowledge(self, server_round: int) -> dict:
        """Further named records a method sends with the global model (none for FedAvg)."""
        return {}

    def node_knowledge(self, server_round: int, node: int) -> dict:
        """Named records for one node only (FedCurv leaves the node's own terms out)."""
        return {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.global_arrays = to_numpy(arrays)
        self.payload_sum = None
        config[SERVER_ROUND] = server_round
        config[METHOD] = self.objective
        nodes = self.plan.start(server_round, self.sample(server_round, grid), self.clients.key,
                                self.clients.count, self.local_training)  # less the dropped
        nodes = self.before_train(server_round, nodes, config, grid)
        if self.release.sums_payloads and self.sends_payload:  # the clients' term of the sum
            config[SUMMED_PAYLOAD] = self.payload_record
            config[SUMMED_ARRAYS] = list(self.payload())
        shared = {ARRAYS: arrays, CONFIG: config, **self.knowledge(server_round)}
        content = RecordDict(shared)
        log(INFO, "configure_train: %d of the nodes train in round %d", len(nodes), server_round)
        messages = []
        for node in nodes:
            own = {**self.node_knowledge(server_round, node), **self.plan.record(node)}
            messages += self._construct_messages(RecordDict({**shared, **own}) if own else content,
                                                 [node], MessageType.TRAIN)
        return self.keep_sent(messages)

    def keep_sent(self, messages: list[Message]) -> list[Message]:
        """Keep the round's train messages and the nodes they go to (``trained``), for every
        strategy's ``configure_train``: a node that sends nothing back is then reported lost or
        late, and DP counts the clients sent a message."""
        self.train_messages = messages
        self.trained = [msg.metadata.dst_node_id for msg in messages]
        return messages

    # -- what comes back -----------------------------------------------------------------
    def accept(self, replies: Iterable[Message] | SecureSum) -> list[ClientUpdate]:
        """The replies that pass every check (the common ones, the release's, the method's
        and the aggregation's; screens against the round's peers where the release allows
        them); the rest are logged and counted, never used. A secure round's replies were
        checked as SecAgg+ collected them: only their metrics are in the clear."""
        secure = replies if isinstance(replies, SecureSum) else None
        replies = [] if secure is not None else list(replies)
        answered = (secure.answered if secure is not None
                    else {msg.metadata.src_node_id for msg in replies})
        failures = superlink_failures(replies, self.train_messages)  # neither late nor lost
        self.report = report = RoundReport.of_round(
            self.trained, answered | set(failures),
            lost_to_superlink(replies, self.train_messages), self.plan.dropped, self.clients.name)
        for node, reason in failures.items():
            self.guard.superlink_failed(report, node, reason)
        for node, reason, by_peers in self.refused_before:  # logged when they came
            self.guard.refuse_reply(report, node, reason, by_peers=by_peers, logged=True)
        answered = answered | {node for node, _, _ in self.refused_before}
        self.refused_before = []
        if secure is not None:
            for node, reason in sorted(secure.rejected.items(),
                                       key=lambda item: self.clients.rank(item[0])):
                self.guard.refuse_reply(report, node, reason)
            updates = list(secure.updates)
        else:
            updates = self.check_replies(replies)
            if self.release.compares_clients:
                updates = self.screen(self.guard.peer_screen(
                    report, updates, "update",
                    lambda u: update_norm(u.arrays, self.global_arrays)))
        self.guard.log_starved(report)
        self.guard.count_offences(report, answered, self.release.compares_clients)
        updates = self.guard.capped(updates)
        if updates:  # trust=none: each model within its bound of the round's others
            updates = self.aggregation.bound_updates(updates, self.global_arrays)
        report.clients = len(updates)
        self.last_updates = updates
        return updates

    def check_replies(self, replies: list[Message]) -> list[ClientUpdate]:
        """The replies, in node order, that pass check_reply and ``reject``; the others are
        recorded as rejected."""
        facts = self.facts()
        # the model's bound, or what the release's own noise may reach
        bound = max(norm_bound(self.global_arrays, self.max_update_ratio),
                    self.release.reply_bound(facts))
        updates = []
        for msg in self.clients.in_order(replies):
            if msg.has_error() and msg.metadata.src_node_id == SUPERLINK_NODE_ID:
                continue  # the SuperLink's notice that a node is lost, counted as lost
            checked = check_reply(msg, self.global_arrays, bound)
            if not isinstance(checked, str):
                checked = self.reject(checked) or checked
            if isinstance(checked, str):
                self.guard.refuse_reply(self.report, msg.metadata.src_node_id, checked)
            else:
                updates.append(checked)
        return updates

    def screen(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """A method's screens of its own payloads against the round's peers
        (``guard.peer_screen``), after the model update's; run only where the release allows
        clients to be compared. FedAvg sends none."""
        return updates

    def reject(self, update: ClientUpdate) -> str | None:
        """Why a reply that passed the common checks cannot be used (None: it can)."""
        if not self.clients.usable(update.node_id):
            return "the node was not accepted in the data survey"
        # a client trains on all it holds: fewer examples would mean fewer steps, and a
        # smaller step count (SCAFFOLD's Delta c_k, FedNova's a_k) would pass the step check
        surveyed = self.clients.count(update.node_id)
        if self.clients.surveyed is not None and update.num_examples != surveyed:
            return (f"it claims {update.num_examples:.12g} examples; the data survey "
                    f"found {surveyed}")
        steps, expected = update.metrics[LOCAL_STEPS], self.local_steps(update)
        if expected is not None and steps != expected:
            return (f"'{LOCAL_STEPS}' is {steps:.12g}, but {self.steps_rule(update)} make "
                    f"{expected}")
        asked = self.plan.reject(update)
        if asked:
            return asked
        if self.release.raw_payloads and (problem := self.check_payload(update)):
            return problem
        return self.release.admit(update, self.facts()) or self.aggregation.reject(update)

    def local_steps(self, update: ClientUpdate) -> int | None:
        """The SGD steps a client takes on the examples it claims (None: not checked)."""
        asked = self.plan.training(update.node_id, self.local_training)
        return None if asked is None else asked.steps(update.num_examples)

    def steps_rule(self, update: ClientUpdate) -> str:
        """How ``local_steps`` counts, for a rejection's message."""
        return self.plan.training(update.node_id, self.local_training).in_words(
            f"its {update.num_examples:.12g} examples")

    def refuse_aggregate(self, arrays: dict[str, np.ndarray]) -> str | None:
        """Why an aggregate must not replace the global model (None: it may)."""
        if not all(np.isfinite(v).all() for v in arrays.values() if v.dtype.kind == "f"):
            return "the aggregate holds NaN or infinite values"
        update = update_norm(arrays, self.global_arrays)
        bound = max(norm_bound(self.global_arrays, self.max_update_ratio),
                    self.release.aggregate_bound(self.facts()))  # the release's noise
        if not update <= bound:
            return f"the aggregate's update norm {update:.3g} exceeds the bound {bound:.3g}"
        return None

    def aggregate_train(self, server_round: int, replies: Iterable[Message] | SecureSum
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's replies (or a secure round's sum) -> the checked ones (``accept``) ->
        what the release makes of them -> the aggregation's model, if it passes
        ``refuse_aggregate``. A method's own update of its state follows in its override."""
        updates = self.accept(replies)
        released = self.release.release(server_round, self.facts(), updates,
                                        replies if isinstance(replies, SecureSum) else None)
        self.released, self.payload_sum = released, released.payload_sum
        metrics = mean_metrics(updates, example_weights(updates) if self.release.weighs_examples
                               else np.full(len(updates), 1 / len(updates))) if updates else {}
        self.report.train_metrics = metrics
        if released.mean_update is not None:  # a protected release: the mean update is made
            refused, aggregate = None, apply_update(self.global_arrays, released.mean_update)
        elif not updates and not released.withheld:
            log(WARNING, "round %d: no usable reply; the global model stays as it was",
                server_round)
            return None, None
        else:
            refused = released.withheld or self.aggregation.refuse(updates)
            aggregate = {} if refused else self.aggregation.aggregate(updates, self.global_arrays)
        refused = refused or self.refuse_aggregate(aggregate)
        if refused:
            log(WARNING, "round %d: %s; the global model stays as it was", server_round, refused)
            self.report.refused_aggregate = refused
            return None, None
        self.last_aggregate = aggregate
        self.report.model_updated = True
        return to_record(self.last_aggregate), MetricRecord(
            {k: v for k, v in metrics.items() if not isinstance(v, list)})

    def payload_floor(self, divisor: float) -> float:
        """How far a state made of the round's payload sum over ``divisor`` may move by the
        release's own doing (DP: the clipped terms and the noise); 0 otherwise."""
        if self.payload_sum is None:
            return 0.0
        return self.release.sum_bound(self.facts()) / divisor

    # -- federated evaluation (the ``evaluation`` part) ------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        nodes = self.evaluation.sample(self.available(server_round, grid))
        if not nodes:
            return []
        config[SERVER_ROUND] = server_round
        return self._construct_messages(
            RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config}), nodes,
            MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        metrics = self.evaluation.aggregate(replies)
        self.report.evaluate_metrics = dict(metrics or {})
        return metrics

    def stop_before(self, server_round: int) -> str | None:
        """Why the run must stop before ``server_round`` (None: it goes on): the release's
        privacy budget, privacy.target_epsilon, would be exceeded."""
        return self.release.stop_before(server_round)

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        """Method diagnostics the server measures each round; ``accuracy_of(arrays)`` tests a
        model on the central test set."""
        return {}

    def round_arrays(self) -> dict[str, "np.ndarray"]:
        """Arrays the run directory keeps for every round (FedSSD's credibility matrix, ...)."""
        return {}

    def round_images(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Image sets (images, labels) to show as PNG grids, by name (DCFL's condensed sets)."""
        return {}
