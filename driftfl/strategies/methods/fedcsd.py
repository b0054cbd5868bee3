"""FedCSD's server: an EMA teacher and, every round, the prototype phase before training.

1. Prototype phase: the sampled nodes get the teacher (query ``csd_prototypes``) and answer with
   P_k (per-class mean teacher logits) and their class counts; P_G,c = mean of P_k,c over the
   clients that hold class c, uniformly over clients (Eq. 7); a class nobody holds: a zero row.
2. Train phase, for the nodes that answered: global model, teacher and P_G.
3. After FedAvg: teacher <- alpha * teacher + (1 - alpha) * global (alpha = 0: the last global).
With prototypes=previous (the one-exchange option, docs/algorithms.md) there is no step 1: the
train message carries the previous round's P_G (zero rows in round 1) and the train replies bring
the P_k for the next round. With prototypes=local (the authors' code) nothing but the teacher is
sent: each client builds its own P from the teacher's logits on its data.
A P_k is used only if it passes check_prototypes (finite, within +-1e4, counts whole) and
prototypes.py's rules (counts within the node's surveyed label histogram, no row for a class it
does not hold, each class's norm within max_peer_ratio x its peers' lower median and within
max_update_ratio of P_G,c); a new P_G that would move the classes it shares with the old one by
more than max_update_ratio x their norm is refused, the old one kept (guard.state_problem).
Under a robust aggregation P_G,c is that rule's combination of the holders' P_k,c (the median
for Krum, whose kept replies are the model's, chosen after this phase), not Eq. 7's mean.
Where the release sums payloads (DP, secure aggregation; prototypes=previous or local: the
prototype phase is a second exchange neither covers) the P_k of the train replies are a
payload taken as a sum, and P_G is made of the sum alone (prototypes.summed): see prototypes.py.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID

from driftfl.common.error_replies import error_reason, log_refused
from driftfl.common.protocol import CONFIG, CSD_PROTOTYPES, PROTOTYPES, PROTOTYPES_IN_REPLY, TEACHER
from driftfl.specs import methods as declared
from driftfl.strategies.methods.prototypes import (
    combined,
    common_rows,
    noise_floor,
    outliers,
    prototype_scale,
    screened,
    summed,
    survey_problem,
)
from driftfl.strategies.methods.teacher import EMATeacher
from driftfl.strategies.parts.aggregation import to_record

# No teacher logit comes near this; a larger "prototype" is corrupt or hostile.
PROTOTYPE_BOUND = 1e4


def check_prototypes(msg: Message, num_classes: int, num_examples: float = math.inf, *,
                     record: str = PROTOTYPES, dim: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray] | str:
    """(P_k, counts) from the reply's ``record``, or why the reply cannot be used: P_k
    (num_classes, dim) finite and bounded (dim: num_classes for FedCSD's logit prototypes),
    counts whole, non-negative and summing to at most the node's ``num_examples`` (its data
    survey). FedProto checks its feature prototypes with it too."""
    dim = num_classes if dim is None else dim
    if msg.has_error():
        return error_reason(msg.error)
    if record not in msg.content.array_records:
        return f"reply lacks the '{record}' record"
    arrays = msg.content.array_records[record]
    try:
        prototypes, counts = arrays["prototypes"].numpy(), arrays["counts"].numpy()
    except Exception as err:  # missing or unreadable arrays
        return f"prototypes cannot be read: {err!r}"
    if prototypes.shape != (num_classes, dim) or counts.shape != (num_classes,):
        return (f"prototypes {prototypes.shape} / counts {counts.shape} for {num_classes} "
                f"classes: expected ({num_classes}, {dim}) / ({num_classes},)")
    if prototypes.dtype.kind != "f" or not np.isfinite(prototypes).all() \
            or np.abs(prototypes).max(initial=0) > PROTOTYPE_BOUND:
        return f"prototypes are not finite numbers within +-{PROTOTYPE_BOUND:g}"
    if counts.dtype.kind not in "iuf" or not np.isfinite(counts).all() or (counts < 0).any() \
            or (counts != np.round(counts)).any() or counts.sum() > num_examples:
        return f"counts are not whole non-negative numbers summing to at most {num_examples}"
    return prototypes.astype(np.float32), counts


def global_prototypes(replies: list[tuple[np.ndarray, np.ndarray]],
                      num_classes: int) -> np.ndarray:
    """P_G,c = mean over the clients holding class c of P_k,c; zero rows for unheld classes."""
    total = np.zeros((num_classes, num_classes), dtype=np.float64)
    holders = np.zeros(num_classes)
    for prototypes, counts in replies:
        held = counts > 0
        total[held] += prototypes[held]
        holders += held
    return (total / np.maximum(holders, 1)[:, None]).astype(np.float32)


class FedCSD(EMATeacher):
    """``source``: exchange, previous or local (the objective's ``prototypes`` setting: where
    P comes from); ``num_classes``: the rows of P_G."""

    spec = declared.FEDCSD
    payload_words = "FedCSD's class prototypes"

    def __init__(self, *, source: str, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.one_exchange = source == "previous"
        self.local = source == "local"  # each client its own P: nothing exchanged
        self.num_classes = num_classes
        self.prototypes: np.ndarray | None = None  # P_G
        self.present = np.zeros(num_classes, dtype=bool)  # the classes some client held
        self.early: list[str] = []  # refusals of the prototype phase, for the round's report

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"alpha": settings.alpha if settings.tma else 0.0,
                "source": settings.prototypes,
                "num_classes": model.head.out_features}

    @property
    def sends_payload(self) -> bool:
        return self.one_exchange

    def payload(self) -> dict[str, tuple[int, ...]]:
        return {"prototypes": (self.num_classes, self.num_classes)} if self.one_exchange else {}

    def checked_prototypes(self, reply: Message) -> tuple[np.ndarray, np.ndarray] | str:
        """(P_k, counts) of a reply, or why they cannot be used (check_prototypes, then the
        node's data survey)."""
        node = reply.metadata.src_node_id
        checked = check_prototypes(reply, self.num_classes, self.clients.count(node))
        return checked if isinstance(checked, str) else (
            survey_problem(*checked, self.clients.histograms.get(node)) or checked)

    def check_payload(self, update):
        """With one exchange the P_k ride in the train reply: a reply whose P_k fail their
        checks is rejected whole, as FedProto's."""
        if not self.one_exchange:
            return None
        checked = self.checked_prototypes(update.message)
        return checked if isinstance(checked, str) else None

    def screen(self, updates):
        """With one exchange, the train replies' P_k against their peers and P_G (as
        ``gather``'s, prototypes.outliers)."""
        if not self.one_exchange:
            return updates
        return screened(self, updates, [self.checked_prototypes(u.message) for u in updates])

    def gather(self, replies, server_round: int) -> list[int]:
        """The prototype phase's answers: the nodes whose prototypes are usable; P_G from
        them, unless it is refused. The others are logged now and recorded and counted with
        the round's train replies (``refused_before``), as any rejected reply."""
        nodes, usable, refused = [], [], []
        for reply in self.clients.in_order(replies):
            node, checked = reply.metadata.src_node_id, self.checked_prototypes(reply)
            if isinstance(checked, str):
                refused.append((node, checked, False))
            else:
                nodes.append(node)
                usable.append(checked)
        bad = outliers(usable, self.prototypes, self.present, self.max_peer_ratio,
                       self.max_update_ratio)
        refused += [(nodes[k], reason, by_peers) for k, (reason, by_peers) in bad.items()]
        log_refused("prototype", [(self.clients.describe(n), r) for n, r, _ in refused])
        # (a SuperLink's notice names no client: its node is counted as silent)
        self.refused_before = [r for r in refused if r[0] != SUPERLINK_NODE_ID]
        self.update_prototypes([p for k, p in enumerate(usable) if k not in bad], server_round)
        return [n for k, n in enumerate(nodes) if k not in bad]

    def update_prototypes(self, usable, server_round: int) -> None:
        """P_G from the usable (P_k, counts), unless the state rule refuses it."""
        if self.aggregation.robust and usable:
            new, present = combined(self.prototype_rule(), usable, self.num_classes,
                                    self.num_classes, by_counts=False)
        else:
            new = global_prototypes(usable, self.num_classes)
            present = np.any([counts > 0 for _, counts in usable], axis=0) if usable \
                else np.zeros(self.num_classes, dtype=bool)
        rows = common_rows(new, present, self.prototypes, self.present)
        problem = rows and self.guard.state_problem(
            *rows, scale=prototype_scale(usable, self.prototypes, self.present))
        if problem:
            self.guard.refuse_state(self.report, server_round, "FedCSD's prototypes", problem)
        else:
            self.prototypes, self.present = new, present

    def prototype_rule(self):
        """The robust rule that makes P_G of the holders' P_k,c, per class, before any model
        aggregate of the round (``Aggregation.standalone``: Krum's median)."""
        return self.aggregation.standalone()

    def before_train(self, server_round, nodes, config: ConfigRecord, grid):
        if self.local:
            return nodes
        if self.one_exchange:
            config[PROTOTYPES_IN_REPLY] = True  # the replies bring the next round's P_k
            if server_round == 1:
                self.prototypes = np.zeros((self.num_classes, self.num_classes), np.float32)
            return nodes
        teacher = to_record(self.teacher)
        query = [Message(RecordDict({TEACHER: teacher, CONFIG: config}), dst_node_id=node,
                         message_type=f"{MessageType.QUERY}.{CSD_PROTOTYPES}") for node in nodes]
        before = len(self.report.refused_state)
        answered = set(self.gather(grid.send_and_receive(query, timeout=self.round_timeout),
                                   server_round))
        self.early = self.report.refused_state[before:]  # this report is last round's
        return [node for node in nodes if node in answered]

    def accept(self, replies):
        updates = super().accept(replies)
        self.report.refused_state[:0], self.early = self.early, []
        return updates

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if self.one_exchange and self.payload_sum is not None:  # the release's sum
            new = summed(self, self.num_classes)
            rows = common_rows(*new, self.prototypes, self.present)
            problem = rows and self.guard.state_problem(*rows, floor=noise_floor(self, rows[1]))
            if problem:
                self.guard.refuse_state(self.report, server_round, "FedCSD's prototypes", problem)
            else:
                self.prototypes, self.present = new
        elif self.one_exchange:  # the P_k of the accepted train replies make the next P_G
            self.update_prototypes([self.checked_prototypes(u.message)
                                    for u in self.last_updates], server_round)
        return arrays, metrics

    def knowledge(self, server_round: int) -> dict:
        if self.local:
            return super().knowledge(server_round)
        return {**super().knowledge(server_round),
                PROTOTYPES: ArrayRecord({"prototypes": Array(self.prototypes)})}
