"""No single client can crash a run (issue 43): every registered method's server, fed by real
clients in process, one of which replies every round (train and query alike) with

- ``zero``: every float array of its reply zero (the model's weights, Delta c, F_k,
  prototypes, classifier, condensed pixels),
- ``copied``: exactly what it was sent (the global model, the prototypes and head it got, a
  Delta c of zero), its other payloads as it computed them,
- ``maximal``: the largest reply the checks accept, read from the strategy's own bounds: its
  model update stretched to 0.9 x min(max_update_ratio x max(1, ||w_G||), max_peer_ratio x
  the round's lower median update norm), each payload to 0.9 x its peer bound (max_peer_ratio,
  squared for the Fisher) and its per-value bound, SCAFFOLD's Delta c recomputed from the
  stretched model so that it stays consistent,

never raises, keeps a finite model, and accounts for every round (the model updated, or a
recorded reason). ``TRUST`` holds extra overrides every case runs under as well (a stricter
trust mode's tighter bounds: they are read from the strategy, never written here).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType

from driftfl.client.objectives.scaffold import step_scale
from driftfl.common.config import compose
from driftfl.common.protocol import (ARRAYS, CLASSIFIER, CONDENSED, CONTROL, CONTROL_DELTA,
                                     DATASET_META, EXPERIMENT, FEATURE_PROTOTYPES, FISHER,
                                     LOCAL_STEPS, METRICS, PROTOTYPES, model_to_arrays)
from driftfl.dcfl.condensed import CLASSIFIER_BOUND, outsized, set_size
from driftfl.dcfl.settings import PIXEL_BOUND
from driftfl.methods import METHODS, build_strategy
from driftfl.server.experiment import prepare_experiment
from driftfl.server.survey import survey_clients
from driftfl.strategies.methods.fedcsd import PROTOTYPE_BOUND
from driftfl.strategies.methods.fedcurv import FISHER_BOUND
from driftfl.strategies.methods.prototypes import outliers
from driftfl.strategies.parts.aggregation import model_norm, to_numpy, update_norm
from driftfl.strategies.parts.guard import lower_median
from test_methods import InProcessGrid, fmnist_nodes

NODES, ATTACKER, ROUNDS = 3, 102, 3  # the attacker is the third node (partition 2)
SETUP = ["model=mlp", "dataset.subset=1200", "dataset.test_subset=200", f"num_clients={NODES}",
         f"rounds={ROUNDS}", "logit_shift_samples=32"]
CHEAP = {"dcfl": ["strategy.condense_iterations=2", "strategy.ipc=2",
                  "strategy.pretrain_epochs=1"]}
TRUST: list[list[str]] = [[], ["trust=none"]]  # extra overrides each case runs under too
MODES = ("zero", "copied", "maximal")
# the per-value bound a payload's arrays are checked against, by record
VALUE_BOUND = {FISHER: FISHER_BOUND, CLASSIFIER: CLASSIFIER_BOUND, CONDENSED: PIXEL_BOUND}
UNSCALED = {"counts", "present", "labels"}  # whole numbers and flags, left as computed
# cases where the honest clients may stop training (none: FedCurv's attacker at 0.9 x
# max_peer_ratio^2 the median Fisher once made them NaN from round 2; the sums' bound at the
# round's honest scale now refuses that move, in round 1 too)
HONEST_REFUSED: set = set()


def floats(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record.keys()
            if k not in UNSCALED and record[k].numpy().dtype.kind == "f"}


def replaced(record: ArrayRecord, new: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(new[k].astype(record[k].numpy().dtype) if k in new
                                 else record[k].numpy()) for k in record.keys()})


class HostileGrid(InProcessGrid):
    """Real clients in process; every train and query reply of ATTACKER is forged by ``mode``.
    ``reports`` collects each round's report once the next round (or the run) has begun."""

    def __init__(self, mode: str):
        super().__init__(fmnist_nodes(NODES))
        self.mode, self.strategy, self.reports, self.trained = mode, None, [], 0

    def record(self):
        self.strategy.server_metrics(lambda arrays: 0.0)  # DCFL's CKA figures, ...
        self.strategy.round_arrays()
        self.reports.append(self.strategy.report)

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout)
        kind = messages[0].metadata.message_type if messages else ""
        if kind.startswith(MessageType.EVALUATE) or kind.endswith("data_summary"):
            return replies
        if kind == MessageType.TRAIN:
            if self.trained:
                self.record()
            self.trained += 1
        sent = {m.metadata.dst_node_id: m for m in messages}
        others = [r for r in replies if r.metadata.src_node_id != ATTACKER and not r.has_error()]
        for reply in replies:
            if reply.metadata.src_node_id == ATTACKER and not reply.has_error():
                getattr(self, self.mode)(sent[ATTACKER], reply, others)
        return replies

    # -- the three replies ------------------------------------------------------------------
    def zero(self, message, reply, others):
        for name, record in list(reply.content.array_records.items()):
            reply.content[name] = replaced(record, {k: np.zeros_like(v)
                                                    for k, v in floats(record).items()})

    def copied(self, message, reply, others):
        given = message.content.array_records
        for name, record in list(reply.content.array_records.items()):
            if name == CONTROL_DELTA:  # c_k unchanged
                new = {k: np.zeros_like(v) for k, v in floats(record).items()}
            elif name == CLASSIFIER:  # the head it was sent
                new = {"weight": given[ARRAYS]["head.weight"].numpy()}
            elif name in given:  # the model, the prototypes it was sent
                new = {k: v for k, v in floats(given[name]).items() if k in record.keys()}
            else:
                continue
            reply.content[name] = replaced(record, new)

    def maximal(self, message, reply, others):
        records = reply.content.array_records
        if ARRAYS in records:
            self.stretch_model(message, reply, others)
        for name, record in list(records.items()):
            if name not in (ARRAYS, CONTROL_DELTA):
                self.stretch_payload(name, reply, others)

    def stretch_model(self, message, reply, others):
        g, own = floats(message.content[ARRAYS]), floats(reply.content[ARRAYS])
        peers = [update_norm(floats(r.content[ARRAYS]), g) for r in others
                 if ARRAYS in r.content.array_records]
        guard = self.strategy.guard
        bound = min(guard.max_update_ratio * max(1.0, model_norm(g)),
                    guard.max_peer_ratio * lower_median([*peers, math.inf]))
        moved = update_norm(own, g)
        if not moved > 0:
            return
        scale = 0.9 * bound / moved
        w = {k: g[k].astype(np.float64) + scale * (own[k] - g[k].astype(np.float64)) for k in g}
        reply.content[ARRAYS] = replaced(reply.content[ARRAYS], w)
        if CONTROL_DELTA in reply.content.array_records:  # consistent with the model sent
            s = self.strategy
            a = step_scale(reply.content[METRICS][LOCAL_STEPS], s.lr, s.momentum, s.divisor)
            c = floats(message.content[CONTROL])
            reply.content[CONTROL_DELTA] = replaced(reply.content[CONTROL_DELTA], {
                k: (g[k] - w[k]) / a - c[k] for k in c})

    def stretch_prototypes(self, name, reply, others):
        """Each held class's row to 0.9 x its bounds (prototypes.outliers): max_peer_ratio x
        the other holders' lower median, and max_update_ratio x max(1, ||P_G,c||) from P_G,c."""
        record, s = reply.content[name], self.strategy
        own, counts = record["prototypes"].numpy().astype(np.float64), record["counts"].numpy()
        peers = [(r.content[name]["prototypes"].numpy(), r.content[name]["counts"].numpy())
                 for r in others if name in r.content.array_records]
        norms = np.linalg.norm(own, axis=1)
        pooled = [float(np.linalg.norm(p[c])) for p, n in peers for c in np.flatnonzero(n)]
        for c in np.flatnonzero((counts > 0) & (norms > 0)):
            held = [float(np.linalg.norm(p[c])) for p, n in peers if n[c] > 0]
            bound = s.max_peer_ratio * lower_median([*(held or pooled), math.inf])
            if s.prototypes is not None and s.present[c]:
                old = float(np.linalg.norm(s.prototypes[c]))
                bound = min(bound, s.max_update_ratio * max(1.0, old) - old / 0.9)
            own[c] *= 0.9 * min(bound, PROTOTYPE_BOUND) / norms[c]
        reply.content[name] = replaced(record, {"prototypes": own})

    def stretch_payload(self, name, reply, others):
        if name in (PROTOTYPES, FEATURE_PROTOTYPES):
            return self.stretch_prototypes(name, reply, others)
        record = reply.content[name]
        own = floats(record)
        if name == CONDENSED:  # screened by its largest image against every set known
            size = lambda arrays: set_size(arrays["images"])
            peers = [set_size(images) for images, _ in self.strategy.store.values()]
        else:
            size, peers = model_norm, []
        peers += [size(floats(r.content[name])) for r in others
                  if name in r.content.array_records]
        power = 2 if name == FISHER else 1
        bound = self.strategy.guard.max_peer_ratio ** power * lower_median([*peers, math.inf])
        largest = max((np.abs(v).max(initial=0.0) for v in own.values()), default=0.0)
        if not size(own) > 0:
            return
        scale = 0.9 * min(bound / size(own),
                          VALUE_BOUND.get(name, PROTOTYPE_BOUND) / largest)
        reply.content[name] = replaced(record, {k: v * scale for k, v in own.items()})


