"""Deployment's fixed latency per exchange, for each SuperNode set-up side by side in one run.

For every configuration: a fresh SuperLink and 2 SuperNodes on 127.0.0.1 (insecure, free ports,
a scratch FLWR_HOME), one tiny driftfl experiment through `flwr run` (FedAvg, the mlp, 2,000
Fashion-MNIST images, 2 clients, 1 local epoch: compute is negligible, so a round is the fixed
latency of one train exchange plus a small central evaluation), then everything is stopped.

Prints first what a fresh process pays before a handler trains (Flower's imports, driftfl's,
reading the dataset), then per configuration: the steady round and train exchange (medians of
metrics.json `seconds` and `train_seconds` over rounds 2..R; round 1 holds the first data
load) and, per train message, from the SuperNodes' timestamped logs and their process trees:
message received -> flwr-clientapp started (the superexec's task poll), flwr-clientapp started
-> reply in the node (a fresh process: imports, data, training, plus the node's 0.5 s reply
poll), the wait outside the nodes (exchange minus its slowest node: the SuperNode's 3 s pull poll
and the ServerApp's 3 s reply poll), and how many flwr-clientapp processes served how many
messages. Round times follow the machine's load (printed): compare the columns, not rounds
taken at different loads.

    .venv/bin/python benchmarks/deployment_latency.py             # default, superexec-poll, process
    .venv/bin/python benchmarks/deployment_latency.py --what-if   # + Flower's 3 s polls shortened
    .venv/bin/python benchmarks/deployment_latency.py --configs default --rounds 3 --logs /tmp/dl

Configurations (settings a user has in Flower 1.41):
  default         flower-supernode as in the README: it starts its own flower-superexec, which
                  polls the SuperNode for tasks every 1 s and starts a flwr-clientapp per message.
  superexec-poll  the same with FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.05 in the SuperNode's
                  environment (the flower-superexec it starts inherits it).
  process         flower-supernode --isolation process, plus a flower-superexec started by hand
                  per SuperNode (FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.05): it too starts one
                  flwr-clientapp process per message.
--what-if adds configurations that are NOT settings: Flower's hard-coded polls are shortened in
the benchmark's own processes only (a sitecustomize.py on their PYTHONPATH), to show what each
costs:
  grid-poll       the ServerApp pulls replies every 0.1 s instead of 3 s
                  (flwr/superlink/grid/http_grid.py, HttpGrid.send_and_receive).
  node-poll       the SuperNode pulls messages every 0.1 s instead of 3 s, and looks for the
                  reply every 0.05 s instead of 0.5 s (flwr/supernode/start_client_internal.py).
  all-polls       both, and the superexec poll at 0.05 s: what is left is the process per message.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from driftfl.host import _wait_healthy, flwr_env, free_port, stop  # noqa: E402
from driftfl.common.paths import console_script as _tool  # noqa: E402

FAST_SUPEREXEC = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05"}


@dataclass
class Setup:
    name: str
    isolation: str = "subprocess"  # flower-supernode --isolation
    env: dict = field(default_factory=dict)  # added to the SuperNodes' (and superexecs') env
    patches: dict = field(default_factory=dict)  # what-if: DEPLAT_* for the sitecustomize
    what_if: bool = False


SETUPS = {s.name: s for s in [
    Setup("default"),
    Setup("superexec-poll", env=FAST_SUPEREXEC),
    Setup("process", isolation="process", env=FAST_SUPEREXEC),
    Setup("grid-poll", patches={"DEPLAT_GRID_POLL": "0.1"}, what_if=True),
    Setup("node-poll", patches={"DEPLAT_NODE_POLL": "0.1"}, what_if=True),
    Setup("all-polls", env=FAST_SUPEREXEC,
          patches={"DEPLAT_GRID_POLL": "0.1", "DEPLAT_NODE_POLL": "0.1"}, what_if=True),
]}

# What-if only: shorten Flower's hard-coded sleeps in the processes that run them. Each module
# imports `time` and calls time.sleep(3); its `time` is replaced by one whose sleep(3) is shorter.
SITECUSTOMIZE = r'''
import os, sys, time as _time

class _Time:
    def __init__(self, mapping):
        self._mapping = mapping
    def __getattr__(self, name):
        return getattr(_time, name)
    def sleep(self, seconds):
        _time.sleep(self._mapping.get(seconds, seconds))

_prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
if _prog == "flwr-serverapp" and os.environ.get("DEPLAT_GRID_POLL"):
    import flwr.superlink.grid.http_grid as _m
    _m.time = _Time({3: float(os.environ["DEPLAT_GRID_POLL"])})
if _prog == "flower-supernode" and os.environ.get("DEPLAT_NODE_POLL"):
    import flwr.supernode.start_client_internal as _m
    _m.time = _Time({3: float(os.environ["DEPLAT_NODE_POLL"]), 0.5: 0.05})
'''


def _timestamped(process: subprocess.Popen, log: Path, t0: float) -> threading.Thread:
    """Copy a process's output to its log, each line prefixed with seconds since t0."""
    def copy():
        with open(log, "w") as out:
            for line in process.stdout:
                out.write(f"{time.monotonic() - t0:9.3f} {line}")
                out.flush()
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _watch_clientapps(roots: dict[int, list], log: Path, t0: float,
                      stopped: threading.Event) -> threading.Thread:
    """Record when each node's flwr-clientapp processes start (their kernel start time, in
    seconds since t0), found among the descendants of the node's own processes."""
    import psutil

    # psutil's start times are off from time.time() by up to a second (boot time is whole
    # seconds): place one of our own children on our clock instead
    before = time.monotonic()
    probe = subprocess.Popen(["sleep", "1"])
    wall0 = psutil.Process(probe.pid).create_time() - (before - t0)
    probe.wait()

    def watch():
        seen: dict[int, tuple[int, float]] = {}
        while not stopped.wait(0.2):
            for node, processes in roots.items():
                for root in processes:
                    try:
                        children = psutil.Process(root.pid).children(recursive=True)
                    except psutil.NoSuchProcess:
                        continue
                    for child in children:
                        try:
                            if child.pid not in seen and any(
                                    "flwr-clientapp" in part for part in child.cmdline()[:2]):
                                seen[child.pid] = (node, child.create_time() - wall0)
                        except psutil.Error:
                            pass
        log.write_text(json.dumps(sorted(seen.values(), key=lambda v: v[1])))
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def deployment(setup: Setup, logs: Path, nodes: int):
    """A SuperLink and `nodes` SuperNodes for this setup; yields `flwr run <overrides>`."""
    processes, threads, roots = [], [], {i: [] for i in range(nodes)}
    t0 = time.monotonic()
    stopped = threading.Event()

    def start(cmd, name, env):
        processes.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        threads.append(_timestamped(processes[-1], logs / f"{name}.log", t0))
        return processes[-1]

    with tempfile.TemporaryDirectory(prefix="driftfl-deplat-") as flwr_home:
        port = free_port()
        (Path(flwr_home) / "config.toml").write_text(
            f'[superlink.deployment]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
        env = flwr_env(flwr_home)
        if setup.patches:
            (Path(flwr_home) / "patch").mkdir()
            (Path(flwr_home) / "patch" / "sitecustomize.py").write_text(SITECUSTOMIZE)
            env = {**env, **setup.patches, "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(flwr_home) / "patch"), env.get("PYTHONPATH")]))}
        node_env = {**env, **setup.env}

        def flwr_run(overrides: str, run_dir: Path) -> subprocess.CompletedProcess:
            return subprocess.run(
                [_tool("flwr"), "run", str(REPO), "deployment", "--stream", "--run-config",
                 f"overrides='{overrides}' run-dir='{run_dir}'"],
                env=env, capture_output=True, text=True, timeout=900)

        try:
            superlink = start([_tool("flower-superlink"), "--insecure", "--host", "127.0.0.1",
                               "--port", str(port), "--disable-runtime-dependency-installation"],
                              "superlink", env)
            _wait_healthy(port, superlink, logs / "superlink.log")
            for i in range(nodes):
                runtime_port = free_port()
                node_config = f"dataset='fmnist' partition-id={i} num-partitions={nodes}"
                roots[i].append(start(
                    [_tool("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                     "--port", str(runtime_port), "--isolation", setup.isolation,
                     "--node-config", node_config], f"supernode{i}", node_env))
                if setup.isolation == "process":
                    roots[i].append(start(
                        [_tool("flower-superexec"), "--insecure",
                         "--runtime-api-address", f"127.0.0.1:{runtime_port}"],
                        f"superexec{i}", node_env))
            watcher = _watch_clientapps(roots, logs / "clientapps.json", t0, stopped)
            yield flwr_run
            stopped.set()
            watcher.join(timeout=10)
        finally:
            stopped.set()
            for process in reversed(processes):
                stop(process)
            for thread in threads:
                thread.join(timeout=10)


LINE = re.compile(r"^\s*(\d+\.\d+) (.*)$")


def node_messages(log: Path) -> list[dict]:
    """Per message the node received, in order: its type, its number among the messages of
    that type (train message k belongs to round k) and seconds from receiving to reply sent."""
    messages, current, counts = [], None, {}
    for raw in log.read_text(errors="replace").splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        t, text = float(m.group(1)), m.group(2)
        if g := re.search(r"Receiving: (\S+) message", text):
            counts[g.group(1)] = counts.get(g.group(1), 0) + 1
            current = {"type": g.group(1), "number": counts[g.group(1)], "received": t}
        elif "Sending:" in text and current:
            current["reply"] = t  # the ClientApp's reply reached the node's state
        elif "Sent successfully" in text and current:
            current["node_seconds"] = t - current["received"]
            messages.append(current)
            current = None
    return messages


def measure(setup: Setup, args, logs: Path) -> dict:
    """One deployment run: its steady rounds, node spans and process counts."""
    logs.mkdir(parents=True, exist_ok=True)
    run_dir = logs / "run"
    overrides = (f"strategy=fedavg model=mlp dataset.subset={args.subset} "
                 f"dataset.test_subset=1000 num_clients={args.nodes} rounds={args.rounds} "
                 "local_epochs=1 node_wait=120")
    load_before = os.getloadavg()[0]
    with deployment(setup, logs, args.nodes) as run:
        out = run(overrides, run_dir)
    (logs / "flwr-run.log").write_text(out.stdout + out.stderr)
    if not (run_dir / "summary.json").is_file():
        return {"error": f"no summary.json (flwr run exit {out.returncode}); see {logs}"}
    rows = [r for r in json.loads((run_dir / "metrics.json").read_text())["rounds"]
            if r["round"] >= 2]
    starts = json.loads((logs / "clientapps.json").read_text())  # [node, seconds since t0]
    steady, messages = [], 0
    for i in range(args.nodes):
        received = node_messages(logs / f"supernode{i}.log")
        messages += len(received)
        mine = [t for node, t in starts if node == i]
        for m in received:
            # the first flwr-clientapp of this node started after the message arrived
            m["start"] = next((t for t in mine if t >= m["received"] - 0.02), float("nan"))
            if m["type"] == "train" and m["number"] >= 2:
                steady.append(m)
    # a round's exchange waits for its slowest node
    node = [max((m["node_seconds"] for m in steady if m["number"] == r["round"]),
                default=float("nan")) for r in rows]
    return {"rounds": [r["seconds"] for r in rows], "train": [r["train_seconds"] for r in rows],
            "node": node, "wait": [r["train_seconds"] - n for r, n in zip(rows, node)],
            "spawn": [m["start"] - m["received"] for m in steady],
            "clientapp": [m["reply"] - m["start"] for m in steady],
            "messages": messages, "clientapps": len(starts),
            "load": round((load_before + os.getloadavg()[0]) / 2, 1)}


PROBE = """
import sys, time; t0 = time.perf_counter()
import flwr.supernode.cli.flwr_clientapp; t1 = time.perf_counter()
import driftfl.client.app; t2 = time.perf_counter()
from driftfl.common.datasets import load_dataset
load_dataset({"name": "fmnist", "subset": int(sys.argv[1])}); t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def process_floor(times: int, subset: int) -> dict[str, float]:
    """What every fresh flwr-clientapp pays before a handler trains (medians, seconds): the
    interpreter and Flower's imports, the ClientApp's imports (driftfl, torch), and reading
    Fashion-MNIST (driftfl's in-process caches never see a second message in deployment)."""
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PROBE, str(subset)], capture_output=True,
                             text=True, cwd=REPO, check=True)
        wall = time.perf_counter() - started
        flwr, app, data = map(float, out.stdout.split())
        samples.append({"process": wall - app - data, "app": app, "data": data, "total": wall})
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=None,
                        help=f"comma-separated, of {', '.join(SETUPS)} "
                             "(default: the settings; with --what-if all)")
    parser.add_argument("--what-if", action="store_true",
                        help="also run the configurations that shorten Flower's polls")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the configurations this many times, interleaved")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--subset", type=int, default=2000)
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep every process's timestamped log here (default: a temp dir)")
    args = parser.parse_args()
    names = (args.configs.split(",") if args.configs else
             [n for n, s in SETUPS.items() if args.what_if or not s.what_if])
    unknown = [n for n in names if n not in SETUPS]
    if unknown:
        parser.error(f"unknown configuration {', '.join(unknown)}; choose from {', '.join(SETUPS)}")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is not steady)")

    floor = process_floor(3, args.subset)
    floor_line = (f"A fresh process (median of 3, load {os.getloadavg()[0]:.1f}): "
                  f"{floor['total']:.2f} s = interpreter + Flower's flwr-clientapp imports "
                  f"{floor['process']:.2f} s + driftfl's ClientApp imports (torch) "
                  f"{floor['app']:.2f} s + reading Fashion-MNIST {floor['data']:.2f} s.")
    print(floor_line, flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="driftfl-deplat-logs-") as tmp:
        base = args.logs or Path(tmp)
        for repeat in range(args.repeats):
            for name in names:
                started = time.monotonic()
                result = measure(SETUPS[name], args, base / f"{name}-{repeat}")
                runs[name].append(result)
                shown = {k: ([round(x, 2) for x in v] if isinstance(v, list) else v)
                         for k, v in result.items()}
                print(f"{name} #{repeat + 1} ({time.monotonic() - started:.0f} s): "
                      f"{json.dumps(shown)}", flush=True)

    print(f"\nFedAvg, mlp, {args.subset} images, {args.nodes} SuperNodes on 127.0.0.1, "
          f"{args.rounds} rounds x {args.repeats} run(s); medians over rounds 2..{args.rounds} "
          f"of all runs.\n{floor_line}\n")
    print("| configuration | round | train exchange | message received -> flwr-clientapp "
          "started | flwr-clientapp started -> reply | wait outside the nodes | "
          "flwr-clientapp processes / messages | load | rounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = ("rounds", "train", "spawn", "clientapp", "wait")
    for name, results in runs.items():
        label = f"{name} (what-if)" if SETUPS[name].what_if else name
        failed = [r["error"] for r in results if "error" in r]
        done = [r for r in results if "error" not in r]
        if not done:
            print(f"| {label} | failed: {failed[0]} |" + " |" * 7)
            continue
        med = {k: statistics.median([x for r in done for x in r[k]]) for k in keys}
        print(f"| {label} | " + " | ".join(f"{med[k]:.2f} s" for k in keys) + " | "
              f"{sum(r['clientapps'] for r in done)} / {sum(r['messages'] for r in done)} | "
              f"{' '.join(str(r['load']) for r in done)} | "
              f"{' '.join(f'{x:.1f}' for r in done for x in r['rounds'])} |"
              + (f" ({len(failed)} run(s) failed)" if failed else ""))


if __name__ == "__main__":
    main()
