"""Each client's held-out test split (``client_test_fraction``), and the spread of the clients'
accuracies on it.

The split is a function of the client's labels (in the order its data is read), the experiment
seed and the partition id only: the server (which computes the partitions' histograms in
simulation) and the node (which reads its data in simulation or deployment) make the same split
of the same data. Within each class the samples are shuffled with that seed and the test share
is allotted by class (proportional allocation, largest remainders), so the split is stratified
as far as the client's label counts allow; the rest is what the client trains on.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ConfigError

SPLIT_PURPOSE = 7  # the SeedSequence key's last entry: the split's own stream
# a train reply's metrics: the received (global) model's and the trained model's accuracy on
# the held-out split, when the server asked for them
ACC_BEFORE, ACC_AFTER = "client-acc-before", "client-acc-after"


def held_out_count(n: int, fraction: float) -> int:
    """How many of n samples are held out: round(fraction n), at least 1, at most n - 1."""
    return min(n - 1, max(1, round(fraction * n)))


def check_splittable(n: int, fraction: float, client: str) -> None:
    """A client with fewer than 2 samples cannot keep one for training and one for testing."""
    if fraction > 0 and n < 2:
        raise ConfigError(f"{client} holds {n} example{'s' * (n != 1)}: too few to hold out "
                          f"client_test_fraction={fraction:g} of them for testing (needs at "
                          "least 2); use fewer clients or client_test_fraction=0")


def held_out_split(labels: np.ndarray, fraction: float, seed: int, partition_id: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, test positions) into ``labels``, both sorted; all of them train when
    ``fraction`` is 0."""
    labels = np.asarray(labels)
    n = len(labels)
    everything = np.arange(n)
    if fraction <= 0:
        return everything, everything[:0]
    check_splittable(n, fraction, f"partition {partition_id}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, partition_id + 1, SPLIT_PURPOSE]))
    classes, counts = np.unique(labels, return_counts=True)
    wanted = held_out_count(n, fraction) * counts / n
    per_class = np.floor(wanted).astype(int)
    # the seats left go to the largest remainders (ties: the rarer class last, then by label)
    left = held_out_count(n, fraction) - per_class.sum()
    order = sorted(range(len(classes)), key=lambda i: (-(wanted[i] - per_class[i]), -counts[i], i))
    for i in order[:left]:
        per_class[i] += 1
    test = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, per_class)]
    test = np.sort(np.concatenate(test)) if test else everything[:0]
    return np.setdiff1d(everything, test), test


def spread(accuracies: list[float]) -> dict[str, float]:
    """mean, std (population), worst10 (the mean of the worst ceil(10 %) of the clients, at
    least one) and best of the clients' accuracies."""
    values = np.sort(np.asarray(accuracies, dtype=np.float64))
    if not len(values):
        return {}
    worst = values[:max(1, math.ceil(0.1 * len(values)))]
    return {"mean": float(values.mean()), "std": float(values.std()),
            "worst10": float(worst.mean()), "best": float(values[-1])}
