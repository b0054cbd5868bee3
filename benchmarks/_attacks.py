"""The attackers of benchmarks/containment.py that read a round's statistics (``--attack``
alie, alie-own, ipm, radius): every attacker sends the same forged vector for the model update
and for each payload that feeds state, made from the round's honest replies.

- ``alie`` (Baruch et al. 2019, "A little is enough"), the colluding view: the attackers see
  every honest reply of the round and send mean - z std, coordinate-wise, z = 1.5;
- ``alie-own``, the own view: the attackers see only their own honest replies; mean and std are
  taken over them (with one attacker: mean = its own vector, std = the coordinate-wise std of
  its own honest vectors over the rounds so far, |its vector| in round 1);
- ``ipm`` (Xie et al. 2019, inner-product manipulation): -eps x the honest mean, eps = 0.5;
- ``radius``: just inside trust=none's bound: the honest vectors' coordinate-wise median m plus
  0.99 tau along -(the honest mean), tau = clip_ratio x the lower median of the honest
  vectors' distances to m (the colluding view).

The vectors: the model update w_k - w_G (SCAFFOLD's Delta c_k then recomputed from it, as the
server checks it; FedDyn's move is that update), each held class's prototype row (FedProto,
FedCSD: over the honest holders of that class; counts as the attacker's own), each condensed
image (DCFL: per class, over the honest clients' images of that class, one forged image per
image held). A classifier or Fisher term stays the attacker's own honest one.
"""

from __future__ import annotations

import numpy as np

Z, EPS, RADIUS = 1.5, 0.5, 0.99


