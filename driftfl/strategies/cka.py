"""DCFL's server-side arithmetic: how alike two clients' data look, whom to select, and which
condensed images a client gets. Pure functions of arrays; the DCFL strategy holds the state.

- Linear CKA between clients' classifier weight matrices W (|Y| x d, a row per class):
  CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) with X, Y centred (every column minus
  its mean over the rows). High: the clients' classifiers, hence their data, are alike.
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
    if not total > 0:
        return np.full(len(sums), 1.0 / len(sums))
    return sums / total


def select_clients(explored: list[int], unexplored: list[int], matrix: np.ndarray, count: int,
                   epsilon: float, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(exploited, explored now): floor(epsilon * count) of ``explored`` drawn without
    replacement by Eq. 4 (``matrix`` over ``explored``, in that order), the rest of ``count``
    drawn uniformly from ``unexplored``; when either pool runs short the other fills in."""
    exploit = min(math.floor(epsilon * count + 1e-9), len(explored))
    explore = min(count - exploit, len(unexplored))
    exploit = min(count - explore, len(explored))  # fill from the explored when none remain
    chosen_old: list[int] = []
    if exploit:
        picks = rng.choice(len(explored), size=exploit, replace=False,
                           p=exploit_probabilities(matrix))
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
