"""The operator's SuperLink connections in Flower's ``config.toml`` ($FLWR_HOME, else
~/.flwr): `driftfl secure connect` adds or replaces one whatever state the file is in, and
`driftfl secure register` checks that the one it is given exists without creating the file.

Flower writes its default file (the connections ``local`` and ``supergrid``) the first time a
``flwr`` command reads it, but only when there is no file at all: a file made by hand before
then lacks ``local`` and ``flwr run . local`` stops. So the file is edited with Flower's own
reader and writer, which start from its defaults, and what Flower's defaults hold that the file
lacks is put back; every other value stays as it was (Flower's writer drops comments).
"""

from __future__ import annotations

import contextlib
import io
import re
import tomllib
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.deploy.checks import host_port, writable_folder

NAME = re.compile(r"[A-Za-z0-9_-]+")  # a bare TOML key, as Flower writes its own (fullmatch)


def config_path() -> Path:
    from flwr.cli.constant import FLOWER_CONFIG_FILE
    from flwr.supercore.utils import get_flwr_home

    return get_flwr_home() / FLOWER_CONFIG_FILE


def _flower_defaults() -> dict:
    from flwr.cli.constant import DEFAULT_FLOWER_CONFIG_TOML

    return tomllib.loads(DEFAULT_FLOWER_CONFIG_TOML)["superlink"]


def _connections(path: Path) -> dict:
    """The [superlink] table of an existing config.toml; ConfigError where it cannot be read."""
    try:
        superlink = tomllib.loads(path.read_text()).get("superlink", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"cannot read {path} ({err}); fix or move it") from None
    if not isinstance(superlink, dict):
        raise ConfigError(f"{path}: superlink is not a table; fix or move the file")
    return superlink


def _how_to_add(name: str) -> str:
    return (f"add it with driftfl secure connect {name} --address HOST:PORT "
            "--root-certificates ca.crt (or --insecure; docs/deployment.md)")


def require_connection(name: str) -> None:
    """Refuse a connection config.toml does not hold, listing those it does; writes nothing
    (a ``flwr`` command would first create Flower's default file)."""
    path = config_path()
    if not path.is_file():
        raise ConfigError(f"no SuperLink connection {name!r}: {path} does not exist yet; "
                          + _how_to_add(name))
    known = sorted(k for k, v in _connections(path).items() if isinstance(v, dict))
    if name not in known:
        raise ConfigError(f"{path} has no [superlink.{name}] connection (valid: "
                          f"{', '.join(known) or 'none'}); " + _how_to_add(name))


def _certificate_file(path: Path) -> Path:
    from cryptography import x509

    try:
        x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) else "no PEM certificate in it"
        raise ConfigError(f"--root-certificates {path}: {reason}; give the CA certificate, "
                          "e.g. the ca.crt of driftfl secure init") from None
    return path.resolve()  # Flower takes an absolute path only


def connect(name: str, address: str, root_certificates: Path | None) -> str:
    """Add or replace the connection ``name`` to the SuperLink at ``address``: over TLS,
    checked against ``root_certificates``, or without TLS when that is None. What was done, in
    a line; ConfigError, before anything is written, for a bad name, address or certificate
    or a config.toml that cannot be read."""
    from flwr.cli.flower_config import (read_flower_config, serialize_superlink_connection,
                                        write_flower_config)
    from flwr.cli.typing import SuperLinkConnection

    defaults = _flower_defaults()
    if not NAME.fullmatch(name):
        raise ConfigError(f"connection name {name!r}: use letters, digits, - and _ only")
    if name in defaults:
        raise ConfigError(f"{name!r} is a name Flower's config.toml uses itself "
                          f"({', '.join(defaults)}); choose another")
    host_port(address, "--address")
    certificate = root_certificates and _certificate_file(root_certificates)
    path = config_path()
    writable_folder(path.parent, "Flower's configuration folder",
                    "set FLWR_HOME to a folder of yours")
    existed = path.is_file()
    before = _connections(path) if existed else {}
    connection = SuperLinkConnection(name, address,
                                     root_certificates=certificate and str(certificate),
                                     insecure=None if certificate else True)
    try:
        # Flower's reader writes its default file first when there is none; its notice of
        # that is folded into this command's own line
        with contextlib.redirect_stdout(io.StringIO()):
            config, _ = read_flower_config()
        superlink = config.setdefault("superlink", {})
        restored = [k for k in defaults if k not in superlink]
        for key, value in defaults.items():
            superlink.setdefault(key, value)
        superlink[name] = serialize_superlink_connection(connection)
        write_flower_config(config)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}") from None

    how = f"TLS, checked against {certificate}" if certificate else "no TLS"
    done = "replaced" if name in before else "added"
    line = f"{done} [superlink.{name}] ({address}, {how}) in {path}"
    if not existed:
        own = [k for k, v in defaults.items() if isinstance(v, dict)]
        line += f", a new file that also holds Flower's own connections ({', '.join(own)})"
    elif restored:
        line += f"; put back what it lacked of Flower's defaults ({', '.join(restored)})"
    return line
