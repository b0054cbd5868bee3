"""`driftfl secure`: credentials, the fleet proxy and node registration for a deployment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from driftfl.common.errors import ConfigError

DESCRIPTION = """\
A secure deployment, step by step (docs/deployment.md):
  1. driftfl secure init DIR --name <the SuperLink's host name or address> --nodes N
  2. flower-superlink on 127.0.0.1:9091 with DIR's certificate and --enable-supernode-auth
  3. driftfl secure connect <connection> --address 127.0.0.1:9091 --root-certificates DIR/ca.crt
     driftfl secure register <connection> DIR/node-*.key.pub    (the operator, on 127.0.0.1)
     (also writes DIR/owners.json: each key's node id and partition, node-<i> holding i)
  4. driftfl secure proxy DIR --listen 0.0.0.0:9090             (the nodes' only door)
  5. each node: flower-supernode --superlink <host>:9090 --root-certificates ca.crt
                --auth-supernode-private-key node-<i>.key ...
  6. driftfl run superlink=<connection> owners=<DIR on the SuperLink's machine>/owners.json ...
     (a node may then claim only its own key's partition)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="driftfl secure", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True,
                                  metavar="{init,connect,register,proxy}")
    init = steps.add_parser("init", help="make the CA, the SuperLink's certificate and node keys")
    init.add_argument("folder", type=Path, help="where to write them (new or empty)")
    init.add_argument("--name", action="append", default=[], metavar="HOST",
                      help="a name or address nodes reach the SuperLink by (repeat for more; "
                           "localhost and 127.0.0.1 are always included)")
    init.add_argument("--nodes", type=int, default=0, help="node key pairs to make (0)")
    init.add_argument("--days", type=int, default=365, help="certificate lifetime (365)")

    connect = steps.add_parser(
        "connect", help="add (or replace) a SuperLink connection in $FLWR_HOME/config.toml",
        description="Add or replace [superlink.NAME] in Flower's config.toml ($FLWR_HOME, "
                    "else ~/.flwr), creating it with Flower's defaults (local, supergrid) "
                    "when there is none; every other connection stays as it is.")
    connect.add_argument("name", help="the connection's name, e.g. federation")
    connect.add_argument("--address", required=True, metavar="HOST:PORT",
                         help="the SuperLink's Control API, e.g. 127.0.0.1:9091")
    security = connect.add_mutually_exclusive_group(required=True)
    security.add_argument("--root-certificates", type=Path, metavar="FILE",
                          help="TLS, checked against this CA certificate (init's ca.crt)")
    security.add_argument("--insecure", action="store_true",
                          help="no TLS: only for a SuperLink on this machine")

    register = steps.add_parser(
        "register", help="register node public keys with the SuperLink; record their owners",
        description="Register each key with the SuperLink and record in the owners file the "
                    "node id Flower gave it (found again for a key registered before) and the "
                    "partition its owner holds: node-<i>.key.pub holds partition i unless "
                    "--partition says otherwise. Entries of other keys in the file stay.")
    register.add_argument("connection", help="the operator's SuperLink connection in "
                                             "$FLWR_HOME/config.toml (never the proxy)")
    register.add_argument("keys", nargs="+", type=Path, help="node public keys (*.key.pub)")
    register.add_argument("--partition", action="append", default=[], metavar="KEY=P",
                          help="the partition the key's owner holds, or own for data of its "
                               "own (KEY: the key's file name; repeat for more keys)")
    register.add_argument("--examples", action="append", default=[], metavar="KEY=N",
                          help="the most examples the key's owner may claim (default: not "
                               "declared, max_examples_ratio bounds its weight)")
    register.add_argument("--owners", type=Path, metavar="FILE",
                          help="the owners file to write or update (owners.json beside the "
                               "first key)")

    proxy = steps.add_parser("proxy", help="run the fleet proxy (nginx) in the foreground")
    proxy.add_argument("folder", type=Path, help="the credentials folder of `init`")
    proxy.add_argument("--listen", default="0.0.0.0:9090",
                       help="where nodes connect (0.0.0.0:9090)")
    proxy.add_argument("--superlink", default="127.0.0.1:9091",
                       help="the SuperLink's own address, reached over TLS (127.0.0.1:9091)")
    proxy.add_argument("--print-config", action="store_true",
                       help="print the nginx configuration instead of running it")
    return parser


def _init(args) -> None:
    from driftfl.deploy.credentials import make_credentials

    files = make_credentials(args.folder, args.name, args.nodes, args.days)
    print(f"wrote {', '.join(f.name for f in files)} to {args.folder}")
    print("the SuperLink and the proxy use superlink.crt and superlink.key; every node and the "
          "operator need ca.crt; node i needs node-i.key and nothing else of this folder; "
          "keep ca.key offline")


def _connect(args) -> None:
    from driftfl.deploy.connection import connect

    print(connect(args.name, args.address, args.root_certificates))


def _public_key_problem(path: Path) -> str | None:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    try:
        key = load_ssh_public_key(path.read_bytes())
    except (OSError, ValueError, UnsupportedAlgorithm) as err:
        return f"{path} is not an OpenSSH public key ({err})"
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return f"{path} is not an ECDSA key; make one with ssh-keygen -t ecdsa -b 384"
    return None


def _register(args) -> None:
    from driftfl.deploy.connection import require_connection
    from driftfl.deploy.register import existing_owners, planned_owners, register

    problems = [p for p in map(_public_key_problem, args.keys) if p]
    if problems:
        raise ConfigError(problems[0])
    planned = planned_owners(args.keys, args.partition, args.examples)
    owners = args.owners or args.keys[0].parent / "owners.json"
    existing = existing_owners(owners, planned)
    require_connection(args.connection)  # flwr would write its default config.toml first
    if register(args.connection, args.keys, owners, planned, existing):
        raise SystemExit(1)


def _proxy(args) -> None:
    from driftfl.deploy import proxy
    from driftfl.deploy.credentials import CA_CERT, SERVER_CERT, SERVER_KEY

    files = (args.folder / SERVER_CERT, args.folder / SERVER_KEY, args.folder / CA_CERT)
    if args.print_config:
        print(proxy.render(args.listen, args.superlink, *files, Path("/tmp/driftfl-fleet-proxy")),
              end="")
        return
    raise SystemExit(proxy.serve(args.listen, args.superlink, *files))


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    try:
        {"init": _init, "connect": _connect, "register": _register,
         "proxy": _proxy}[args.step](args)
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
