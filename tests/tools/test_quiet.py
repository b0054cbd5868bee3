"""driftfl run's console: the run's own lines; Flower's and Ray's notices only with verbose."""

from __future__ import annotations

import io

from driftfl.quiet import relay

FLOWER = [
    "Using SuperLink: driftfl-simulation (127.0.0.1:55521)\n",
    "Successfully started run 6811824672434560526\n",
    "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `6811824672434560526`\n",
    "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation\n",
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 "
    "to 2.\n",
    "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (10 simulated SuperNodes)\n",
    "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:\n",
    "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> "
    "--num-supernodes <N>\n",
    "Successfully installed driftfl to /tmp/driftfl-flower-x/apps/driftfl.driftfl.0.1.0.9c.\n",
    "/x/ray/_private/worker.py:2046: FutureWarning: Tip: In future versions of Ray, ...\n",
    "  warnings.warn(\n",
    "(raylet) [repeated 9x across cluster] (Ray deduplicates logs by default. Set "
    "RAY_DEDUP_LOGS=0 to disable log deduplication)\n",
    "\x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n",
    "\x1b[91mERROR \x1b[0m:     Exit Code: 200\n",
    "An unhandled exception occurred in the ServerApp.\n",
    "For more information, visit: <https://flower.ai/docs/framework/ref-exit-codes/200.html>\n",
    "\x1b[91mERROR \x1b[0m:     Exit Code: 700\n",
    "\n",
    "An unhandled exception occurred when running the simulation.\n",
    "\n",
]
DRIFTFL = [
    "clients' data (fedavg on fmnist, Dirichlet(0.5), 10 clients, cnn): 10 clients, 2000 samples\n",
    "round   1/2  test acc  37.40%  loss 1.9077  |  train 15.0 s  eval 0.5 s\n",
    "\x1b[93mWARNING \x1b[0m:   round reply from partition 2 (node 7) lost: the node sent "
    "nothing back\n",
    "driftfl: 2 rounds in 20.9 s after a 41.0 s start-up; final test accuracy 53.20% (best "
    "53.20% at round 2)\n",
]


def test_only_the_runs_own_lines_are_shown_unless_verbose():
    quiet, verbose = io.StringIO(), io.StringIO()
    relay(FLOWER + DRIFTFL, verbose=False, out=quiet)
    relay(FLOWER + DRIFTFL, verbose=True, out=verbose)
    assert quiet.getvalue() == "".join(DRIFTFL)
    assert verbose.getvalue() == "".join(FLOWER + DRIFTFL)


def test_following_stops_after_the_results_line_and_reads_no_further():
    """What Flower prints after a completed run's results line is its own shutdown: driftfl
    stops reading there (and stops the SuperLink), and takes nothing after it."""
    from driftfl.server.console import RESULTS, summary_line

    closing = summary_line({"rounds": 2, "seconds": 20.9, "startup_seconds": 41.0,
                            "final_accuracy": 0.532,
                            "best_accuracy": 0.532, "best_round": 2}, "/runs/x").split("\n")
    assert closing[1].startswith(RESULTS)
    lines = iter(DRIFTFL[:2] + [line + "\n" for line in closing] + FLOWER)
    out = io.StringIO()
    assert relay(lines, verbose=True, out=out, last=RESULTS)
    assert out.getvalue() == "".join(DRIFTFL[:2]) + "\n".join(closing) + "\n"
    assert next(lines) == FLOWER[0]  # still unread
    # a run that never got there (failed, or its stream broke): every line, and False
    assert not relay(iter(FLOWER + DRIFTFL), verbose=True, out=io.StringIO(), last=RESULTS)


def test_a_simulated_clients_lines_come_as_it_printed_them_each_once():
    """Ray names the worker before each line it forwards, coloured unless RAY_COLOR_PREFIX=0
    (which driftfl run sets, with RAY_DEDUP_LOGS=0 so that no client's line is folded into
    another's "[repeated 4x across cluster]")."""
    from driftfl.host import flwr_env

    printed = ["condense: client 3 iteration 5/20, matching loss 1.664, 1.4 s\n",
               "condense: client 0 iteration 5/20, matching loss 1.436, 0.1 s\n"]
    forwarded = ["\x1b[36m(ClientAppActor pid=11907)\x1b[0m " + printed[0],
                 "(ClientAppActor pid=11906, ip=10.0.0.2) " + printed[1]]
    quiet, verbose = io.StringIO(), io.StringIO()
    relay(forwarded, verbose=False, out=quiet)
    relay(forwarded, verbose=True, out=verbose)
    assert quiet.getvalue() == "".join(printed)
    assert verbose.getvalue() == "".join(forwarded)
    env = flwr_env("/tmp/x")
    assert env["RAY_DEDUP_LOGS"] == "0" and env["RAY_COLOR_PREFIX"] == "0"