def hostile_run(method: str, mode: str, extra: list[str]) -> HostileGrid:
    experiment = prepare_experiment(compose([f"strategy={method}", *SETUP,
                                             *CHEAP.get(method, []), *extra]))
    model = experiment.initial_model()
    grid = HostileGrid(mode)
    grid.strategy = strategy = build_strategy(experiment.cfg, model, experiment.aux_set(model))
    record = ConfigRecord({EXPERIMENT: experiment.cfg.to_json(),
                           DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, NODES, node_wait=5, timeout=60))
    result = strategy.start(grid=grid, initial_arrays=model_to_arrays(model),
                            num_rounds=ROUNDS, train_config=record,
                            evaluate_config=ConfigRecord(dict(record)))
    grid.record()
    grid.final = to_numpy(result.arrays)
    return grid


@pytest.mark.parametrize("extra", TRUST, ids=lambda e: " ".join(e) or "default")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_one_client_at_the_bounds_cannot_crash_any_methods_run(method, mode, extra,
                                                               fmnist_available, server_task):
    grid = hostile_run(method, mode, extra)
    assert len(grid.reports) == ROUNDS
    assert all(np.isfinite(v).all() for v in grid.final.values() if v.dtype.kind == "f")
    for server_round, report in enumerate(grid.reports, 1):
        reasons = report.rejected + report.refused_state + [report.refused_aggregate]
        assert report.model_updated or any(reasons), f"round {server_round}: no reason"
        if (method, mode) not in HONEST_REFUSED:  # the honest clients train
            assert report.clients >= NODES - 1, (server_round, report.rejected)
    print(f"{method} {mode}: refused by round {[r.rejected for r in grid.reports]}")


def test_an_all_zero_prototype_or_condensed_set_does_not_make_its_peers_outsized():
    """The peer screens took the lower median of every norm: one client's zero prototype (or
    all-zero condensed set) beside one honest holder put it at 0, and every honest reply was
    over 30 x 0 (the ``zero`` case above refused FedProto's honest prototypes every round)."""
    zero, honest = (np.zeros((2, 2)), np.array([5, 0])), (np.float64([[3, 4], [0, 0]]),
                                                          np.array([5, 0]))
    assert outliers([zero, honest], None, np.zeros(2, bool), 30.0, 10.0) == {}
    big = (np.float64([[300, 400], [0, 0]]), np.array([5, 0]))
    # (three non-zero holders: fewer set no bar, guard.peer_bar)
    assert list(outliers([zero, honest, honest, big], None, np.zeros(2, bool), 30.0, 10.0)) \
        == [3]
    blank = {1: (np.zeros((2, 1, 2, 2), np.float32), np.array([0, 1]))}
    assert outsized([np.ones((2, 1, 2, 2), np.float32)], blank, 30.0) == {}
    ones = np.ones((2, 1, 2, 2))
    assert list(outsized([ones, ones, 100 * ones], blank, 30.0)) == [2]
