"""A secure deployment's parts: the credentials `driftfl secure init` makes, the operator's
connection `driftfl secure connect` adds to Flower's config.toml, the fleet proxy (a real nginx
in front of a stand-in SuperLink: only the Fleet API gets through, and nothing a user gives
reaches its configuration unchecked), node registration's checks, and `driftfl split`'s
per-owner files."""

from __future__ import annotations

import http.server
import os
import shutil
import ssl
import stat
import subprocess
import sys
import threading
import time
import tomllib
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
from support.cli import driftfl
from driftfl.common.errors import ConfigError
from driftfl.deploy import proxy
from driftfl.deploy.credentials import certificate_names, make_credentials
from driftfl.host import free_port



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
    for name in ("ok.org\n", "ok.org\nevil.org", "fe80::1%x y"):  # $ matched before a newline
        with pytest.raises(ConfigError, match="is neither a host name"):
            make_credentials(tmp_path / "new", [name], nodes=1)
    assert not (tmp_path / "new").exists()
    out = driftfl("secure", "init", str(credentials), "--nodes", "1", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("driftfl: error: ") \
        and len(out.stderr.strip().splitlines()) == 1, out.stderr


def _driftfl(*args: str, env: dict | None = None, cwd: Path | None = None
             ) -> subprocess.CompletedProcess:
    """``driftfl <args>`` in this process (support.cli), in ``cwd`` (else the current folder)."""
    return driftfl(*args, cwd=cwd or Path.cwd(), env=env)


def _one_line_error(out: subprocess.CompletedProcess, says: str) -> None:
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.startswith("driftfl: error: ") and out.stderr.count("\n") == 1 \
        and says in out.stderr, out.stderr


@pytest.mark.parametrize("target", ["/proc/x", "a-file"])
def test_init_and_split_refuse_a_folder_they_cannot_write_in_one_line(tmp_path, target):
    """Not a directory, or one nobody can make (not even root, in /proc): one line each."""
    (tmp_path / "a-file").write_text("kept\n")
    says = "a-file is not a directory" if target == "a-file" else "no such file or directory"
    for command, folder in ((["secure", "init", target, "--nodes", "1"], "credentials"),
                            (["split", target, "num_clients=2"], "shares'")):
        out = _driftfl(*command, cwd=tmp_path)
        _one_line_error(out, f"cannot write the {folder} folder {target}: ")
        assert says in out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "kept\n"


def _flower_sees(flwr_home: Path, *names: str) -> dict:
    """Each connection as Flower's own reader (the one `flwr run . NAME` uses) reads it."""
    from flwr.cli.flower_config import read_superlink_connection as read

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLWR_HOME", str(flwr_home))
        return {n: [read(n).address, read(n).root_certificates, read(n).insecure] for n in names}


def test_connect_on_an_empty_home_keeps_flowers_local_connection(tmp_path, credentials):
    """On a machine where flwr never ran (no ~/.flwr), the README's step adds the connection
    and Flower's `local` is there too: `flwr run . local` still works (issue 26, 2)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env["HOME"] = str(home)
    shutil.copytree(credentials, tmp_path / "secure")
    added = subprocess.run([driftfl_bin(), "secure", "connect", "federation", "--address",
                            "127.0.0.1:9091", "--root-certificates", "secure/ca.crt"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    # the rest of this module calls the command in this process (support.cli); this one
    # and the proxy's test are real `driftfl secure` processes
    assert added.returncode == 0 and added.stderr == "", added.stderr
    config = home / ".flwr" / "config.toml"
    assert added.stdout == (
        f"added [superlink.federation] (127.0.0.1:9091, TLS, checked against "
        f"{tmp_path / 'secure' / 'ca.crt'}) in {config}, a new file that also holds Flower's "
        "own connections (supergrid, local)\n")
    insecure = driftfl("secure", "connect", "deployment", "--address", "127.0.0.1:9090",
                       "--insecure", cwd=tmp_path, env={"HOME": str(home), "FLWR_HOME": None})
    assert insecure.returncode == 0 and insecure.stdout.startswith(
        "added [superlink.deployment] (127.0.0.1:9090, no TLS)"), insecure.stderr
    assert _flower_sees(home / ".flwr", "local", "federation", "deployment") == {
        "local": [":local:", None, False],
        "federation": ["127.0.0.1:9091", str(tmp_path / "secure" / "ca.crt"), False],
        "deployment": ["127.0.0.1:9090", None, True]}
    assert tomllib.loads(config.read_text())["superlink"]["default"] == "local"


def test_connect_puts_back_what_a_hand_made_file_lacks_and_keeps_every_other_entry(tmp_path):
    """A config.toml written by hand before flwr ever ran (the README's old `cat >>`) lacks
    Flower's `local`: it comes back; the file's own connections stay; a name given again is
    replaced."""
    config = tmp_path / "config.toml"
    config.write_text('[superlink.federation]\naddress = "10.0.0.1:9091"\ninsecure = true\n\n'
                      '[superlink.sim]\noptions.num-supernodes = 3\n\n[tool]\nkept = 1\n')
    env = {"FLWR_HOME": str(tmp_path)}
    out = _driftfl("secure", "connect", "deployment", "--address", "[::1]:9090", "--insecure",
                   env=env)
    assert out.returncode == 0 and out.stdout == (
        f"added [superlink.deployment] ([::1]:9090, no TLS) in {config}; put back what it "
        "lacked of Flower's defaults (default, supergrid, local)\n"), out.stdout + out.stderr
    again = _driftfl("secure", "connect", "federation", "--address", "fl.example.org:9091",
                     "--insecure", env=env)
    assert again.stdout.startswith("replaced [superlink.federation] (fl.example.org:9091, ")
    written = tomllib.loads(config.read_text())
    assert written["superlink"] == {
        "default": "local", "federation": {"address": "fl.example.org:9091", "insecure": True},
        "sim": {"options": {"num-supernodes": 3}}, "supergrid": {"address": "api.flower.ai"},
        "local": {"address": ":local:"},
        "deployment": {"address": "[::1]:9090", "insecure": True}}
    assert written["tool"] == {"kept": 1}
    assert _flower_sees(tmp_path, "local", "sim")["local"][0] == ":local:"


@pytest.mark.parametrize("args, says", [
    (["local", "--address", "a:1", "--insecure"], "'local' is a name Flower's config.toml uses"),
    (["default", "--address", "a:1", "--insecure"], "'default' is a name Flower's"),
    (["fed.x", "--address", "a:1", "--insecure"], "use letters, digits, - and _ only"),
    (["fed", "--address", "a b:1", "--insecure"], "--address 'a b:1' is not host:port"),
    (["fed", "--address", "a:0", "--insecure"], "--address 'a:0' is not host:port"),
    (["fed", "--address", "a:65536", "--insecure"], "is not host:port"),
    (["fed", "--address", "a:\u0669", "--insecure"], "is not host:port"),  # an Arabic nine
    (["fed", "--address", "9091", "--insecure"], "is not host:port"),
    (["fed\n", "--address", "a:1", "--insecure"], "use letters, digits, - and _ only"),
    (["fed", "--address", "a\n:1", "--insecure"], "is not host:port"),  # `$` took a newline
    (["fed", "--address", "a:1\n", "--insecure"], "is not host:port"),
    (["fed", "--address", "a:1", "--root-certificates", "missing.crt"],
     "--root-certificates missing.crt: No such file or directory"),
    (["fed", "--address", "a:1", "--root-certificates", "node.key.pub"],
     "no PEM certificate in it"),
])
def test_connect_refuses_bad_input_in_one_line_before_writing(tmp_path, args, says):
    (tmp_path / "node.key.pub").write_text("ecdsa-sha2-nistp384 AAAA node-0\n")
    home = tmp_path / "flwr"
    _one_line_error(_driftfl("secure", "connect", *args, cwd=tmp_path,
                             env={"FLWR_HOME": str(home)}), says)
    assert not home.exists()


def test_connect_leaves_a_config_it_cannot_read_or_write_as_it_was(tmp_path):
    config = tmp_path / "config.toml"
    for text, says in (("[superlink\n", f"cannot read {config} ("),
                       ("superlink = 3\n", "superlink is not a table")):
        config.write_text(text)
        _one_line_error(_driftfl("secure", "connect", "fed", "--address", "a:1", "--insecure",
                                 env={"FLWR_HOME": str(tmp_path)}), says)
        assert config.read_text() == text
    _one_line_error(_driftfl("secure", "connect", "fed", "--address", "a:1", "--insecure",
                             env={"FLWR_HOME": str(config)}),
                    f"cannot write Flower's configuration folder {config}: {config} is not a "
                    "directory; set FLWR_HOME")


def test_register_on_a_connection_flower_does_not_know_writes_nothing(tmp_path, credentials):
    """flwr would write its default config.toml before saying the connection is missing."""
    home = tmp_path / "flwr"
    key = str(credentials / "node-0.key.pub")
    out = _driftfl("secure", "register", "nosuchconn", key, env={"FLWR_HOME": str(home)})
    _one_line_error(out, f"no SuperLink connection 'nosuchconn': {home / 'config.toml'} does "
                         "not exist yet; add it with driftfl secure connect nosuchconn")
    assert not home.exists()
    home.mkdir()
    text = '[superlink.federation]\naddress = "127.0.0.1:9091"\ninsecure = true\n'
    (home / "config.toml").write_text(text)
    out = _driftfl("secure", "register", "nosuchconn", key, env={"FLWR_HOME": str(home)})
    _one_line_error(out, "has no [superlink.nosuchconn] connection (valid: federation)")
    assert (home / "config.toml").read_text() == text


def test_register_refuses_what_is_not_an_ecdsa_public_key_before_calling_flower(tmp_path,
                                                                                 credentials):
    other = tmp_path / "ed25519.pub"
    other.write_bytes(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        Encoding.OpenSSH, PublicFormat.OpenSSH))
    for key, reason in ((credentials / "ca.crt", "is not an OpenSSH public key"),
                        (other, "is not an ECDSA key"),
                        (tmp_path / "missing.pub", "is not an OpenSSH public key")):
        out = _driftfl("secure", "register", "no-such-connection",
                       str(credentials / "node-0.key.pub"), str(key), cwd=tmp_path)
        assert out.returncode == 2 and reason in out.stderr, out.stderr
        assert "registered" not in out.stdout  # not even the good key went to Flower


def test_proxy_configuration_refuses_bad_addresses_and_missing_files(credentials, tmp_path):
    files = (credentials / "superlink.crt", credentials / "superlink.key",
             credentials / "ca.crt")
    with pytest.raises(ConfigError, match="--listen '9090' is not host:port"):
        proxy.render("9090", "127.0.0.1:9091", *files, tmp_path)
    with pytest.raises(ConfigError, match="--superlink 'superlink:x' is not host:port"):
        proxy.render("0.0.0.0:9090", "superlink:x", *files, tmp_path)
    # nothing that nginx would read as its own syntax gets into the configuration
    for listen, superlink in (("a b; include /etc/passwd:9090", "s:1"), ("{:9090", "s:1"),
                              ("0.0.0.0:0", "s:1"), ("0.0.0.0:65536", "s:1"),
                              ("*:9090", "*:9091"), ("0.0.0.0:9090", "s;x:1"),
                              ("0.0.0.0:9090", "s:1;"), ("[::1:9090", "s:1"),
                              ("0.0.0.0:9090", "[fl.org]:1"), ("0.0.0.0:9090", "'s':1"),
                              # `$` matched before a trailing newline; a scope id is any text
                              ("localhost\n:9090", "s:1"), ("0.0.0.0:9090", "s\n:1"),
                              ("[fe80::1%x;y]:9090", "s:1"), ("0.0.0.0:9090", "[::1%x y]:1")):
        with pytest.raises(ConfigError, match="is not host:port"):
            proxy.render(listen, superlink, *files, tmp_path)
    for odd in ("a b", "a;b", "a{b", "a$b", "a'b", 'a"b', "a#b", "a\\b", "a\nb", "a\n"):
        folder = tmp_path / odd
        shutil.copytree(credentials, folder)
        moved = (folder / "superlink.crt", folder / "superlink.key", folder / "ca.crt")
        with pytest.raises(ConfigError, match="holds a character nginx would read"):
            proxy.render("0.0.0.0:9090", "s:1", *moved, tmp_path)
        with pytest.raises(ConfigError, match="the proxy's run folder .* holds a character"):
            proxy.render("0.0.0.0:9090", "s:1", *files, folder)
    for listen in ("[::]:9090", "*:9090", "fl.example.org:9090"):
        assert f"listen {listen} ssl;" in proxy.render(listen, "s:1", *files, tmp_path)
    out = _driftfl("secure", "proxy", str(credentials), "--listen",
                   "a b; include /etc/passwd:9090", "--print-config")
    _one_line_error(out, "--listen 'a b; include /etc/passwd:9090' is not host:port")
    _one_line_error(_driftfl("secure", "proxy", str(credentials), "--listen", "localhost\n:9090",
                             "--print-config"), "--listen 'localhost\\n:9090' is not host:port")
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


@pytest.mark.slow  # a real nginx behind a real `driftfl secure proxy`
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
    out = _driftfl("split", str(tmp_path / "owners"), *overrides, cwd=tmp_path)
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
    again = _driftfl("split", str(tmp_path / "owners"), *overrides, cwd=tmp_path)
    assert again.returncode == 2 and "already holds client-0.npz" in again.stderr


@pytest.mark.parametrize("linter, files", [
    ("hadolint", ["docker/Dockerfile"]),
    ("shellcheck", ["docker/entrypoint.sh", "scripts/setup-deployment.sh", "scripts/setup.sh",
                    "benchmarks/all_methods_table.sh", "benchmarks/dp_accuracy.sh",
                    "benchmarks/fednova_table.sh", "benchmarks/client_eval_table.sh"])])
def test_the_dockerfile_and_shell_scripts_pass_their_linters(linter, files):
    out = subprocess.run([str(Path(sys.executable).parent / linter), *files], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
