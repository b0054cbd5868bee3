"""The simulation host's Ray start: ready when Ray says so, else one line with the cause."""

from __future__ import annotations

import subprocess

from driftfl.host import RAY_READY, last_error, wait_ready


def started(tmp_path, script: str) -> tuple[subprocess.Popen, object]:
    log = tmp_path / "superlink.log"
    log.write_text("--- ray start (waiting up to 30 s)\n")
    with open(log, "a") as out:
        return subprocess.Popen(["sh", "-c", script], stdout=out, stderr=subprocess.STDOUT), log


def test_ray_is_ready_once_it_says_it_started(tmp_path):
    ray, log = started(tmp_path, f"echo 'Local node IP: 127.0.0.1'; echo '{RAY_READY} "
                                 "127.0.0.1:6379'; sleep 5")
    try:
        assert wait_ready(ray, log, timeout=10) == ("127.0.0.1:6379", "")
    finally:
        ray.kill()


def test_a_ray_that_exits_is_one_line_naming_its_last_error(tmp_path):
    ray, log = started(tmp_path, "echo 'starting'; echo 'ValueError: Failed to bind to "
                                 "127.0.0.1:6379'; echo 'bye'; exit 1")
    assert wait_ready(ray, log, timeout=10) == (
        "", "Ray exited with code 1: ValueError: Failed to bind to 127.0.0.1:6379")


def test_a_ray_that_never_answers_times_out(tmp_path):
    ray, log = started(tmp_path, "sleep 5")
    try:
        assert wait_ready(ray, log, timeout=0.5) == ("", "not ready within 0.5 s")
    finally:
        ray.kill()


def test_the_last_error_line_or_else_the_last_line():
    assert last_error("a\nRuntimeError: x\nb\n") == "RuntimeError: x"
    assert last_error("a\nb\n") == "b"
    assert last_error("") == "no output"
