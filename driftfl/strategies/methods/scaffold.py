"""SCAFFOLD (Karimireddy et al. 2020), the server: the control variate c.

c holds one array per trainable parameter (zeros at the start) and goes with the global model in
every train message (record ``control``). Each reply brings Delta c_k = c_k+ - c_k
(``control-delta``); after the configured aggregation has made the next global model,
  c <- c + (1/K) sum_{accepted k} Delta c_k      (= c + (|S|/K) mean_k Delta c_k),
K = num_clients. A client's Delta c_k = -c + (w_G - w_k) / (a_k lr) does not depend on its
c_k, so the server recomputes it (float64) from the reply's own model and local-steps and
refuses a reply whose Delta c_k is off by more than CONTROL_TOLERANCE; a refused reply touches
neither c nor the global model, and a round whose aggregate is refused leaves c as it was.

c is guarded like the model (guard.py): a reply whose ||Delta c_k|| is over max_peer_ratio x the
round's lower median is rejected (``screen``), and a new c that is not finite or moved more than
max_update_ratio x max(1, ||c||) is refused: c stays, the round's aggregate (which passed its
own checks) is still used, and the refusal is recorded in ``RoundReport.refused_state``. Under a
robust aggregation the Delta c_k are combined by the same rule, uniformly:
  c <- c + (|S|/K) combine_k(Delta c_k);
under a plain one the formula above is used unchanged.

Where the release sums payloads (DP, secure aggregation) the Delta c_k are a payload taken as a
sum (``payload_sum``): c <- c + (1/K) (sum_k Delta c_k + noise), each Delta c_k clipped to
privacy.payload_clip. The recomputation check runs wherever the server sees each Delta c_k as
its client computed it (``check_payload``); the release bounds what it cannot see (a noised
term's norm). c's move is bounded by what the clipped, noised sum can reach.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Message

from driftfl.common.protocol import CONTROL, CONTROL_DELTA, LOCAL_STEPS
from driftfl.common.sgd import nova_normaliser
from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.parts.aggregation import ClientUpdate, model_norm, to_record
from driftfl.strategies.parts.guard import move_scale

# ||Delta c_reply - Delta c_server|| may be at most this times ||c|| + ||(w_G - w_k)/(a_k lr)||.
# The client forms each entry with three float32 roundings (w_G - w_k, the division, minus c),
# each at most 2^-24 ~ 6e-8 of |c_i| + |u_i|: under 2e-7 in all whatever the model's scale
# (measured on Fashion-MNIST clients, MLP and LeNet-5: ~3e-8). 1e-5 leaves a wide margin (GPU
# kernels that multiply by 1/(a lr) add a rounding) while a forged Delta c_k moves c by at most
# 1e-5 of those sizes per round. Scaled by the two terms, not by ||Delta c||, which is near 0
# when the client's drift matches c.
CONTROL_TOLERANCE = 1e-5


def expected_delta(control: dict[str, np.ndarray], w_global: dict[str, np.ndarray],
                   w_local: dict[str, np.ndarray], scale: float
                   ) -> tuple[dict[str, np.ndarray], float]:
    """(Delta c_k = -c + (w_G - w_k) / scale in float64, ||c|| + ||(w_G - w_k) / scale||)."""
    moves = {k: (w_global[k].astype(np.float64) - w_local[k]) / scale for k in control}
    delta = {k: moves[k] - control[k] for k in control}
    size = (math.sqrt(sum(float(np.sum(np.square(c, dtype=np.float64))) for c in
                          control.values()))
            + math.sqrt(sum(float(np.sum(np.square(m))) for m in moves.values())))
    return delta, size


def read_control_delta(msg: Message, reference: dict[str, np.ndarray]
                       ) -> dict[str, np.ndarray] | str:
    """The reply's Delta c_k, or why it cannot be used: the record is there with exactly the
    parameters' keys, each array of the parameter's shape and float dtype, all finite."""
    if CONTROL_DELTA not in msg.content.array_records:
        return f"reply lacks the '{CONTROL_DELTA}' record"
    record = msg.content.array_records[CONTROL_DELTA]
    if set(record.keys()) != set(reference):
        return f"'{CONTROL_DELTA}' keys differ from the model's parameters"
    out = {}
    for key, ref in reference.items():
        try:
            value = record[key].numpy()
        except Exception as err:  # unreadable bytes
            return f"'{CONTROL_DELTA}' array '{key}' cannot be read: {err}"
        if value.shape != ref.shape or value.dtype != ref.dtype:
            return (f"'{CONTROL_DELTA}' array '{key}' is {value.dtype}{list(value.shape)}, "
                    f"expected {ref.dtype}{list(ref.shape)}")
        if not np.isfinite(value).all():
            return f"'{CONTROL_DELTA}' array '{key}' holds NaN or infinite values"
        out[key] = value
    return out


class Scaffold(DriftStrategy):
    """``param_keys``: the trainable parameters' names; ``num_clients``: K; ``lr``,
    ``momentum``: the clients' SGD; ``divisor``: the clients' a_k (effective or steps)."""

    spec = declared.SCAFFOLD
    server_columns = frozenset({"server_control_norm"})
    payload_words = "SCAFFOLD's control deltas"

    def __init__(self, *, param_keys: tuple[str, ...], num_clients: int, lr: float,
                 momentum: float, divisor: str = "effective", **kwargs):
        super().__init__(**kwargs)
        self.param_keys = tuple(param_keys)
        self.num_clients = num_clients
        self.lr, self.momentum, self.divisor = lr, momentum, divisor
        self.control: dict[str, np.ndarray] | None = None  # c, float64
        self.sent: dict[str, np.ndarray] = {}  # c as this round sent it (the model's dtype)
        self.deltas: dict[int, dict[str, np.ndarray]] = {}  # this round's checked Delta c_k

    @classmethod
    def arguments(cls, settings, *, model, aux_set, experiment, **_):
        return {"param_keys": tuple(n for n, p in model.named_parameters() if p.requires_grad),
                "num_clients": experiment.num_clients, "lr": experiment.lr,
                "momentum": experiment.momentum, "divisor": settings.divisor}

    def knowledge(self, server_round: int) -> dict:
        if self.control is None:  # c = 0 at the start
            self.control = {k: np.zeros(self.global_arrays[k].shape) for k in self.param_keys}
        self.sent = {k: c.astype(self.global_arrays[k].dtype) for k, c in self.control.items()}
        return {CONTROL: to_record(self.sent)}

    def scale(self, steps: float) -> float:
        a = nova_normaliser(steps, self.momentum) if self.divisor == "effective" else steps
        return a * self.lr

    def check_payload(self, update: ClientUpdate) -> str | None:
        """The reply's Delta c_k read, and recomputed from its own model and local-steps."""
        params = {k: self.global_arrays[k] for k in self.param_keys}
        delta = read_control_delta(update.message, params)
        if isinstance(delta, str):
            return delta
        expected, size = expected_delta(
            {k: c.astype(np.float64) for k, c in self.sent.items()}, params,
            update.arrays, self.scale(update.metrics[LOCAL_STEPS]))
        error = math.sqrt(sum(float(np.sum(np.square(delta[k] - expected[k])))
                              for k in expected))
        if not error <= CONTROL_TOLERANCE * size:
            return (f"'{CONTROL_DELTA}' differs from -c + (w_G - w_k)/(a_k lr) of its own "
                    f"model by {error:.3g} (allowed {CONTROL_TOLERANCE:g} x {size:.3g})")
        self.deltas[update.node_id] = delta
        return None

    def payload(self) -> dict[str, tuple[int, ...]]:
        return {k: self.global_arrays[k].shape for k in sorted(self.param_keys)}

    def screen(self, updates):
        return self.guard.peer_screen(self.report, updates, CONTROL_DELTA,
                                lambda u: model_norm(self.deltas[u.node_id]))

    def aggregate_train(self, server_round, replies):
        self.deltas = {}
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:  # c moves only with an accepted aggregate
            deltas = ([] if self.payload_sum is not None
                      else [self.deltas[u.node_id] for u in self.last_updates])
            self.deltas = {}  # scratch: a checkpoint need not keep them
            if self.payload_sum is not None:  # the release's (noised) sum
                control = {k: c + self.payload_sum[k] / self.num_clients
                           for k, c in self.control.items()}
            elif self.aggregation.robust:  # one huge Delta c_k counts as little as in the model
                combined = self.aggregation.combine(deltas, np.ones(len(deltas)))
                control = {k: c + len(deltas) / self.num_clients * combined[k]
                           for k, c in self.control.items()}
            else:
                control = update_control(self.control, deltas, self.num_clients)
            problem = self.guard.state_problem(control, self.control, self.payload_floor(
                self.num_clients), scale=move_scale([model_norm(d) for d in deltas],
                                                    len(deltas) / self.num_clients))
            if problem:
                self.guard.refuse_state(self.report, server_round, "SCAFFOLD's c", problem)
            else:
                self.control = control
        return arrays, metrics

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        if self.control is None:
            return {}
        return {"server_control_norm": math.sqrt(sum(float(np.sum(np.square(c)))
                                                     for c in self.control.values()))}


def update_control(control: dict[str, np.ndarray], deltas: list[dict[str, np.ndarray]],
                   num_clients: int) -> dict[str, np.ndarray]:
    """c + (1/K) sum_k Delta c_k (float64)."""
    return {k: c + sum(d[k].astype(np.float64) for d in deltas) / num_clients
            for k, c in control.items()}