# a Ray actor's SIGABRT as a run's console showed it (kill -ABRT of a ClientAppActor)
ACTOR = "\x1b[36m(ClientAppActor pid=21254)\x1b[0m "
STAMP = "[2026-11-27 20:58:43,022 E 21254 21254] logging.cc:474: "
CRASH = [ACTOR + line + "\n" for line in [
    "*** SIGABRT received at time=1795813122 on cpu 1 ***",
    "PC: @     0x7f904e926f36  (unknown)  epoll_wait",
    "    @     0x7f904da1f80d        128  boost::asio::detail::scheduler::do_run_one()",
    "    @ ... and at least 2 more frames",
    STAMP + "*** SIGABRT received at time=1795813123 on cpu 1 ***",
    STAMP + "PC: @     0x7f904e926f36  (unknown)  epoll_wait",
    STAMP + "    @     0x7f904e85a050  1072917824  (unknown)",
    "Fatal Python error: Aborted",
    "",
    "Stack (most recent call first):",
    '  File "/x/ray/_private/worker.py", line 1039 in main_loop',
    "Extension modules: msgpack._cmsgpack, google._upb._message, psutil._psutil_linux",
]] + ["\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an "
      "unexpected system error. To troubleshoot the problem, check the logs for the dead "
      "worker. Worker PID: 21254 Worker exit type: SYSTEM_ERROR\n"]
MUTEX = ["[mutex.cc : 1417] RAW: Check r == 0 failed: Mutex corrupt: both reader and writer "
         "lock held: 0x55d7\n", "*** SIGABRT received at time=1795813200 on cpu 0 ***\n",
         "PC: @     0x7f904e926f36  (unknown)  raise\n"]


def test_a_crashed_ray_process_is_one_line_unless_verbose():
    quiet, verbose = io.StringIO(), io.StringIO()
    relay(DRIFTFL[:2] + CRASH + DRIFTFL[2:], verbose=False, out=quiet)
    relay(DRIFTFL[:2] + CRASH + DRIFTFL[2:], verbose=True, out=verbose)
    assert quiet.getvalue() == "".join(DRIFTFL[:2]) + (
        "driftfl: a Ray process crashed (ClientAppActor pid=21254: SIGABRT); verbose=true "
        "shows its report\n") + "".join(DRIFTFL[2:])
    assert verbose.getvalue() == "".join(DRIFTFL[:2] + CRASH + DRIFTFL[2:])
    # a worker Ray started but had not yet named (a memory kill during its start)
    quiet = io.StringIO()
    relay([line.replace("ClientAppActor pid", "pid") for line in CRASH], False, out=quiet)
    assert quiet.getvalue() == ("driftfl: a Ray process crashed (pid=21254: SIGABRT); "
                                "verbose=true shows its report\n")
    # a crash in the run's own process (no Ray prefix): its first line names it
    quiet = io.StringIO()
    relay(MUTEX + DRIFTFL, verbose=False, out=quiet)
    assert quiet.getvalue() == (
        "driftfl: a Ray process crashed ([mutex.cc : 1417] RAW: Check r == 0 failed: Mutex "
        "corrupt: both reader and writer lock held: 0x55d7); verbose=true shows its report\n"
        + "".join(DRIFTFL))


def test_a_deployed_runs_id_is_kept_for_the_line_that_says_how_to_stop_it():
    import io

    from driftfl.launch import stopped_following
    from driftfl.quiet import relay

    seen = {}
    relay(["Using SuperLink: lab (10.0.0.2:9093)\n",
           "\x1b[92mSuccessfully started run 4242424242\x1b[0m\n", "round 1/3 ...\n"],
          False, io.StringIO(), seen=seen)
    assert seen == {"run_id": "4242424242"}
    assert stopped_following("lab", "4242424242").endswith(
        "Stop it with: flwr stop 4242424242 lab")
    assert "flwr ls lab" in stopped_following("lab", None)


def test_flowers_traceback_of_a_failed_simulation_is_one_line_with_its_cause():
    """Ray that cannot start on a loaded machine made Flower print ~110 lines of traceback;
    the console gets the last exception raised, with advice, and what follows as usual."""
    import io

    from driftfl.quiet import relay

    report = ["\x1b[91mERROR \x1b[0m:   Simulation raised an exception\n",
              "Traceback (most recent call last):\n", '  File "a.py", line 3, in f\n',
              "    ray.init()\n", "TimeoutError: Timed out waiting for the GCS\n", "\n",
              "The above exception was the direct cause of the following exception:\n", "\n",
              "Traceback (most recent call last):\n", '  File "b.py", line 9, in g\n',
              "RuntimeError: Failed to connect to GCS at 127.0.0.1:6379\n"]
    out = io.StringIO()
    relay(["driftfl: submitting the run\n", *report, "driftfl: the run did not complete\n"],
          False, out)
    assert out.getvalue().splitlines() == [
        "driftfl: submitting the run",
        "driftfl: the simulation failed: RuntimeError: Failed to connect to GCS at "
        "127.0.0.1:6379; the machine may be too busy for Ray to start: try again, or with "
        "fewer runs at once (verbose=true shows Flower's traceback)",
        "driftfl: the run did not complete"]
    shown = io.StringIO()
    relay(report, True, shown)  # verbose: all of it
    assert shown.getvalue() == "".join(report)
    ended = io.StringIO()
    relay(report[:5], False, ended)  # the stream ends inside the report: its line still comes
    assert ended.getvalue().startswith("driftfl: the simulation failed: TimeoutError: ")


