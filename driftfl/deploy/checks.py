"""Checks on what a user gives the deployment commands, before anything is written: an
address, a path that goes into a generated configuration, a folder to write into. Each
refusal is a ConfigError that says what was wrong."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.common.paths import cannot_write

# whole strings only (fullmatch; \Z in the look-ahead): `$` also matches before a trailing
# newline, which would pass into nginx's configuration or a certificate
HOSTNAME = re.compile(r"(?=.{1,253}\Z)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
# what a path in an nginx configuration may hold: nothing nginx reads as syntax (whitespace,
# ; { } quotes, # comments, $ variables, \ escapes)
PLAIN_PATH = re.compile(r"[\w./@+,=:~-]+")


def is_ip(host: str) -> bool:
    """An IP address without an IPv6 scope id (``%eth0``: Python takes any text after the %,
    spaces and ; included, which nginx would read as syntax)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return "%" not in host


def host_port(address: str, option: str, any_host: bool = False) -> tuple[str, int]:
    """``address`` as (host, port): a host name or an IP address (IPv6 in brackets), and a
    port 1-65535; ``any_host`` admits ``*`` (every interface) too. ConfigError otherwise."""
    host, sep, port = address.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ipv6_in_brackets = bare != host and ":" in bare and is_ip(bare)
    good_host = ipv6_in_brackets or (bare == host and (
        HOSTNAME.fullmatch(host) or (":" not in host and is_ip(host))
        or (any_host and host == "*")))
    if not (sep and good_host and re.fullmatch(r"[0-9]{1,5}", port)
            and 0 < int(port) < 65536):
        raise ConfigError(f"{option} {address!r} is not host:port, a host name or IP address "
                          "and a port 1-65535 (e.g. 127.0.0.1:9091, [::1]:9091)")
    return bare, int(port)


def plain_path(path: Path, what: str) -> Path:
    """``path``, absolute, when nginx can read it as one word of its configuration."""
    path = path.resolve()
    if not PLAIN_PATH.fullmatch(str(path)):
        raise ConfigError(f"{what} {str(path)!r} holds a character nginx would read as part of "
                          "its configuration (space, ; { } quote # $ \\); use a path of "
                          "letters, digits and ./_-")
    return path


def writable_folder(folder: Path, what: str, fix: str = "choose another folder") -> None:
    """Refuse a folder that cannot be created and written (it is left as it was)."""
    if reason := cannot_write(folder.absolute()):
        raise ConfigError(f"cannot write {what} {folder}: {reason}; {fix}")
