"""``driftfl run resume=DIR``'s overrides: those the run was started with, those the command
line gives again in their place (cli.resumed). What may differ from the run's own settings
(rounds, and how a run is carried out) the checkpoint's check decides, naming any other
(driftfl/server/checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

from driftfl.common.errors import ConfigError

# a stopped run's stop line, in its directory (`driftfl run` writes it; a resume removes it)
STOPPED = "stopped.txt"


def ran_with(run_dir: Path) -> list[str]:
    """The overrides ``driftfl run`` started the run in ``run_dir`` with ([] where it did
    not write them: a run of `flwr run`, or from before they were kept)."""
    import yaml

    saved = run_dir / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        return []
    overrides = yaml.safe_load(saved.read_text())
    if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
        raise ConfigError(f"resume={run_dir}: {saved} is not a list of overrides; give the "
                          "run's overrides on the command line")
    return overrides


def with_overrides(earlier: list[str], given: list[str]) -> list[str]:
    """``earlier`` overrides with those of ``given`` that set the same key in the place of
    the first that did (and the others left out), then the rest of ``given``; of a key given
    twice, the last."""
    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    new, merged, replaced = {key(o): o for o in given}, [], set()
    for override in earlier:
        if key(override) not in new:
            merged.append(override)
        elif key(override) not in replaced:
            merged.append(new[key(override)])
            replaced.add(key(override))
    return merged + [o for k, o in new.items() if k not in replaced]
