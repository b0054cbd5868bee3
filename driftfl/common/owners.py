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
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .untrusted import regular_bytes

OWN_DATA = -1  # the partition id of a node that trains on its own folder or file
# the most examples one node may report: more than any single data owner here trains on in a
# round, and far below what would overflow a weight or a step count
MAX_EXAMPLES = 10**8
# max_examples_ratio's default (config.py): a node weighs as at most this x the median count
MAX_EXAMPLES_RATIO = 10.0
FIELDS = {"key", "partition", "num-examples"}
# the largest owners file read: about 80 bytes an entry, so room for some 50,000 nodes; a file
# past it (or /dev/zero) is refused before it is read whole
MAX_BYTES = 4 * 2**20
# a node id as `flwr supernode list` shows it: ASCII digits, no leading zero, so that no two
# spellings ("0111" and "111", Arabic-Indic digits) name one node
NODE_ID = re.compile(r"[1-9][0-9]{0,19}")
# a key's file name as `driftfl secure register` records it
KEY_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,254}")


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
    """Node id -> Owner from an owners file; ConfigError names the first problem: a missing,
    oversized or malformed file, a name given twice in one object, an entry that is not a node
    id with its key and partition, a partition outside 0..num_partitions-1 (when given), a
    partition or key given twice."""
    where = f"the owners file {path}"
    try:
        text = _bounded_bytes(Path(path), where)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist; `driftfl secure register` writes it beside "
                          "the keys (docs/deployment.md), or leave owners out") from None
    except OSError as err:
        raise ConfigError(f"{where} cannot be read ({err.strerror}); give the owners.json "
                          "`driftfl secure register` wrote") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_names)
    except RecursionError:  # the parser's own limit; an owners file nests two objects deep
        raise ConfigError(f"{where} nests deeper than an owners file (an object of objects); "
                          "write it again with `driftfl secure register`") from None
    except ValueError as err:  # not UTF-8 (json decodes the bytes), not JSON, a name twice
        raise ConfigError(f"{where} cannot be read as JSON ({ascii(str(err))[1:-1]}); write "
                          "it again with `driftfl secure register`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} is not a JSON object of node id -> key and partition")
    owners = {}
    for node, entry in data.items():
        owner = _entry(node, entry, num_partitions)
        if isinstance(owner, str):
            name = node if NODE_ID.fullmatch(node) else ascii(node)  # as it is, in one line
            raise ConfigError(f"{where}: node {name}: {owner}")
        owners[int(node)] = owner
    problem = owners_problem(owners)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return owners


def _bounded_bytes(path: Path, where: str) -> bytes:
    """The file's bytes, read only from a regular file and only up to MAX_BYTES (opened without
    blocking: a FIFO is refused, not waited on)."""
    data = regular_bytes(path, MAX_BYTES, links=True)  # the operator's own file may be a link
    if data == "not regular":
        raise ConfigError(f"{where} is not a regular file; give the owners.json "
                          "`driftfl secure register` wrote")
    if data == "too large":
        raise ConfigError(f"{where} is over {MAX_BYTES // 2**20} MiB, more than any owners "
                          "file holds; give the owners.json `driftfl secure register` wrote")
    return data


def _unique_names(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose names are each given once (json keeps the last one silently)."""
    out = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"{name!r} is given twice in one object")
        out[name] = value
    return out


def _entry(node: str, entry, num_partitions: int | None) -> Owner | str:
    """An entry as an Owner, or what is wrong with it."""
    if not NODE_ID.fullmatch(node) or not int(node) < 2**64:
        return ("is not a node id (a positive integer in ASCII digits without leading zeros, "
                "as `flwr supernode list` shows it)")
    if not isinstance(entry, dict) or not {"key", "partition"} <= set(entry):
        return 'expected {"key": "<file>.key.pub", "partition": <id>}'
    if set(entry) - FIELDS:
        return f"unknown field(s) {', '.join(sorted(set(entry) - FIELDS))}; valid: " \
               f"{', '.join(sorted(FIELDS))}"
    key, partition, n = entry["key"], entry["partition"], entry.get("num-examples")
    top = f"0..{num_partitions - 1}" if num_partitions else "0 or more"
    if not isinstance(key, str) or not KEY_NAME.fullmatch(key):
        return ("'key' must be the key's file name (ASCII letters, digits and ._+-, not "
                "starting with '.')")
    if (not isinstance(partition, int) or isinstance(partition, bool) or partition < OWN_DATA
            or (num_partitions is not None and partition >= num_partitions)):
        return (f"'partition' is {partition!r}; expected {OWN_DATA} (own data) or {top} "
                "(num_clients)")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool)
                          or not 0 < n <= MAX_EXAMPLES):
        return f"'num-examples' is {n!r}; expected a count from 1 to {MAX_EXAMPLES:.0e}"
    return Owner(key, partition, n)


def undeclared_counts(owners: dict[int, Owner] | None, nodes: int, ratio: float) -> str | None:
    """What a node whose example count the owners file does not declare can take of the
    example-weighted means among ``nodes`` nodes (None: every count is declared): it may claim
    up to MAX_EXAMPLES and then weighs as ``ratio`` (max_examples_ratio) x the survey's lower
    median count (ReplyGuard.weight_cap), r / (r + K - 1) of a mean whose other K - 1 nodes
    hold equal counts."""
    undeclared = (nodes if owners is None else
                  sum(owner.num_examples is None for owner in owners.values()))
    if not undeclared:
        return None
    share = 1.0 if math.isinf(ratio) else ratio / (ratio + max(nodes, 1) - 1)
    which = ("there is no owners file" if owners is None else
             f"the owners file declares none for {undeclared} of its {len(owners)} keys")
    return (f"example counts are not declared ({which}): a node may claim more examples than "
            f"it holds and then weighs as max_examples_ratio={ratio:g} x the survey's lower "
            f"median count, {share:.1%} of every weighted mean among {nodes} nodes of equal "
            "size; declare each node's count with `driftfl secure register --examples KEY=N`")


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
