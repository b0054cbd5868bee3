"""A client's error reply becomes one short line: Ray's kilobytes of out-of-memory report are
named by the resource, with the setting to change, once per exchange; other errors keep their
last line, shortened; Flower's own copy of a resource error stays off the console."""

from __future__ import annotations

import logging

from flwr.app import Error

from driftfl.common.error_replies import (MAX_REASON, change_for, error_reason,
                                          quiet_flower_errors, refusal_lines)

# Flower's reason for a Ray OOM kill, as a run printed it (the memory table cut short)
RAY_OOM = ("<class 'ray.exceptions.OutOfMemoryError'>:<'1 worker(s) were killed due to the "
           "node running low on memory. Memory on the node (IP: 192.0.2.2, ID: 8ad21ffa) was "
           "9.93GB / 23.54GB (0.421690), which exceeds the memory usage threshold of 0.050000; "
           "Object store memory usage: [- objects spillable: 1; - bytes spillable: 800614]; "
           "Top 10 memory users: PID\tMEM(GB)\tCOMMAND, 9977\t0.76\tray::ClientAppActor, "
           + "x" * 2000 + "'>")
ACTOR_DIED = ("<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly before "
              "finishing this task.\n\tclass_name: ClientAppActor\n\tpid: 4242\nThe actor is "
              "dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker "
              "exit detail: Worker unexpectedly exits with a connection error code 2. (1) The "
              "process is killed by SIGKILL by OOM killer due to high memory usage.'>")
CLIENT_BUG = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor"
              ".run() (pid=77, ip=192.0.2.2)\n  File \"x.py\", line 3, in run\nflwr.clientapp."
              "client_app.ClientAppException: \nException ClientAppException occurred. Message: "
              "batch_size 128 exceeds this node's max-batch-size=64'>")


def test_a_resource_error_is_named_by_its_resource_and_class():
    assert error_reason(Error(code=0, reason=RAY_OOM)) == \
        "error reply: out of memory (OutOfMemoryError)"
    # its text also names the OOM killer among possible causes: still a dead worker
    assert error_reason(Error(code=0, reason=ACTOR_DIED)) == \
        "error reply: a dead Ray worker (ActorDiedError)"
    torch_oom = "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'CUDA out of memory.'>"
    assert error_reason(Error(code=2, reason=torch_oom)) == \
        "error reply: out of memory (ClientAppException)"


def test_another_error_keeps_its_last_line_shortened():
    assert error_reason(Error(code=2, reason=CLIENT_BUG)) == \
        "error reply: batch_size 128 exceeds this node's max-batch-size=64"
    assert error_reason(Error(code=0, reason="ValueError('boom')")) == \
        "error reply: ValueError('boom')"
    long = error_reason(Error(code=0, reason="y" * 5000))
    assert long == "error reply: " + "y" * (MAX_REASON - 3) + "..."
    assert error_reason(Error(code=3, reason="")) == "error reply: code 3"


def test_replies_that_failed_for_a_resource_make_one_line_naming_the_setting():
    refused = [("partition 0 (node 11)", error_reason(Error(code=0, reason=RAY_OOM))),
               ("partition 1 (node 12)", "'num-examples' is missing or not a positive number"),
               ("partition 2 (node 13)", error_reason(Error(code=0, reason=RAY_OOM)))]
    assert refusal_lines("round", refused) == [
        "round reply from partition 1 (node 12) rejected: 'num-examples' is missing or not a "
        "positive number",
        "round replies of 2 client(s) (partition 0, partition 2) failed: out of memory; run "
        "fewer clients at once (a larger simulation.client_cpus), or a smaller batch_size or "
        "model; under device=cuda, a larger simulation.client_gpus"]
    assert refusal_lines("round", []) == []
    assert "simulation.client_cpus" in change_for(f"partition 0 (node 11): {refused[0][1]}")
    assert change_for(refused[1][1]) == ""


def record(msg, level=logging.ERROR, args=()) -> logging.LogRecord:
    return logging.LogRecord("flwr", level, "vce_api.py", 1, msg, args, None)


def test_flowers_copy_of_a_resource_error_stays_off_the_console():
    oom = RuntimeError(RAY_OOM)
    traceback = f"Traceback (most recent call last):\n  File ...\nray.exceptions.{RAY_OOM}"
    header = record("An exception was raised when processing a message by %s", args=("Ray",))
    for dropped in (record(oom), record(traceback), header):
        assert not quiet_flower_errors(dropped)
    # a client's own bug keeps Flower's traceback; warnings and the like pass
    for kept in (record(CLIENT_BUG), record("round 2: no usable reply", logging.WARNING)):
        assert quiet_flower_errors(kept)
