"""A secure deployment's parts: the credentials `driftfl secure init` makes, the fleet proxy
(a real nginx in front of a stand-in SuperLink: only the Fleet API gets through), node
registration's checks, and `driftfl split`'s per-owner files."""

from __future__ import annotations

import http.server
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding, PublicFormat, load_ssh_private_key, load_ssh_public_key)

from conftest import REPO, driftfl_bin
from driftfl.common.errors import ConfigError
from driftfl.deploy import proxy
from driftfl.deploy.credentials import certificate_names, make_credentials
from driftfl.launch import free_port


@pytest.fixture(scope="session")
def nginx_installed():
    """nginx, installed by the deployment set-up script when missing (as CI needs it)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup-deployment.sh")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return proxy.nginx()


@pytest.fixture(scope="module")
def credentials(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secure")
    make_credentials(folder, ["fl.example.org", "10.1.2.3"], nodes=2, days=30)
    return folder


def test_the_certificate_is_signed_by_the_ca_for_every_name_given(credentials):
    ca = x509.load_pem_x509_certificate((credentials / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((credentials / "superlink.crt").read_bytes())
    server.verify_directly_issued_by(ca)  # raises if not
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # the SuperLink's own SuperExec connects on 127.0.0.1: always in the certificate
    assert certificate_names(credentials / "superlink.crt") == [
        "fl.example.org", "localhost", "10.1.2.3", "127.0.0.1"]
    lifetime = server.not_valid_after_utc - server.not_valid_before_utc
    assert 30 <= lifetime.days <= 31


def test_node_keys_are_ecdsa_p384_in_openssh_format_and_private_keys_are_0600(credentials):
    for i in range(2):
        private = load_ssh_private_key((credentials / f"node-{i}.key").read_bytes(), None)
        public = load_ssh_public_key((credentials / f"node-{i}.key.pub").read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.curve.name == "secp384r1"
        assert public.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH) == \
            private.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in credentials.iterdir()}
    assert {n for n, m in modes.items() if m == 0o600} == {
        "ca.key", "superlink.key", "node-0.key", "node-1.key"}
    assert all(m == 0o644 for n, m in modes.items() if not n.endswith(".key"))


def test_init_never_overwrites_and_refuses_a_bad_name_before_writing(tmp_path, credentials):
    before = {p.name: p.read_bytes() for p in credentials.iterdir()}
    with pytest.raises(ConfigError, match="already holds ca.crt"):
        make_credentials(credentials, ["x.org"], nodes=1)
    assert {p.name: p.read_bytes() for p in credentials.iterdir()} == before
    with pytest.raises(ConfigError, match="'bad name' is neither a host name"):
        make_credentials(tmp_path / "new", ["ok.org", "bad name"], nodes=1)
    assert not (tmp_path / "new").exists()
    out = subprocess.run([driftfl_bin(), "secure", "init", str(credentials), "--nodes", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("driftfl: error: ") \
        and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_register_refuses_what_is_not_an_ecdsa_public_key_before_calling_flower(tmp_path,
                                                                                 credentials):
    other = tmp_path / "ed25519.pub"
    other.write_bytes(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        Encoding.OpenSSH, PublicFormat.OpenSSH))
    for key, reason in ((credentials / "ca.crt", "is not an OpenSSH public key"),
                        (other, "is not an ECDSA key"),
                        (tmp_path / "missing.pub", "is not an OpenSSH public key")):
        out = subprocess.run([driftfl_bin(), "secure", "register", "no-such-connection",
                              str(credentials / "node-0.key.pub"), str(key)],
                             capture_output=True, text=True)
        assert out.returncode == 2 and reason in out.stderr, out.stderr
        assert "registered" not in out.stdout  # not even the good key went to Flower


def test_proxy_configuration_refuses_bad_addresses_and_missing_files(credentials, tmp_path):
    files = (credentials / "superlink.crt", credentials / "superlink.key",
             credentials / "ca.crt")
    with pytest.raises(ConfigError, match="--listen '9090' is not host:port"):
        proxy.render("9090", "127.0.0.1:9091", *files, tmp_path)
    with pytest.raises(ConfigError, match="--superlink 'superlink:x' is not host:port"):
        proxy.render("0.0.0.0:9090", "superlink:x", *files, tmp_path)
    with pytest.raises(ConfigError, match="make the credentials first"):
        proxy.render("0.0.0.0:9090", "s:1", tmp_path / "none.crt", *files[1:], tmp_path)
    # nginx checks an upstream's certificate by DNS name: an address is checked as localhost
    assert "proxy_ssl_name localhost;" in proxy.render("0.0.0.0:9090", "127.0.0.1:9091",
                                                       *files, tmp_path)
    assert "proxy_ssl_name superlink;" in proxy.render("0.0.0.0:9090", "superlink:9091",
                                                       *files, tmp_path)


class _StandIn(http.server.BaseHTTPRequestHandler):
    """A stand-in SuperLink over TLS: records every path that reaches it."""
    seen: list[str] = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        type(self).seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)  # echoed: a large body makes the round trip whole

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def _post(url: str, ca: Path, body: bytes = b"{}") -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), context=context,
                                    timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def test_the_proxy_passes_the_fleet_api_and_refuses_control_and_runtime(credentials,
                                                                       nginx_installed):
    """A real nginx from `driftfl secure proxy` in front of a stand-in SuperLink: a node's
    paths get through (a 5 MB model too), registration and everything else get 403 and never
    reach the SuperLink, and plain HTTP is refused."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(credentials / "superlink.crt", credentials / "superlink.key")
    upstream.socket = context.wrap_socket(upstream.socket, server_side=True)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    listen = f"127.0.0.1:{free_port()}"
    run = subprocess.Popen([driftfl_bin(), "secure", "proxy", str(credentials), "--listen",
                            listen, "--superlink", f"127.0.0.1:{upstream.server_port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ca = credentials / "ca.crt"
    try:
        deadline = time.monotonic() + 30
        while _post_or_none(f"https://{listen}/health", ca) is None:
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.2)
        model = np.random.default_rng(0).bytes(5_000_000)
        assert _post(f"https://{listen}/v1/fleet/push-object", ca, model) == (200, model)
        assert _post(f"https://{listen}/v1/fleet/pull-messages", ca)[0] == 200
        refused = ["/v1/control/register-node", "/v1/control/start-run", "/v1/runtime/get-nodes",
                   "/docs", "/v1/fleetx", "/v1/fleet/../control/register-node"]
        assert [_post(f"https://{listen}{p}", ca)[0] for p in refused] == [403] * len(refused)
        plain = subprocess.run([sys.executable, "-c", (
            "import urllib.request,urllib.error\n"
            f"try: urllib.request.urlopen('http://{listen}/v1/fleet/pull-messages', b'')\n"
            "except urllib.error.HTTPError as e: print(e.code)")],
            capture_output=True, text=True, timeout=30)
        assert plain.stdout.strip() == "400"  # plain HTTP to the TLS port
    finally:
        run.terminate()
        output = run.communicate(timeout=30)[0]
        upstream.shutdown()
    assert run.returncode == 0, output  # SIGTERM: nginx quits gracefully
    assert _StandIn.seen == ["/health", "/v1/fleet/push-object", "/v1/fleet/pull-messages"]
    # refusals are logged (the plain-HTTP attempt too), a node's ordinary requests are not
    assert '"POST /v1/control/register-node HTTP/1.1" 403' in output
    assert '"POST /v1/fleet/pull-messages HTTP/1.1" 400' in output
    assert '" 200' not in output


def _post_or_none(url: str, ca: Path):
    try:
        return _post(url, ca)
    except OSError:
        return None


def test_split_writes_each_owners_share_and_nothing_else(tmp_path, fmnist_available):
    overrides = ["num_clients=3", "partition.alpha=0.5", "seed=1", "dataset.subset=3000"]
    out = subprocess.run([driftfl_bin(), "split", str(tmp_path / "owners"), *overrides],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "clients' data (fmnist, Dirichlet(0.5), seed 1): 3 clients, 3000 samples" in out.stdout
    from driftfl.common.config import compose
    from driftfl.common.datasets import load_dataset
    from driftfl.common.partition import partition

    cfg = compose(overrides)
    data = load_dataset(cfg.dataset)
    parts = partition(data.train_y, cfg.partition, 3, 1)
    for k, indices in enumerate(parts):
        with np.load(tmp_path / "owners" / f"client-{k}.npz") as share:
            assert share["x"].dtype == np.uint8 and share["x"].shape[1:] == (1, 28, 28)
            assert np.array_equal(share["x"], data.train_x[indices])
            assert np.array_equal(share["y"], data.train_y[indices])
    assert sorted(p.name for p in (tmp_path / "owners").iterdir()) == [
        "client-0.npz", "client-1.npz", "client-2.npz"]
    again = subprocess.run([driftfl_bin(), "split", str(tmp_path / "owners"), *overrides],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already holds client-0.npz" in again.stderr


@pytest.mark.parametrize("linter, files", [
    ("hadolint", ["docker/Dockerfile"]),
    ("shellcheck", ["docker/entrypoint.sh", "scripts/setup-deployment.sh", "scripts/setup.sh",
                    "benchmarks/all_methods_table.sh"])])
def test_the_dockerfile_and_shell_scripts_pass_their_linters(linter, files):
    out = subprocess.run([str(Path(sys.executable).parent / linter), *files], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
