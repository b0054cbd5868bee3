"""The fleet proxy: the nodes' only door to the SuperLink.

Flower's SuperLink serves three APIs on one HTTP port: the Fleet API for nodes, the Control
API for the operator (runs, and registering node keys) and the runtime API for its own
SuperExec. Flower's open-source edition cannot close the Control API to a caller that holds the
CA certificate (account authentication is an enterprise plugin), so whoever reaches that port
could register a key of its own and join. The SuperLink therefore listens only where the
operator reaches it (127.0.0.1, or a private network), and nodes connect to this proxy: nginx,
presenting the SuperLink's certificate, passes ``/v1/fleet/`` and ``/health`` on to the
SuperLink over TLS (checked against the CA) and answers every other path 403.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.deploy.checks import host_port, is_ip, plain_path

FLEET_PATHS = ("/v1/fleet/", "/health")  # all a node asks of the SuperLink

CONFIG = """\
# driftfl fleet proxy: nodes reach the SuperLink's Fleet API and nothing else.
worker_processes 1;
pid {run}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 1024; }}
http {{
    # what was refused or failed, not the nodes' every poll
    map $status $refused {{ ~^[23] 0; default 1; }}
    log_format fleet '$remote_addr "$request" $status';
    access_log /dev/stdout fleet if=$refused;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    # models and condensed sets travel as request bodies: no cap of nginx's own, streamed
    client_max_body_size 0;
    proxy_request_buffering off;
    proxy_buffering off;
    proxy_read_timeout 600s;
    proxy_send_timeout 600s;
    proxy_http_version 1.1;
    proxy_ssl_verify on;
    proxy_ssl_trusted_certificate {ca};
    proxy_ssl_name {upstream_host};
    server {{
        listen {listen} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location /v1/fleet/ {{ proxy_pass https://{superlink}; }}
        location = /health {{ proxy_pass https://{superlink}; }}
        # the Control API (runs, node registration), the runtime API and the rest: refused
        location / {{ return 403; }}
    }}
}}
"""


def render(listen: str, superlink: str, cert: Path, key: Path, ca: Path, run: Path) -> str:
    """The nginx configuration; ConfigError for a bad address, a missing file or a path nginx
    would misread: nothing a user gives reaches the configuration unchecked."""
    host_port(listen, "--listen", any_host=True)
    upstream_host, _ = host_port(superlink, "--superlink")
    # nginx checks an upstream's certificate against DNS names only. The CA is the
    # federation's own and signs nothing but the SuperLink's certificate, so the chain is what
    # authenticates it; an address is checked as localhost, which every such certificate holds
    if is_ip(upstream_host):
        upstream_host = "localhost"
    for path, what in ((cert, "certificate"), (key, "key"), (ca, "CA certificate")):
        if not path.is_file():
            raise ConfigError(f"the SuperLink's {what} {path} does not exist; make the "
                              "credentials first: driftfl secure init DIR --name <host>")
    cert, key, ca, run = (plain_path(p, what) for p, what in (
        (cert, "the certificate"), (key, "the key"), (ca, "the CA certificate"),
        (run, "the proxy's run folder")))
    return CONFIG.format(listen=listen, superlink=superlink, upstream_host=upstream_host,
                         cert=cert, key=key, ca=ca, run=run)


def nginx() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if not found:
        raise ConfigError("nginx is not installed; install it (Debian/Ubuntu: "
                          "apt-get install nginx-light) or run your own with "
                          "driftfl secure proxy ... --print-config")
    return found


def serve(listen: str, superlink: str, cert: Path, key: Path, ca: Path) -> int:
    """Run the proxy (nginx, in the foreground) until it stops or this process is told to
    (SIGTERM, SIGINT: nginx finishes its requests and quits); nginx's exit code."""
    binary = nginx()
    run = Path(tempfile.mkdtemp(prefix="driftfl-fleet-proxy-"))
    run.chmod(0o755)  # nginx's workers (an unprivileged user) keep temp files here
    try:
        conf = run / "nginx.conf"
        conf.write_text(render(listen, superlink, cert, key, ca, run))
        test = subprocess.run([binary, "-t", "-q", "-e", "stderr", "-p", str(run), "-c",
                               str(conf)], capture_output=True, text=True)
        if test.returncode:
            raise ConfigError(f"nginx refused the proxy's configuration: {test.stderr.strip()}")
        # nginx's log lines come through a pipe: nginx opens /dev/stdout anew, and on a file
        # its writes and the error log's would overwrite each other
        process = subprocess.Popen([binary, "-e", "stderr", "-p", str(run), "-c", str(conf),
                                    "-g", "daemon off;"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)

        def quit_nginx(signum, frame):  # a graceful stop, as `nginx -s quit` would do
            process.send_signal(signal.SIGQUIT)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, quit_nginx)
        for line in process.stdout:
            print(line, end="", flush=True)
        return process.wait()
    finally:
        shutil.rmtree(run, ignore_errors=True)
