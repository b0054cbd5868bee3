"""Partitions through flwr-datasets: disjoint, complete, skewed as asked, cached on disk."""

from __future__ import annotations

import numpy as np
import pytest

from driftfl.common import partition as part
from driftfl.common.errors import ConfigError

LABELS = np.repeat(np.arange(10), 100)  # 1000 samples, 10 balanced classes
DIRICHLET = {"name": "dirichlet", "alpha": 0.5, "min_size": 10, "self_balancing": False}


def assert_disjoint_cover(parts, n):
    everything = np.concatenate(parts)
    assert len(everything) == len(np.unique(everything)) == n


@pytest.mark.parametrize("spec", [
    {"name": "iid"}, DIRICHLET,
    {"name": "pathological", "classes_per_client": 2, "assignment": "random"},
    {"name": "shards", "shards_per_client": 2}])
def test_every_sample_goes_to_exactly_one_client(spec):
    parts = part.compute_partition(LABELS, spec, 10, seed=0)
    assert len(parts) == 10
    if spec["name"] == "pathological":  # classes no client drew are left out
        everything = np.concatenate(parts)
        assert len(everything) == len(np.unique(everything))
    else:
        assert_disjoint_cover(parts, len(LABELS))


def test_pathological_gives_each_client_k_classes():
    spec = {"name": "pathological", "classes_per_client": 3, "assignment": "random"}
    for indices in part.compute_partition(LABELS, spec, 8, seed=1):
        assert len(np.unique(LABELS[indices])) == 3


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def mean_classes_held(alpha):
        spec = dict(DIRICHLET, alpha=alpha, min_size=1)
        parts = part.compute_partition(LABELS, spec, 10, seed=0)
        return np.mean([(np.bincount(LABELS[p], minlength=10) > 0).sum() for p in parts])

    assert mean_classes_held(0.05) < mean_classes_held(100.0) == 10


def test_dirichlet_respects_min_size():
    parts = part.compute_partition(LABELS, dict(DIRICHLET, alpha=0.3, min_size=40), 10, seed=3)
    assert min(len(p) for p in parts) >= 40


def test_iid_is_shuffled_and_balanced():
    parts = part.compute_partition(LABELS, {"name": "iid"}, 10, seed=0)
    assert {len(p) for p in parts} == {100}
    assert all(len(np.unique(LABELS[p])) > 5 for p in parts)  # not one sorted block


def test_seed_fixes_the_partition_and_changes_it():
    a = part.compute_partition(LABELS, DIRICHLET, 5, seed=0)
    b = part.compute_partition(LABELS, DIRICHLET, 5, seed=0)
    c = part.compute_partition(LABELS, DIRICHLET, 5, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_cache_is_written_once_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFTFL_CACHE", str(tmp_path))
    first = part.partition(LABELS, DIRICHLET, 4, seed=0)
    files = list((tmp_path / "partitions").glob("*.npz"))
    assert len(files) == 1
    monkeypatch.setattr(part, "compute_partition", lambda *a: pytest.fail("cache not used"))
    again = part.partition(LABELS, DIRICHLET, 4, seed=0)
    assert all(np.array_equal(x, y) for x, y in zip(first, again))


@pytest.mark.parametrize("spec, clients, message", [
    (dict(DIRICHLET, alpha=0), 10, "partition.alpha must be > 0"),
    (dict(DIRICHLET, alpha=-1), 10, "partition.alpha must be > 0"),
    ({"name": "pathological", "classes_per_client": 0, "assignment": "random"}, 10,
     r"classes_per_client must be in 1..10, got 0"),
    ({"name": "pathological", "classes_per_client": 11, "assignment": "random"}, 10,
     r"classes_per_client must be in 1..10, got 11"),
    ({"name": "iid"}, 2000, "num_clients=2000 is more than the 1000 training samples"),
    ({"name": "bogus"}, 10, "unknown partition 'bogus'; valid: dirichlet, iid, pathological"),
    (dict(DIRICHLET, min_size=200), 10, "lower partition.min_size"),
])
def test_impossible_partitions_are_refused_up_front(spec, clients, message):
    with pytest.raises(ConfigError, match=message):
        part.check_partition(spec, clients, 10, len(LABELS))


def test_unreachable_dirichlet_min_size_is_a_config_error():
    with pytest.raises(ConfigError, match=r"Dirichlet\(alpha=0.01\).*raise partition.alpha"):
        part.compute_partition(LABELS, dict(DIRICHLET, alpha=0.01, min_size=90), 10, seed=0)
