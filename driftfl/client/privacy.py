"""What a client does for differential privacy before it replies (driftfl.common.privacy).

- ``privacy=distributed``: the client clips its own update w_k - w to the clip norm C and adds
  its share of the round's noise, N(0, (sigma C)^2 / m_min) per coordinate, m_min the noise
  shares the experiment's min_survivors asks for (computed from the experiment, not told per
  round). The noise comes from the operating system's entropy, never from the experiment's
  seed: the server knows the seed, and noise it could regenerate would protect nothing.
- a method's payload that the server takes as a sum (the record and arrays the train message
  names: SCAFFOLD's control delta, FedCurv's change of Fisher terms, FedProto's and FedCSD's
  class prototypes) gets the same under ``distributed``: clipped to ``privacy.payload_clip``
  C_p, plus N(0, (sigma C_p)^2 / m_min). The reply then carries that record's summed arrays
  and nothing else beside the model and the two metrics (a prototype record's per-class
  counts stay on the client: the server's denominators are public).
- a client whose training diverged (a non-finite update or payload) sends zeros, clipped and
  noised as any update: a NaN reply would tell the server outside the noise that its data made
  training diverge, and under SecAgg+ would wreck the whole round's sum.
- under any privacy setting the reply's metrics are cut to what the server's checks need and
  the data survey disclosed already (examples, local steps): a training loss or a logit shift
  per client is a release about the client's data that no noise covers.
"""

from __future__ import annotations

import sys

import numpy as np
from flwr.app import Array, ArrayRecord

from driftfl.common.privacy import PrivacySettings, add_noise, clip_update
from driftfl.common.protocol import LOCAL_STEPS, NUM_EXAMPLES


def noise_shares(experiment) -> int:
    """m_min of this experiment (privacy=distributed): each client's share is 1 / m_min of the
    noise's variance."""
    return experiment.privacy.noise_shares(experiment.clients_per_round)


def payload_clip(experiment) -> float | None:
    """The norm a client's payload term is clipped to before it is summed (None: not
    clipped): under DP, by the server (central) or by the client (distributed) alike."""
    return experiment.privacy.payload_clip if experiment.privacy.enabled else None


def finite_or_zero(arrays: list[np.ndarray], what: str) -> list[np.ndarray]:
    """``arrays``, or zeros where any of them is not finite (the client's own console says so;
    nothing of it is sent)."""
    if all(np.isfinite(a).all() for a in arrays):
        return arrays
    print(f"driftfl node: its {what} is not finite (training diverged): it sends zeros, noised",
          file=sys.stderr, flush=True)
    return [np.zeros_like(a) for a in arrays]


def privatise(trained: ArrayRecord, received: ArrayRecord, settings: PrivacySettings,
              shares: int, rng: np.random.Generator | None = None) -> ArrayRecord:
    """The trained model to send: the received one plus the clipped, noised update
    (``privacy=distributed``; the trained model as it is otherwise). ``shares``: m_min.

    What is released is decided by the node's own model (``trained``: its names, shapes and
    dtypes; the received arrays were checked against it on loading, job.model): every float
    entry's update is clipped and noised as one vector, and an entry that is not a float (a
    BatchNorm's batch count) goes back as it was received, so that nothing else of this
    node's training leaves it."""
    if settings.name != "distributed":
        return trained
    end = {k: trained[k].numpy() for k in trained}
    start = {k: received[k].numpy() for k in end}
    keys = [k for k, v in end.items() if v.dtype.kind == "f"]
    delta = finite_or_zero([end[k] - start[k] for k in keys], "update")
    delta, _ = clip_update(delta, settings.clip, in_place=True)
    noised = add_noise(delta, settings.share_noise_std(shares), rng)  # rng None: OS entropy
    out = dict(start)  # what is not a float goes back as the server sent it
    for key, value in zip(keys, noised):
        out[key] = (start[key] + value).astype(end[key].dtype)
    return ArrayRecord({k: Array(np.ascontiguousarray(out[k])) for k in end})


def privatise_payload(records: dict[str, ArrayRecord], settings: PrivacySettings, shares: int,
                      summed: tuple[str, list[str]] | None,
                      rng: np.random.Generator | None = None) -> dict[str, ArrayRecord]:
    """The reply's records (``privacy=distributed``: only the summed payload, ``summed`` = (its
    record, its arrays), each clipped and noised; as they are otherwise). Only records this
    node's objective made can be named, and whatever the message names of them is clipped
    and noised as floats whatever its dtype; what it does not name stays on the node."""
    if settings.name != "distributed":
        return records
    if summed is None or summed[0] not in records:
        return {}  # nothing leaves a client under DP but the noised release
    name, keys = summed
    arrays = {k: records[name][k].numpy() for k in keys if k in records[name]}
    terms = finite_or_zero([arrays[k].astype(np.float64) for k in arrays], name)
    clipped, _ = clip_update(terms, settings.payload_clip, in_place=True)
    noised = add_noise(clipped, settings.share_noise_std(shares, settings.payload_clip), rng)
    return {name: ArrayRecord({k: Array(np.ascontiguousarray(v.astype(arrays[k].dtype)))
                               for k, v in zip(arrays, noised)})}


def disclosed_metrics(metrics: dict, settings: PrivacySettings) -> dict:
    """The metrics a reply may carry: all of them without privacy; examples and steps with."""
    if not settings.enabled:
        return metrics
    return {k: metrics[k] for k in (NUM_EXAMPLES, LOCAL_STEPS)}
