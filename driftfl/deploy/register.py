"""`driftfl secure register`: node keys registered with the SuperLink, and the owners file.

Flower gives a key its node id when the key is registered, and a SuperNode that signs with the
key always gets that id (``--enable-supernode-auth``), so the id stands for the key. For each
key registered (or found registered already) the owners file records its node id, its file
name and the partition its owner holds: ``node-<i>.key.pub`` holds partition i unless
``--partition`` says otherwise. An experiment that names the file (``owners=``) accepts from
each node only its own partition (driftfl/common/owners.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.common.paths import console_script
from driftfl.deploy.checks import writable_folder
from driftfl.common.owners import (KEY_NAME, MAX_EXAMPLES, MAX_EXAMPLES_RATIO, OWN_DATA, Owner,
                                   owners_problem, read_owners, undeclared_counts, write_owners)

ALREADY_REGISTERED = "Public key already in use"  # flwr's answer to a key registered before
NUMBERED = re.compile(r"node-(0|[1-9][0-9]*)\.key\.pub")  # the keys `driftfl secure init` makes


def planned_owners(keys: list[Path], partitions: list[str], examples: list[str]
                   ) -> dict[str, Owner]:
    """Key file name -> Owner, from the keys' names and ``--partition``/``--examples``
    (KEY=VALUE, KEY a key's file name); ConfigError names the first problem."""
    names = {key.name for key in keys}
    for name in sorted(names):
        if not KEY_NAME.fullmatch(name):
            raise ConfigError(f"key file {ascii(name)}: the owners file records a key by a name "
                              "of ASCII letters, digits and ._+- (not starting with '.'); "
                              "rename the file")
    given = {"--partition": _assignments("--partition", partitions, names),
             "--examples": _assignments("--examples", examples, names)}
    owners = {}
    for name in sorted(names):
        partition = given["--partition"].get(name)
        if partition is None:
            numbered = NUMBERED.fullmatch(name)
            if not numbered:
                raise ConfigError(f"which partition does {name} hold? say --partition {name}=P "
                                  "(or =own for data of its own)")
            partition = numbered.group(1)
        owners[name] = Owner(name, _count("--partition", name, partition, OWN_DATA),
                             _count("--examples", name, given["--examples"].get(name), 1))
    return owners


def _assignments(option: str, values: list[str], names: set[str]) -> dict[str, str]:
    out = {}
    for value in values:
        name, _, number = value.partition("=")
        if name not in names:
            raise ConfigError(f"{option} {value}: {name or 'KEY'} is not among the keys to "
                              f"register ({', '.join(sorted(names))}); write {option} KEY=N")
        out[name] = number
    return out


def _count(option: str, name: str, value: str | None, least: int) -> int | None:
    """``value`` as an integer of at least ``least`` ('own': OWN_DATA, for --partition)."""
    if value is None:
        return None
    if option == "--partition" and value == "own":
        return OWN_DATA
    # ASCII digits in one spelling: "01" or Arabic-Indic digits would name the same number
    if not re.fullmatch(r"0|[1-9][0-9]*", value) or not least <= int(value) <= MAX_EXAMPLES:
        what = "a partition id or own" if option == "--partition" else "a positive count"
        raise ConfigError(f"{option} {name}={value}: expected {what}")
    return int(value)


def merged(existing: dict[int, Owner], new: dict[int, Owner]) -> dict[int, Owner]:
    """The owners file's entries with the new ones in place of those of the same keys; a
    partition given twice is a ConfigError."""
    names = {o.key for o in new.values()}
    owners = {n: o for n, o in existing.items() if o.key not in names and n not in new}
    owners.update(new)
    problem = owners_problem(owners)
    if problem:
        raise ConfigError(problem)
    return owners


def existing_owners(owners_file: Path, planned: dict[str, Owner]) -> dict[int, Owner]:
    """The owners file's entries, once the planned ones are known to fit among them (no
    partition held twice); ConfigError, before anything is registered, where they do not."""
    writable_folder(owners_file.parent, "the owners file's folder",
                    "give another place with --owners FILE")
    existing = read_owners(owners_file) if owners_file.exists() else {}
    holders = {o.partition: f"{o.key} (node {n}) in {owners_file}"
               for n, o in existing.items() if o.key not in planned}
    for owner in planned.values():
        if owner.partition != OWN_DATA and owner.partition in holders:
            raise ConfigError(f"{owner.key} would hold partition {owner.partition}, which "
                              f"{holders[owner.partition]} holds; give it another with "
                              f"--partition {owner.key}=P")
        holders[owner.partition] = owner.key
    return existing


def register(connection: str, keys: list[Path], owners_file: Path,
             planned: dict[str, Owner], existing: dict[int, Owner]) -> int:
    """Register each key through ``connection`` and record it with the ``existing`` entries
    in ``owners_file``; the number of keys that could not be registered."""

    ids, failed = {}, 0
    for key in keys:
        out = subprocess.run([console_script("flwr"), "supernode", "register", str(key), connection,
                              "--format", "json"], capture_output=True, text=True)
        try:
            reply = json.loads(out.stdout)
        except ValueError:
            reply = {"success": False, "error-message": out.stdout + out.stderr}
        # flwr's message starts with which SuperLink it used: its last line says what happened
        said = [line for line in str(reply.get("error-message", "")).splitlines()
                if line and not line.startswith("For more information")]
        if reply.get("success"):
            ids[key.name] = int(reply["node-id"])
            print(f"{key.name}: registered as node {ids[key.name]}")
        elif said and ALREADY_REGISTERED in said[-1] and (
                node := registered_ids(connection).get(key_bytes(key))):
            ids[key.name] = node
            print(f"{key.name}: already registered as node {node}")
        else:
            failed += 1
            print(f"{key.name}: not registered: {' '.join(said[-2:]) or reply}", file=sys.stderr)
    if not ids:
        return failed
    owners = merged(existing, {ids[k]: planned[k] for k in ids})
    write_owners(owners_file, owners)
    print(f"{owners_file}: {len(owners)} node(s) and the partitions they hold; name it in the "
          f"experiment (owners={owners_file.resolve()}) on the SuperLink's machine")
    if says := undeclared_counts(owners, len(owners), MAX_EXAMPLES_RATIO):
        print(f"driftfl: WARNING: {says}", file=sys.stderr)
    return failed


def key_bytes(path: Path) -> bytes:
    """A public key as Flower stores it (PEM SubjectPublicKeyInfo)."""
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    return public_key_to_bytes(load_ssh_public_key(path.read_bytes()))


def registered_ids(connection: str) -> dict[bytes, int]:
    """Public key -> node id of every key registered with the SuperLink (Flower's Control API:
    `flwr supernode list` prints the ids, not the keys)."""
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import ListNodesRequest

    client = init_http_client_from_connection(read_superlink_connection(connection))
    try:
        nodes = client.ListNodes(ListNodesRequest()).nodes_info
    finally:
        client.close()
    return {bytes(n.public_key): n.node_id for n in nodes if n.status != "unregistered"}
