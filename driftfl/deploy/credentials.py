"""The credentials of a secure deployment, made with the `cryptography` package.

- ``ca.crt``, ``ca.key``: a certificate authority of the federation's own. Nodes and the
  operator trust ``ca.crt``; ``ca.key`` signs and then belongs offline.
- ``superlink.crt``, ``superlink.key``: the SuperLink's TLS certificate (the fleet proxy
  presents it too) for every name and address it is reached by. ``localhost`` and
  ``127.0.0.1`` are always in it: the SuperLink's own SuperExec, which runs the ServerApp,
  connects there.
- ``node-<i>.key``, ``node-<i>.key.pub``: a node's ECDSA P-384 key pair in OpenSSH format, as
  ``flower-supernode --auth-supernode-private-key`` reads it and ``flwr supernode register``
  takes its public half. A data owner may instead make its own (``ssh-keygen -t ecdsa -b 384``)
  and send only the ``.pub``.

Private keys are written readable by their owner only; nothing existing is overwritten.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from driftfl.common.errors import ConfigError
from driftfl.deploy.checks import HOSTNAME, is_ip, writable_folder

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "superlink.crt", "superlink.key"
ALWAYS_NAMES = ("localhost", "127.0.0.1")


def node_key(i: int) -> str:
    return f"node-{i}.key"


def _subject_name(name: str) -> x509.GeneralName:
    """A SubjectAltName entry: an IP address, else a DNS name; ConfigError for neither."""
    if is_ip(name):
        return x509.IPAddress(ipaddress.ip_address(name))
    if not HOSTNAME.fullmatch(name):
        raise ConfigError(f"--name {name!r} is neither a host name nor an IP address")
    return x509.DNSName(name)


def _private_pem(key: ec.EllipticCurvePrivateKey, openssh: bool = False) -> bytes:
    form = serialization.PrivateFormat.OpenSSH if openssh else serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write a new file; a private one is created 0600 (never readable by others, even
    briefly)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    with os.fdopen(os.open(path, flags, 0o600 if private else 0o644), "wb") as f:
        f.write(data)


def _certificate(subject: str, issuer: x509.Name, public_key, signer, days: int,
                 extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks disagree a bit
               .not_valid_after(now + datetime.timedelta(days=days)))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA384())


def planned_files(nodes: int) -> list[str]:
    names = [CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY]
    for i in range(nodes):
        names += [node_key(i), node_key(i) + ".pub"]
    return names


def make_credentials(folder: Path, names: list[str], nodes: int, days: int = 365) -> list[Path]:
    """Make the CA, the SuperLink's certificate for ``names`` (plus localhost and 127.0.0.1)
    and ``nodes`` node key pairs in ``folder``; the files written. ConfigError, before
    anything is written, for a bad name, a folder that cannot be written or a file that
    exists already."""
    if nodes < 0 or days < 1:
        raise ConfigError("--nodes must be 0 or more and --days at least 1")
    alt_names = [_subject_name(n) for n in dict.fromkeys([*names, *ALWAYS_NAMES])]
    writable_folder(folder, "the credentials folder")
    taken = [n for n in planned_files(nodes) if (folder / n).exists()]
    if taken:
        raise ConfigError(f"{folder} already holds {', '.join(taken)}; choose an empty folder "
                          "(existing credentials are never overwritten)")
    folder.mkdir(parents=True, exist_ok=True)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "driftfl federation CA")])
    ca = _certificate("driftfl federation CA", ca_name, ca_key.public_key(), ca_key, days, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), True),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)])
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate(names[0] if names else "localhost", ca_name, server_key.public_key(),
                          ca_key, days, [
        (x509.SubjectAlternativeName(alt_names), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)])

    pem = serialization.Encoding.PEM
    _write(folder / CA_CERT, ca.public_bytes(pem))
    _write(folder / CA_KEY, _private_pem(ca_key), private=True)
    _write(folder / SERVER_CERT, server.public_bytes(pem))
    _write(folder / SERVER_KEY, _private_pem(server_key), private=True)
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH)
        _write(folder / node_key(i), _private_pem(key, openssh=True), private=True)
        _write(folder / (node_key(i) + ".pub"), public + f" node-{i}\n".encode())
    return [folder / n for n in planned_files(nodes)]


def certificate_names(path: Path) -> list[str]:
    """The names and addresses a certificate is valid for (its SubjectAltName)."""
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(v) for v in alt.get_values_for_type(x509.DNSName)] + \
           [str(v) for v in alt.get_values_for_type(x509.IPAddress)]