def lower_median(values: list[float]) -> float:
    values = sorted(v for v in values if v > 0)
    return values[(len(values) - 1) // 2] if values else 0.0



def carrying(own: list, honest: list, name: str) -> tuple[list, list, list]:
    """(the attackers' replies that carry record ``name``, those records' arrays, the honest
    replies' arrays of it)."""
    mine = [r for r in own if name in r.content.array_records]
    return (mine, [arrays_of(r.content.array_records[name]) for r in mine],
            [arrays_of(r.content.array_records[name]) for r in honest
             if name in r.content.array_records])

class Forger:
    """One attack's forged vector from the honest ones (flattened float64 arrays)."""

    def __init__(self, attack: str, clip_ratio: float):
        self.attack, self.clip_ratio = attack, clip_ratio
        self.history: dict[str, list[np.ndarray]] = {}  # own view: own vectors by stream

    def forge(self, honest: list[np.ndarray], own: list[np.ndarray], stream: str) -> np.ndarray:
        """``honest``: the round's honest clients' vectors; ``own``: the attackers' own honest
        ones; ``stream``: which vector this is (its own-view history)."""
        if self.attack == "alie-own":
            if len(own) > 1:
                return np.mean(own, axis=0) - Z * np.std(own, axis=0)
            seen = self.history.setdefault(stream, [])
            seen.append(own[0])
            spread = np.std(seen, axis=0) if len(seen) > 1 else np.abs(own[0])
            return own[0] - Z * spread
        if not honest:
            return own[0]
        stack = np.stack(honest)
        mean = stack.mean(axis=0)
        if self.attack == "alie":
            return mean - Z * stack.std(axis=0)
        if self.attack == "ipm":
            return -EPS * mean
        if self.attack == "radius":
            centre = np.median(stack, axis=0)
            tau = self.clip_ratio * lower_median(
                [float(np.linalg.norm(v - centre)) for v in stack])
            size = float(np.linalg.norm(mean))
            return centre - RADIUS * tau * mean / size if size else centre
        raise ValueError(self.attack)


def flat(arrays: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    return np.concatenate([arrays[k].astype(np.float64).ravel() for k in keys])


def unflat(vector: np.ndarray, like: dict[str, np.ndarray], keys: list[str]) -> dict:
    out, start = {}, 0
    for k in keys:
        size = like[k].size
        out[k] = vector[start:start + size].reshape(like[k].shape)
        start += size
    return out


def arrays_of(record) -> dict[str, np.ndarray]:
    return {k: record[k].numpy() for k in record.keys()}


class RoundAttacker:
    """Forges the replies of the nodes ``attackers`` once the round's replies are all in (see
    the module's docstring)."""

    def __init__(self, cfg, strategy, attack: str, attackers: set[int]):
        self.cfg, self.strategy, self.attackers = cfg, strategy, attackers
        self.forger = Forger(attack, cfg.clip_ratio)

    def forge_round(self, sent: dict, replies: list) -> list:
        good = [r for r in replies if not r.has_error()]
        own = [r for r in good if r.metadata.src_node_id in self.attackers]
        honest = [r for r in good if r.metadata.src_node_id not in self.attackers]
        if own:
            self.model(sent, own, honest)
            for name in self.prototype_records():
                self.prototypes(name, own, honest)
            self.condensed(own, honest)
        return replies

    def model(self, sent: dict, own: list, honest: list) -> None:
        from flwr.app import Array, ArrayRecord
        from driftfl.common.protocol import ARRAYS, CONTROL, CONTROL_DELTA, LOCAL_STEPS, METRICS
        message = sent[own[0].metadata.src_node_id]
        if ARRAYS not in message.content.array_records or \
                ARRAYS not in own[0].content.array_records:
            return
        g = arrays_of(message.content.array_records[ARRAYS])
        keys = sorted(k for k, v in g.items() if v.dtype.kind == "f")
        gf = flat(g, keys)
        moves = [flat(arrays_of(r.content.array_records[ARRAYS]), keys) - gf
                 for r in (*honest, *own)]
        forged = unflat(gf + self.forger.forge(moves[:len(honest)], moves[len(honest):],
                                               "model"), g, keys)
        for reply in own:
            w = {k: forged[k].astype(g[k].dtype) if k in forged else v
                 for k, v in arrays_of(reply.content.array_records[ARRAYS]).items()}
            reply.content[ARRAYS] = ArrayRecord({k: Array(v) for k, v in w.items()})
            if CONTROL_DELTA in reply.content.array_records:  # consistent with the model
                from driftfl.strategies.methods.scaffold import expected_delta
                control = arrays_of(message.content.array_records[CONTROL])
                steps = reply.content.metric_records[METRICS][LOCAL_STEPS]
                delta, _ = expected_delta({k: v.astype(np.float64) for k, v in control.items()},
                                          {k: g[k] for k in control}, w,
                                          self.strategy.scale(steps))
                reply.content[CONTROL_DELTA] = ArrayRecord(
                    {k: Array(v.astype(g[k].dtype)) for k, v in delta.items()})

    @staticmethod
    def prototype_records():
        from driftfl.common.protocol import FEATURE_PROTOTYPES, PROTOTYPES
        return (PROTOTYPES, FEATURE_PROTOTYPES)

    def prototypes(self, name: str, own: list, honest: list) -> None:
        from flwr.app import Array, ArrayRecord
        mine, ours, others = carrying(own, honest, name)
        if not mine:
            return
        forged = {}
        for c in range(ours[0]["prototypes"].shape[0]):
            held = [p["prototypes"][c].astype(np.float64) for p in ours if p["counts"][c] > 0]
            if held:
                forged[c] = self.forger.forge(
                    [p["prototypes"][c].astype(np.float64) for p in others
                     if p["counts"][c] > 0], held, f"{name}{c}")
        for reply, p in zip(mine, ours):
            rows = p["prototypes"].copy()
            for c, row in forged.items():
                if p["counts"][c] > 0:
                    rows[c] = row.astype(rows.dtype)
            reply.content[name] = ArrayRecord({"prototypes": Array(rows),
                                               "counts": Array(p["counts"])})

    def condensed(self, own: list, honest: list) -> None:
        from flwr.app import Array, ArrayRecord
        from driftfl.common.protocol import CONDENSED
        mine, ours, sets = carrying(own, honest, CONDENSED)
        if not mine:
            return
        forged = {}
        for c in np.unique(np.concatenate([s["labels"] for s in ours])):
            held = [im.astype(np.float64).ravel() for s in ours
                    for im in s["images"][s["labels"] == c]]
            forged[c] = self.forger.forge(
                [im.astype(np.float64).ravel() for s in sets
                 for im in s["images"][s["labels"] == c]], held, f"condensed{c}")
        for reply, s in zip(mine, ours):
            images = s["images"].copy()
            for i, label in enumerate(s["labels"]):
                images[i] = forged[label].reshape(images[i].shape).astype(images.dtype)
            reply.content[CONDENSED] = ArrayRecord({"images": Array(images),
                                                    "labels": Array(s["labels"])})
