"""Test-only: makes one real client fail inside a SecAgg+ stage of a real `driftfl run`.

On PYTHONPATH only in tests/e2e (never in the product), imported by every Python process of the
run; it acts only where DRIFTFL_TEST_FAIL_STAGE names a stage of Flower's secaggplus_mod
("setup", "share_keys", "unmask"). The first client process to reach that stage (an O_EXCL
marker file in DRIFTFL_TEST_FAIL_DIR decides, across Ray workers) raises there, once."""

import os

STAGE = os.environ.get("DRIFTFL_TEST_FAIL_STAGE")

if STAGE:
    import importlib
    from pathlib import Path

    module = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")

    name = {"setup": "_setup", "share_keys": "_share_keys", "unmask": "_unmask"}[STAGE]
    honest = getattr(module, name)

    def failing_once(state, configs):
        marker = Path(os.environ["DRIFTFL_TEST_FAIL_DIR"]) / "failed"
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return honest(state, configs)
        raise RuntimeError(f"hostile client: fails in the {STAGE} stage")

    setattr(module, name, failing_once)
