"""FedProto's server (Tan et al., AAAI 2022), as the FedCSD paper compares it.

Each train reply brings the node's prototypes P_k (C, d), its per-class mean features, and
its per-class counts n_k. Over the replies accepted this round:
  P_G,c = sum_k n_k,c P_k,c / sum_k n_k,c   for the classes some node held
(prototype_mean=weighted, the default; plain: the unweighted mean over the nodes holding c, as
the authors' ``proto_aggregation`` computes it); a class nobody held this round has no global
prototype (the authors replace P_G every round).
P_G and which classes have one ("present") go out with the global model from round 2 on.
The weights are averaged too (the configured aggregation, FedAvg by default) and the global
model is evaluated centrally as for every method. A reply whose prototypes fail the checks is
refused whole: it touches neither P_G nor the model. The checks: fedcsd.check_prototypes
(finite, within +-1e4, counts whole) and prototypes.py's rules (counts within the node's
surveyed label histogram, no row for a class it does not hold, each class's norm within
max_peer_ratio x its peers' lower median, within max_update_ratio of P_G,c). A new P_G that
would move the classes it shares with the old one by more than max_update_ratio x their norm
(guard.state_problem) is refused and the old one kept. A round that leaves the global model as
it was (no usable reply, or a refused aggregate) leaves P_G as it was. Under a robust
aggregation P_G,c is its ``combine`` of the holders' P_k,c (weighted by count, or uniformly with
plain), not the mean. Where the release sums payloads (DP, secure aggregation; prototype_mean=
plain) P_G is made of the sum of the P_k alone (prototypes.summed): see prototypes.py.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Array, ArrayRecord, Message

from driftfl.common.protocol import FEATURE_PROTOTYPES
from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.methods.fedcsd import check_prototypes
from driftfl.strategies.methods.prototypes import (
    combined,
    common_rows,
    noise_floor,
    prototype_scale,
    screened,
    summed,
    survey_problem,
)
from driftfl.strategies.parts.aggregation import ClientUpdate


def check_feature_prototypes(msg: Message, num_classes: int, dim: int,
                             num_examples: float = math.inf
                             ) -> tuple[np.ndarray, np.ndarray] | str:
    """(P_k, counts) of a train reply, or why they cannot be used: FedCSD's prototype checks
    (finite, bounded, counts whole and within the survey) on (C, d) feature prototypes."""
    checked = check_prototypes(msg, num_classes, num_examples, record=FEATURE_PROTOTYPES,
                               dim=dim)
    return checked if isinstance(checked, str) else (checked[0], checked[1].astype(np.float64))


def weighted_prototypes(replies: list[tuple[np.ndarray, np.ndarray]], num_classes: int,
                        dim: int, by_counts: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(P_G, present): P_G,c = sum_k n_k,c P_k,c / sum_k n_k,c, or with by_counts=False the
    plain mean over the replies holding c; present_c = sum_k n_k,c > 0 (a zero row where
    false)."""
    total = np.zeros((num_classes, dim), dtype=np.float64)
    held = np.zeros(num_classes, dtype=np.float64)
    for prototypes, counts in replies:
        weights = counts if by_counts else (counts > 0).astype(np.float64)
        total += weights[:, None] * prototypes
        held += weights
    present = held > 0
    return (total / np.maximum(held, 1)[:, None]).astype(np.float32), present


class FedProto(DriftStrategy):
    """``num_classes``, ``feature_dim``: the prototypes are (C, d), d the head's input;
    ``by_counts``: P_G,c weighted by the holders' counts of c (False: a plain mean)."""

    spec = declared.FEDPROTO
    server_columns = frozenset({"prototype_classes"})
    payload_words = "FedProto's class prototypes"

    def __init__(self, *, num_classes: int, feature_dim: int, by_counts: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.feature_dim = num_classes, feature_dim
        self.by_counts = by_counts
        self.prototypes: np.ndarray | None = None  # P_G; None until a round has made one
        self.present = np.zeros(num_classes, dtype=bool)

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"num_classes": model.head.out_features, "feature_dim": model.head.in_features,
                "by_counts": settings.prototype_mean == "weighted"}

    def payload(self) -> dict[str, tuple[int, ...]]:
        return {"prototypes": (self.num_classes, self.feature_dim)}

    def knowledge(self, server_round: int) -> dict:
        if self.prototypes is None:  # round 1: the clients train with plain cross-entropy
            return {}
        return {FEATURE_PROTOTYPES: ArrayRecord({"prototypes": Array(self.prototypes),
                                                 "present": Array(self.present)})}

    def prototypes_of(self, update: ClientUpdate) -> tuple[np.ndarray, np.ndarray] | str:
        checked = check_feature_prototypes(update.message, self.num_classes, self.feature_dim,
                                           self.clients.count(update.node_id))
        return checked if isinstance(checked, str) else (
            survey_problem(*checked, self.clients.histograms.get(update.node_id)) or checked)

    def check_payload(self, update: ClientUpdate) -> str | None:
        checked = self.prototypes_of(update)
        return checked if isinstance(checked, str) else None

    def screen(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """The prototypes against the round's peers and P_G (prototypes.outliers)."""
        return screened(self, updates, [self.prototypes_of(u) for u in updates])

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        scale = None  # the honest scale of the move (a release's sum: its noise floor)
        if self.payload_sum is not None:  # the release's sum alone
            new = summed(self, self.num_classes)
        else:  # every accepted reply passed prototypes_of in reject
            replies = [self.prototypes_of(u) for u in self.last_updates]
            scale = prototype_scale(replies, self.prototypes, self.present)
            new = (combined(self.aggregation, replies, self.num_classes, self.feature_dim,
                            by_counts=self.by_counts) if self.aggregation.robust else
                   weighted_prototypes(replies, self.num_classes, self.feature_dim,
                                       self.by_counts))
        rows = common_rows(*new, self.prototypes, self.present)
        problem = rows and self.guard.state_problem(*rows, floor=noise_floor(self, rows[1]),
                                                    scale=scale)
        if problem:
            self.guard.refuse_state(self.report, server_round, "FedProto's prototypes", problem)
        else:
            self.prototypes, self.present = new
        return arrays, metrics

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        # the classes with a global prototype after this round's aggregation
        return {"prototype_classes": float(self.present.sum())}
