"""`driftfl run resume=DIR` alone goes on with the overrides the run was started with: those
the command line gives again replace theirs, and whatever else differs from the run's own
settings is refused by the checkpoint's check (tests/server/test_resume.py)."""

from __future__ import annotations

import pytest

from driftfl.cli import resumed
from driftfl.common.errors import ConfigError
from driftfl.resume import with_overrides


@pytest.mark.parametrize("given, merged", [
    ([], ["strategy=fedprox", "strategy.mu=0.1", "rounds=2"]),
    (["rounds=5"], ["strategy=fedprox", "strategy.mu=0.1", "rounds=5"]),
    (["round_timeout=60", "rounds=4"],
     ["strategy=fedprox", "strategy.mu=0.1", "rounds=4", "round_timeout=60"]),
    (["+strategy.mu=0.2"], ["strategy=fedprox", "+strategy.mu=0.2", "rounds=2"]),
    (["rounds=3", "rounds=4"], ["strategy=fedprox", "strategy.mu=0.1", "rounds=4"]),
])
def test_given_overrides_replace_the_runs_own_of_the_same_key(given, merged):
    assert with_overrides(["strategy=fedprox", "strategy.mu=0.1", "rounds=2"], given) == merged


def test_a_key_the_run_was_given_twice_takes_the_new_value_once():
    """Hydra takes a key's last value: the run's second rounds= must not outlast the new one."""
    assert with_overrides(["rounds=2", "lr=0.1", "rounds=1"], ["rounds=3"]) == ["rounds=3",
                                                                               "lr=0.1"]
    assert with_overrides(["rounds=2", "rounds=1"], []) == ["rounds=2", "rounds=1"]


def run_dir(tmp_path, overrides: str | None):
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    if overrides is not None:
        (folder / ".hydra" / "overrides.yaml").write_text(overrides)
    return folder


def test_resume_alone_takes_the_runs_overrides_and_its_directory(tmp_path):
    folder = run_dir(tmp_path, "- strategy=fedprox\n- rounds=2\n")
    assert resumed([f"resume={folder}"]) == (
        ["strategy=fedprox", "rounds=2", f"hydra.run.dir={folder}"], True)
    assert resumed(["--cfg", "job", f"resume={folder}", "rounds=3"]) == (
        ["--cfg", "job", "strategy=fedprox", "rounds=3", f"hydra.run.dir={folder}"], True)
    assert resumed(["rounds=3"]) == (["rounds=3"], False)


def test_a_run_without_its_overrides_resumes_with_those_given(tmp_path):
    """`flwr run` writes no .hydra: the command line must give them (the checkpoint's check
    names what differs)."""
    folder = run_dir(tmp_path, None)
    assert resumed([f"resume={folder}", "lr=0.1"]) == (["lr=0.1", f"hydra.run.dir={folder}"],
                                                        True)


def test_unreadable_saved_overrides_are_one_line(tmp_path):
    folder = run_dir(tmp_path, "overrides: [rounds=2]\n")
    with pytest.raises(ConfigError, match=r"overrides.yaml is not a list of overrides; give the "
                                          r"run's overrides on the command line$"):
        resumed([f"resume={folder}"])
