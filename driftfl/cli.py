"""The `driftfl` command.

    driftfl run [hydra overrides]       one experiment in local Ray simulation
    driftfl run -m [sweep overrides]    a Hydra multirun: one run directory per job
    driftfl report DIR...               tables and plots over many runs
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

USAGE = """usage: driftfl <command> [arguments]

commands:
  run [overrides]     run one experiment in local simulation, e.g.
                      driftfl run strategy=fedprox strategy.mu=0.01 partition.alpha=0.1 rounds=20
  run -m [overrides]  sweep (Hydra multirun), e.g. driftfl run -m strategy=fedavg,fedprox seed=0,1,2
  run --help          every setting and config group (Hydra's help)
  run --cfg job       print the composed config without running it
  report DIR...       mean ± std tables and accuracy plots over many runs, e.g.
                      driftfl report multirun/2026-11-22/10-00-00 --target fedavg
"""


def _run_job(cfg) -> None:
    """One Hydra job: check the experiment, then launch it in simulation."""
    from hydra.core.hydra_config import HydraConfig

    from driftfl.common.config import experiment_only
    from driftfl.common.errors import ConfigError
    from driftfl.launch import launch_simulation
    from driftfl.server.experiment import prepare_experiment

    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    try:
        experiment = prepare_experiment(experiment_only(cfg), make_partition=True)
        if experiment.cfg.device == "cuda" and not experiment.cfg.simulation.client_gpus:
            raise ConfigError("device=cuda needs a GPU share per simulated client, e.g. "
                              "simulation.client_gpus=0.5 (two clients per GPU at a time)")
        code = launch_simulation(experiment.cfg, list(hydra.overrides.task), run_dir)
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if code:
        raise SystemExit(code)


# Hydra flags that only show something: nothing runs, so nothing is checked first
SHOWING = {"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion",
           "-sc"}


def refusal(args: list[str]) -> str | None:
    """The first problem in these overrides, found before Hydra writes anything or prints its
    own advice (`+roundz=3` for a typo): every combination of swept config groups is composed
    and checked, a swept value at its first value. None when all is well, or when Hydra should
    speak for itself (overrides it cannot parse, glob sweeps)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from driftfl.common.config import compose, conf_dir
    from driftfl.common.errors import ConfigError
    from driftfl.methods import check_experiment

    words = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        overrides = [o for o in OverridesParser.create().parse_overrides(words)
                     if not o.key_or_group.startswith("hydra")]
        options = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
                   if o.is_sweep_override() else [o.input_line] for o in overrides]
    except Exception:
        return None
    options = [values if (conf_dir() / o.key_or_group).is_dir() else values[:1]
               for o, values in zip(overrides, options)]
    for combination in itertools.islice(itertools.product(*options), 100):
        try:
            check_experiment(compose(list(combination)))
        except ConfigError as err:
            return str(err)
    return None


def run(args: list[str]) -> None:
    import hydra

    from driftfl.common.config import conf_dir
    from driftfl.common.errors import ConfigError

    try:
        config_path = str(conf_dir())
        problem = None if SHOWING & set(args) else refusal(args)
    except ConfigError as err:
        problem = str(err)
    if problem:
        print(f"driftfl: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = ["driftfl run", *args]
    hydra.main(config_path=config_path, config_name="config", version_base="1.3")(_run_job)()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, args = argv[0], argv[1:]
    if command == "run":
        run(args)
    elif command == "report":
        from driftfl.report import main as report

        report(args)
    else:
        print(f"driftfl: unknown command '{command}'; valid: report, run\n\n{USAGE}",
              file=sys.stderr, end="")
        raise SystemExit(2)


if __name__ == "__main__":
    main()