def test_a_simulated_clients_exception_is_one_line_with_its_reason():
    """A simulated node that refuses a message (or a ClientApp that raises) made Flower print
    the Ray actor's traceback and then the engine's, some 110 lines (a real run's, shortened);
    the console gets one line with the reason, then the server's own line about the reply."""
    reason = ("the server asks for privacy=none; this node trains only under "
              "privacy=distributed or stronger (min-privacy): refused")
    actor = "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=31365, ip=192.0.2.2, actor_id=0f0f)"
    report = [
        f"\x1b[91mERROR \x1b[0m:     {actor}\n",
        "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
        '  File "/x/flwr/clientapp/client_app.py", line 161, in __call__\n',
        "    return self._registered_funcs[full_name](message, context)\n",
        '  File "/x/driftfl/client/job.py", line 106, in check_floor\n',
        '    raise ConfigError(f"{refusal}: refused")\n',
        f"driftfl.common.errors.ConfigError: {reason}\n", "\n",
        "The above exception was the direct cause of the following exception:\n", "\n",
        f"{actor}\n",
        '  File "/x/flwr/simulation/ray_transport/ray_actor.py", line 65, in run\n',
        "    raise ClientAppException(str(ex)) from ex\n",
        "flwr.clientapp.client_app.ClientAppException: \n",
        f"Exception ClientAppException occurred. Message: {reason}\n",
        "\x1b[91mERROR \x1b[0m:     Traceback (most recent call last):\n",
        '  File "/x/flwr/server/superlink/fleet/vce/vce_api.py", line 132, in worker\n',
        "    raise value.as_instanceof_cause()\n",
        f"ray.exceptions.RayTaskError(ClientAppException): {actor}\n",
        "flwr.clientapp.client_app.ClientAppException: \n",
        f"Exception ClientAppException occurred. Message: {reason}\n", "\n"]
    rejected = (f"\x1b[93mWARNING \x1b[0m:   round reply from partition 0 (node 5013) rejected: "
                f"error reply: {reason}\n")
    out = io.StringIO()
    relay(["round   0/1  test acc   8.00%\n", *report, rejected, "round   1/1  ...\n"], False,
          out)
    assert out.getvalue().splitlines() == [
        "round   0/1  test acc   8.00%",
        f"driftfl: a simulated client failed: {reason} (verbose=true shows Flower's traceback)",
        rejected.rstrip("\n"), "round   1/1  ..."]
    shown = io.StringIO()
    relay(report, True, shown)  # verbose: all of it
    assert shown.getvalue() == "".join(report)


# Ctrl-C on `driftfl run ... 2>&1 | tee run.log` stops tee too: driftfl's lines then meet a
# pipe with no reader. Run in a fresh interpreter (its stdout and stderr are what is tested).
STOPPED_THROUGH_A_CLOSED_PIPE = """
import sys, time
import driftfl.quiet as quiet
quiet.TERMINAL = sys.argv[1]
sys.stdin.readline()  # the test has closed its end of our stdout and stderr
quiet.relay(["driftfl: progress round 1: 1/2 clients answered (5 s)\\n", "round 1 ...\\n"], False)
quiet.say("driftfl: stopped; it is saved after round 1 of 3, go on with: ...")
print("and what the interpreter flushes last")
raise SystemExit(130)
"""


def test_a_stop_through_a_closed_pipe_exits_130_and_tells_the_terminal(tmp_path):
    """No traceback, no exit 1 or 120: the stop's exit code, and its line on the terminal."""
    import subprocess
    import sys

    terminal = tmp_path / "tty"
    run = subprocess.Popen([sys.executable, "-c", STOPPED_THROUGH_A_CLOSED_PIPE, str(terminal)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run.stdout.close()
    run.stderr.close()
    run.stdin.write(b"go\n")
    run.stdin.close()
    assert run.wait(timeout=60) == 130
    assert terminal.read_text() == ("driftfl: stopped; it is saved after round 1 of 3, go on "
                                    "with: ...\n")
