"""The owners file: which node holds which partition in a deployment with node authentication.

`driftfl secure register` writes it (``owners.json`` beside the keys): for each registered key,
the node id Flower gave it, the key's file name, the partition its owner holds and, optionally,
how many examples that is. Flower 1.42 fixes a node's id when its key is registered, and a
SuperNode signing with that key always gets that id, so the id stands for the key. The
experiment names the file (``owners=<path>``, a path on the SuperLink's machine) and the data
survey then accepts from each node only the partition its key was given::

    {"8716394152": {"key": "node-0.key.pub", "partition": 0, "num-examples": 6000},
     "2201938475": {"key": "lab-b.key.pub", "partition": -1}}

(-1: the node trains on its own data, no partition; ``num-examples`` may be left out.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

OWN_DATA = -1  # the partition id of a node that trains on its own folder or file
# the most examples one node may report: more than any single data owner here trains on in a
# round, and far below what would overflow a weight or a step count
MAX_EXAMPLES = 10**8
FIELDS = {"key", "partition", "num-examples"}


@dataclass(frozen=True)
class Owner:
    """One registered key: its file name, its partition and, if declared, its example count."""

    key: str
    partition: int
    num_examples: int | None = None

    def to_json(self) -> dict:
        entry = {"key": self.key, "partition": self.partition}
        return entry | ({"num-examples": self.num_examples} if self.num_examples else {})


def partition_name(partition: int) -> str:
    return "its own data" if partition == OWN_DATA else f"partition {partition}"


def read_owners(path: Path, num_partitions: int | None = None) -> dict[int, Owner]:
    """Node id -> Owner from an owners file; ConfigError names the first problem: a missing or
    malformed file, an entry that is not a node id with its key and partition, a partition
    outside 0..num_partitions-1 (when given), a partition or key given twice."""
    where = f"the owners file {path}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist; `driftfl secure register` writes it beside "
                          "the keys (docs/deployment.md), or leave owners out") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where} cannot be read as JSON ({err}); write it again with "
                          "`driftfl secure register`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} is not a JSON object of node id -> key and partition")
    owners = {}
    for node, entry in data.items():
        owner = _entry(node, entry, num_partitions)
        if isinstance(owner, str):
            raise ConfigError(f"{where}: node {node}: {owner}")
        owners[int(node)] = owner
    problem = owners_problem(owners)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return owners


def _entry(node: str, entry, num_partitions: int | None) -> Owner | str:
    """An entry as an Owner, or what is wrong with it."""
    if not node.isdigit() or not 0 < int(node) < 2**64:
        return "is not a node id (a positive integer, as `flwr supernode list` shows it)"
    if not isinstance(entry, dict) or not {"key", "partition"} <= set(entry):
        return 'expected {"key": "<file>.key.pub", "partition": <id>}'
    if set(entry) - FIELDS:
        return f"unknown field(s) {', '.join(sorted(set(entry) - FIELDS))}; valid: " \
               f"{', '.join(sorted(FIELDS))}"
    key, partition, n = entry["key"], entry["partition"], entry.get("num-examples")
    top = f"0..{num_partitions - 1}" if num_partitions else "0 or more"
    if not isinstance(key, str) or not key:
        return "'key' must be the key's file name"
    if (not isinstance(partition, int) or isinstance(partition, bool) or partition < OWN_DATA
            or (num_partitions is not None and partition >= num_partitions)):
        return (f"'partition' is {partition!r}; expected {OWN_DATA} (own data) or {top} "
                "(num_clients)")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool)
                          or not 0 < n <= MAX_EXAMPLES):
        return f"'num-examples' is {n!r}; expected a count from 1 to {MAX_EXAMPLES:.0e}"
    return Owner(key, partition, n)


def owners_problem(owners: dict[int, Owner]) -> str | None:
    """A partition or a key name given to two nodes, or None."""
    seen: dict[object, int] = {}
    for node, owner in owners.items():
        for what in (("partition", owner.partition), ("key", owner.key)):
            if what == ("partition", OWN_DATA):
                continue  # any number of nodes may train on data of their own
            if what in seen:
                first = owners[seen[what]]
                fix = ("give each partition to one key (driftfl secure register --partition "
                       "KEY=P)" if what[0] == "partition" else
                       "a key has one node id: drop the stale entry, or register again")
                return (f"{what[0]} {what[1]} is given to both node {seen[what]} ({first.key}) "
                        f"and node {node} ({owner.key}); {fix}")
            seen[what] = node
    return None


def write_owners(path: Path, owners: dict[int, Owner]) -> None:
    """Write the owners file, entries by partition."""
    order = sorted(owners, key=lambda n: (owners[n].partition, owners[n].key))
    Path(path).write_text(json.dumps({str(n): owners[n].to_json() for n in order}, indent=1)
                          + "\n")
