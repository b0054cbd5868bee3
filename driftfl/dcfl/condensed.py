"""What a client's condensed set must be before DCFL stores it, and what DCFL's pre-trained model
must be before it replaces w^0.

- **Reply.** ``read_condensed``: float32 images of the experiment's shape, finite, pixels within
  +-1e4, labels in range, at most ipc images of each class; and (``check_condensed``) only of
  classes the node holds by its surveyed label histogram: a client condenses what it holds.
- **Peers.** A set's size, its largest image norm (one outsized image is enough to steer the
  pre-training), may be at most ``max_peer_ratio`` x the lower median of the non-zero sizes of
  the sets already stored and those arriving with it (``outsized``): the store's honest sets keep
  a lone newcomer in line too, and an all-zero set cannot make every later one outsized. Fewer
  than three non-zero sizes set no bar (``guard.peer_bar``): one tiny set would be the bar of
  the other.
- **Pre-trained model.** w^1 replaces w^0 only when ``guard.state_problem`` passes: finite, moved
  by at most ``max_update_ratio`` x max(1, ||w^0||), as an aggregate against the global model.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Message

from driftfl.dcfl.settings import read_condensed
from driftfl.common.error_replies import error_reason
from driftfl.common.protocol import CLASSIFIER, CONDENSED, METRICS

from driftfl.strategies.parts import guard
from driftfl.dcfl.shipped import figures

# No trained classifier weight comes near this; a larger one is corrupt or hostile (and would
# overflow the CKA products).
CLASSIFIER_BOUND = 1e4


def check_condensed(msg: Message, shape: tuple[int, ...], num_classes: int, ipc: int,
                    histogram: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | str:
    """(images, labels) of a reply's condensed set, or why it cannot be used (``histogram``: the
    node's surveyed label histogram; None: not checked)."""
    if CONDENSED not in msg.content.array_records:
        return f"reply lacks the '{CONDENSED}' record"
    checked = read_condensed(msg.content.array_records[CONDENSED], shape, num_classes, ipc)
    if isinstance(checked, str) or histogram is None:
        return checked
    unheld = sorted(set(np.unique(checked[1]).tolist()) - set(np.flatnonzero(histogram).tolist()))
    if unheld:
        return f"condensed images of classes {unheld}, which the node does not hold"
    return checked


def check_pretrain_reply(reply: Message, shape: tuple[int, ...], head: tuple[int, int],
                         ipc: int, histogram: np.ndarray | None):
    """(classifier, images, labels, what the node says it disclosed) of a pre-training reply,
    or why it cannot be used."""
    if reply.has_error():
        return error_reason(reply.error)
    condensed = check_condensed(reply, shape, head[0], ipc, histogram)
    if isinstance(condensed, str):
        return condensed
    try:
        weight = reply.content.array_records[CLASSIFIER]["weight"].numpy()
    except Exception as err:
        return f"classifier cannot be read: {err!r}"
    if weight.shape != head or not np.isfinite(weight).all() \
            or np.abs(weight).max() > CLASSIFIER_BOUND:
        return (f"classifier is {list(weight.shape)}, expected {list(head)} finite values "
                f"within +-{CLASSIFIER_BOUND:g}")
    return weight, *condensed, figures(reply.content.metric_records.get(METRICS, {}))


def image_norms(images: np.ndarray) -> np.ndarray:
    """Each image's L2 norm, in float64."""
    return np.sqrt(np.square(images.reshape(len(images), -1), dtype=np.float64).sum(axis=1))


def set_size(images: np.ndarray) -> float:
    """The largest L2 norm of one image of the set."""
    return float(image_norms(images).max(initial=0.0))


def outsized(new: list[np.ndarray], store: dict[int, tuple[np.ndarray, np.ndarray]],
             ratio: float) -> dict[int, str]:
    """Position in ``new`` (images) -> why, for the sets over ``ratio`` x the lower median size
    of the ``store``'s sets and the new ones (``guard.peer_bar``: none below three sets)."""
    sizes = [set_size(images) for images in new]
    median = guard.peer_bar(sizes + [set_size(images) for images, _ in store.values()])
    return {k: f"its condensed set's largest image norm {size:.3g} is over "
               f"max_peer_ratio={ratio:g} x the median {median:.3g} of the sets known"
            for k, size in enumerate(sizes) if not size <= ratio * median}


def bounded_sets(new: list[np.ndarray], store: dict[int, tuple[np.ndarray, np.ndarray]],
                 ratio: float) -> list[np.ndarray]:
    """Where clients are not trusted (trust=none): each new set's images scaled down to at most
    ``ratio`` x the lower median image norm of the stored and the new sets, so that no client's
    images outweigh the others' in the server's pre-training or another client's fine-tuning
    by their size (what they show is the client's own: a set with wrong labels stays wrong)."""
    known = [image_norms(images) for images in new] + [
        image_norms(images) for images, _ in store.values()]
    tau = ratio * guard.nonzero_lower_median(np.concatenate(known).tolist() if known else [])
    out = []
    for images, norms in zip(new, known):
        factors = np.minimum(1.0, tau / np.where(norms > 0, norms, np.inf))
        out.append(images if (factors == 1.0).all() else (
            images * factors.reshape(-1, *[1] * (images.ndim - 1))).astype(images.dtype))
    return out


def copied_head(classifier: np.ndarray, sent: np.ndarray | None) -> str | None:
    """Why a classifier cannot be compared with the others (None: it can): it is the head its
    client was sent, unchanged, so it did not train, and its CKA row of 0 would make it every
    group's most complementary client."""
    if sent is not None and np.array_equal(classifier, sent):
        return "its classifier is the head it was sent, unchanged: it did not train"
    return None
