"""DCFL's server-side arithmetic: how alike two clients' data look, whom to select, and which
condensed images a client gets. Pure functions of arrays; the DCFL strategy holds the state.

- Linear CKA between clients' classifiers, a row per class (|Y| x d):
  CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) with X, Y centred (every column minus
  its mean over the rows). High: the clients' classifiers, hence their data, are alike. X is
  the client's update W_k - W_sent by default (``cka_input``), the weights W_k themselves under
  ``cka_of=weights``: the model every client starts from is common to all W_k and pulls every
  CKA towards 1 (benchmarks/cka_readings.py; docs/algorithms.md, DCFL).
- Selection (the paper's Eq. 4): an explored client i is exploited with probability
  proportional to sum_{j != i} M_ij over the explored clients.
- Complementary group: the explored clients least similar to the selected one.
- Filter: drop the share r of condensed images the global model gets worst (highest loss).
"""

from __future__ import annotations

import math

import numpy as np


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two matrices with the same rows (0 when either is constant)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    y = y - y.mean(axis=0, keepdims=True)
    denominator = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    if denominator == 0:
        return 0.0
    return float(np.linalg.norm(y.T @ x) ** 2 / denominator)


def cka_input(classifier: np.ndarray, sent: np.ndarray | None, of: str) -> np.ndarray:
    """What a client's CKA row compares: ``of="update"``: W_k - W_sent, the client's classifier
    less the one the server sent it (what its own data moved); ``of="weights"``: W_k."""
    weight = np.asarray(classifier, dtype=np.float64)
    if of == "weights":
        return weight
    if of != "update":
        raise ValueError(f"unknown CKA input {of!r}; valid: update, weights")
    if sent is None:  # a server bug, not a client's: say so rather than fill the row with NaN
        raise ValueError("the CKA of an update needs the classifier the client was sent")
    return weight - np.asarray(sent, dtype=np.float64)


def cka_matrix(weights: list[np.ndarray]) -> np.ndarray:
    """M_ij = linear CKA of weights[i] and weights[j] (symmetric, 1 on the diagonal unless a
    matrix is constant)."""
    n = len(weights)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            out[i, j] = out[j, i] = linear_cka(weights[i], weights[j])
    return out


def exploit_probabilities(matrix: np.ndarray) -> np.ndarray:
    """Eq. 4: p_i = sum_{j != i} M_ij / sum_i sum_{j != i} M_ij (uniform when all are 0)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    sums = matrix.sum(axis=1) - np.diag(matrix)
    total = sums.sum()
    if not 0 < total < math.inf:  # NaN and inf too: a draw needs finite probabilities
        return np.full(len(sums), 1.0 / len(sums))
    return sums / total


def selection_tv(matrix: np.ndarray) -> float:
    """Total-variation distance of Eq. 4's distribution p from uniform over the n explored
    clients: (1/2) sum_i |p_i - 1/n| (0: Eq. 4 is uniform; at most 1 - 1/n)."""
    if not len(matrix):
        return 0.0
    p = exploit_probabilities(matrix)
    return float(0.5 * np.abs(p - 1.0 / len(p)).sum())


def offdiagonal(matrix: np.ndarray) -> np.ndarray:
    """The entries M_ij, i < j (each pair once)."""
    matrix = np.asarray(matrix)
    return matrix[np.triu_indices(len(matrix), 1)]


def select_clients(explored: list[int], unexplored: list[int], matrix: np.ndarray, count: int,
                   epsilon: float, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(exploited, explored now): floor(epsilon * count) of ``explored`` drawn without
    replacement by Eq. 4 (``matrix`` over ``explored``, in that order), the rest of ``count``
    drawn uniformly from ``unexplored``; when either pool runs short the other fills in. When
    fewer explored clients than the picks have a non-zero Eq. 4 probability (a client whose
    update is 0, e.g. one returning the model it was sent, has a CKA row of 0), all of those
    are exploited and the rest drawn uniformly among the others: what drawing one at a time
    gives, each draw by Eq. 4 over those left and uniform once all left have probability 0."""
    exploit = min(math.floor(epsilon * count + 1e-9), len(explored))
    explore = min(count - exploit, len(unexplored))
    exploit = min(count - explore, len(explored))  # fill from the explored when none remain
    chosen_old: list[int] = []
    if exploit:
        p = exploit_probabilities(matrix)
        likely, unlikely = np.flatnonzero(p > 0), np.flatnonzero(p == 0)
        if len(likely) >= exploit:
            picks = rng.choice(len(explored), size=exploit, replace=False, p=p)
        else:
            picks = [*likely, *rng.choice(unlikely, size=exploit - len(likely), replace=False)]
        chosen_old = [explored[i] for i in picks]
    chosen_new = ([unexplored[i] for i in rng.choice(len(unexplored), size=explore,
                                                      replace=False)] if explore else [])
    return chosen_old, chosen_new


def complementary_group(client: int, explored: list[int], matrix: np.ndarray,
                        size: int) -> list[int]:
    """The ``size`` explored clients (other than ``client``) least similar to ``client`` by
    ``matrix`` (over ``explored``, in that order); ties keep the explored order."""
    row = matrix[explored.index(client)]
    others = [i for i in range(len(explored)) if explored[i] != client]
    others.sort(key=lambda i: row[i])
    return [explored[i] for i in others[:max(size, 0)]]


def keep_lowest_loss(losses: np.ndarray, ratio: float) -> np.ndarray:
    """Indices (ascending) of the images kept when the share ``ratio`` with the highest loss is
    dropped: floor(ratio * N) of them; ties broken by position."""
    losses = np.asarray(losses)
    drop = math.floor(ratio * len(losses) + 1e-9)
    order = np.argsort(-losses, kind="stable")
    return np.sort(order[drop:])
