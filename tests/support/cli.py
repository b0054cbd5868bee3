"""The `driftfl` command in this process: what a real `driftfl` process would print and exit
with, without its start-up (2-38 s a call, mostly importing torch, against well under one).

A refusal's contract (exit code 2, one line on stderr, nothing written) keeps a few real
subprocess tests (tests/tools/test_cli.py); the rest check the same function here."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from unittest import mock


def driftfl(*args: str, cwd: Path, env: Mapping[str, str | None] | None = None
            ) -> subprocess.CompletedProcess:
    """``driftfl <args>`` run by driftfl.cli.main in this process, in ``cwd``, with ``env``
    added to the environment: its exit code, standard output and standard error as a
    subprocess's would be (a SystemExit's code; 0 when main returns); a None in ``env`` unsets
    that variable. The working directory,
    the environment, sys.argv and Hydra's global state are restored afterwards."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from driftfl import cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), list(sys.argv), os.getcwd()
    # Hydra configures logging for each job it runs (logging.config.dictConfig, which closes
    # every handler there is, pytest's among them): here it runs without, as Hydra's own test
    # utilities run it (with_log_configuration=False)
    quiet = contextlib.ExitStack()
    for module in ("hydra.main", "hydra._internal.hydra", "hydra.core.utils",
                   "hydra._internal.core_plugins.basic_launcher"):
        quiet.enter_context(mock.patch(f"{module}.configure_log", lambda *a, **k: None))
    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.chdir(cwd)
    code = 0
    try:
        with quiet, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main(list(args))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
    return subprocess.CompletedProcess(["driftfl", *args], code, out.getvalue(), err.getvalue())
