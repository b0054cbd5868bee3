"""The `driftfl` command.

    driftfl run [hydra overrides]       one experiment in local Ray simulation (or, with
                                        superlink=NAME, on a deployed federation)
    driftfl run -m [sweep overrides]    a Hydra multirun: one run directory per job
    driftfl report DIR...               tables and plots over many runs
    driftfl split DIR [overrides]       each client's share of the data as its own file
    driftfl audit RUN_DIR               how close the images a run's clients shipped are to
                                        their real data
    driftfl evaluate RUN_DIR [overrides]
                                        a saved model's accuracy overall, per class and per
                                        client, on its run's data or other data
    driftfl secure init|connect|register|proxy
                                        credentials, connections, node registration, the
                                        fleet proxy
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from driftfl.common.errors import ConfigError
from driftfl.common.paths import cannot_write, existing_ancestor
from driftfl.resume import ran_with, with_overrides

if TYPE_CHECKING:
    from omegaconf import DictConfig

USAGE = """usage: driftfl <command> [arguments]

commands:
  run [overrides]     run one experiment in local simulation, e.g.
                      driftfl run strategy=fedprox strategy.mu=0.01 partition.alpha=0.1 rounds=20
  run -m [overrides]  sweep (Hydra multirun), e.g. driftfl run -m strategy=fedavg,fedprox seed=0,1,2
  run --help [GROUP=OPTION ...]
                      every config group and setting: type, default, meaning (and the
                      settings of the options named, e.g. strategy=dcfl); Hydra's: --hydra-help
  run --cfg job       print the composed config without running it
  run resume=DIR [rounds=N]
                      go on with a stopped run from its last complete round, with the
                      settings it ran with (rounds=N: more rounds than it had)
  run superlink=NAME [overrides]
                      run on a deployed federation instead: NAME is a SuperLink connection
                      in ~/.flwr/config.toml (docs/deployment.md)
  report DIR...       mean ± std tables and accuracy plots over many runs, e.g.
                      driftfl report multirun/2026-11-22/10-00-00 --target fedavg
  split DIR [overrides]
                      write each client's share of the experiment's partition to
                      DIR/client-<k>.npz, for SuperNodes that hold only their own data
  audit RUN_DIR [--data DIR] [--threshold T]
                      how close the images a run's clients shipped (DCFL's condensed sets) are
                      to their own real data: the share of near-copies (Pearson correlation
                      >= 0.95) per client, audit.json, and a PNG pairing each shipped image
                      with its nearest real one; a deployed run's data: --data DIR, the files
                      `driftfl split` wrote
  evaluate RUN_DIR|MODEL.pt [overrides] [--out FILE.json]
                      a saved model's test accuracy overall and per class, and each client's
                      on its held-out share (client_test_fraction), on the run's own experiment
                      or with overrides on top, e.g.
                      driftfl evaluate outputs/first partition.alpha=0.1 client_test_fraction=0.2
  secure init|connect|register|proxy
                      a secure deployment: the CA, the SuperLink's certificate and node keys;
                      a SuperLink connection for flwr; registering node keys; the proxy
                      that lets nodes reach only the Fleet API (driftfl secure --help)
"""


def _run_job(cfg, hydra_subdir: str | None = None, keep: Path | None = None,
             resume: bool = False) -> float:
    """One Hydra job: check the experiment, then launch it (in simulation, or on the deployed
    federation ``superlink`` names). Hydra's own files
    go to ``hydra_subdir`` (.hydra) only once the run is accepted, and a refused run removes
    the empty folders Hydra made for it below ``keep``. ``resume``: the run directory holds a
    stopped run of this experiment, to go on with. Returns the final test accuracy: the
    objective a tuning sweeper (hydra/sweeper=optuna) maximises."""
    from hydra.core.hydra_config import HydraConfig

    from driftfl.common.composing import experiment_only
    from driftfl.launch import check_connection, check_launch, launch_deployment, launch_simulation
    from driftfl.methods import check_experiment
    from driftfl.server.experiment import prepare_experiment

    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    overrides = list(hydra.overrides.task)
    deployed = bool(cfg.get("superlink"))
    try:
        if deployed:  # the data is the nodes' and the ServerApp's: only the settings here
            experiment_cfg = check_experiment(experiment_only(cfg))
            check_connection(experiment_cfg.superlink)
        else:
            experiment = prepare_experiment(experiment_only(cfg), make_partition=True)
            experiment_cfg = experiment.cfg
            if experiment_cfg.device == "cuda" and not experiment_cfg.simulation.client_gpus:
                raise ConfigError("device=cuda needs a GPU share per simulated client, e.g. "
                                  "simulation.client_gpus=0.5 (two clients per GPU at a time)")
        check_launch(overrides, run_dir, experiment_cfg.simulation.ray_address)
        if experiment_cfg.tracker == "mlflow" and not deployed:  # the ServerApp's cwd is not ours
            from driftfl.server.tracker import prepare_mlflow

            prepare_mlflow()
        if experiment_cfg.tracker == "wandb" and not deployed:  # deployed: the ServerApp checks
            from driftfl.server.tracker_wandb import check_wandb

            check_wandb()
        if resume and not deployed:  # a deployed run's ServerApp checks its own checkpoint
            from driftfl.server import checkpoint

            checkpoint.check(run_dir, experiment)
        elif not resume:  # a DP run's record of its releases is never started over
            from driftfl.server.ledger import check_fresh

            check_fresh(run_dir)
    except ConfigError as err:
        _remove_empty(run_dir, keep)
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if hydra_subdir is not None:
        _save_hydra_files(cfg, run_dir, hydra_subdir)
    if not deployed and experiment_cfg.dataset.name == "folder":  # label k is which folder
        names = ", ".join(f"{k} {name}" for k, name in enumerate(experiment.data.classes))
        print(f"classes (the class folders, sorted): {names}", flush=True)
    if not deployed and experiment_cfg.strategy.name == "dcfl":  # its cost, before it starts
        from driftfl.dcfl.cost import cost_line

        data = experiment.data
        print(cost_line(experiment_cfg.strategy.model_dump(), experiment_cfg.model, data.shape,
                        data.num_classes), flush=True)
    launch = launch_deployment if deployed else launch_simulation
    code = launch(experiment_cfg, overrides, run_dir, resume)
    from driftfl.launch import run_status

    trained = run_status(run_dir) in ("completed", "incomplete")
    if trained and not deployed:
        from driftfl.audit import audit_after_run  # what the clients shipped (DCFL), against

        audit_after_run(run_dir, experiment)  # their data, loaded here already
    if code and _sweep_codes is None:
        raise SystemExit(code)
    if code:  # a sweep goes on with its other jobs and exits with the worst code at the end
        _sweep_codes.append(code)
    # a sweeper's objective (Optuna's): None for a run that trained nothing
    return json.loads((run_dir / "summary.json").read_text())["final_accuracy"] if trained \
        else None


# the exit codes of a sweep's jobs that did not complete (None: not a sweep)
_sweep_codes: list[int] | None = None


def worst(codes: list[int]) -> int:
    """A sweep's exit code: a failed job's over an incomplete one's, 0 when all completed."""
    from driftfl.launch import EXIT_CODES

    return max(codes, key=lambda c: (c == EXIT_CODES["failed"], c), default=0)


# driftfl run sets hydra.output_subdir to null so that Hydra writes nothing before the job has
# checked the experiment; the job writes Hydra's files itself (_save_hydra_files)
NO_HYDRA_FILES = "hydra.output_subdir=null"


def _save_hydra_files(cfg, run_dir: Path, subdir: str) -> None:
    """What Hydra writes to <run dir>/.hydra, as it would have written it."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, read_write

    hydra_cfg = copy.deepcopy(HydraConfig.instance().cfg)
    with read_write(hydra_cfg.hydra):
        hydra_cfg.hydra.output_subdir = subdir
        hydra_cfg.hydra.overrides.hydra = [o for o in hydra_cfg.hydra.overrides.hydra
                                           if o != NO_HYDRA_FILES]
    folder = run_dir / subdir
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", hydra_cfg),
                       ("overrides.yaml", hydra_cfg.hydra.overrides.task)):
        (folder / name).write_text(OmegaConf.to_yaml(node))


def _remove_empty(folder: Path, keep: Path | None) -> None:
    """Remove ``folder`` and its parents below ``keep`` while they are empty."""
    while keep and folder != keep and folder.is_relative_to(keep) and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


# Hydra flags that only show something: nothing runs and nothing is written, so only the
# overrides are checked (not where the run would go); shell completion and --version take none
SHOWING = {"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion",
           "-sc", "--version"}
NO_OVERRIDES = {"--shell-completion", "-sc", "--version"}


def overrides_in(args: list[str]) -> list[str]:
    """The overrides among ``driftfl run``'s arguments, as Hydra's own argument parser reads
    them; ConfigError in one line where it reads none (argparse would print its usage)."""
    from hydra._internal.utils import get_args_parser  # the parser hydra.main reads argv with

    parser = get_args_parser()

    def refuse(message: str):
        hint = ("; the flags (-m, --cfg, ...) go before the overrides, which go together"
                if message.startswith("unrecognized arguments") else "")
        raise ConfigError(f"{message}{hint} (driftfl run --help)")

    parser.error = refuse
    return parser.parse_args(args).overrides


def refusal(args: list[str], reachable: bool = True) -> str | None:
    """The first problem in these overrides, found before Hydra writes anything or prints its
    own advice (`+roundz=3` for a typo): every combination of swept config groups is composed
    and checked, a swept value at its first value; ``reachable``: and where the run would go
    (its federation, its Ray cluster). None when all is well, or when Hydra should speak for
    itself (glob sweeps). Every combination is composed, and its settings outside the dataset,
    model and server sections checked, before the full schema is imported (torch, Flower:
    seconds), so an unknown or misplaced setting or a bad value of those is refused at once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from driftfl.common.composing import composed, conf_dir

    words = overrides_in(args)
    parser = OverridesParser.create()
    for word in words:
        if problem := unparsable(parser, word):
            return problem
    try:
        overrides = [o for o in parser.parse_overrides(words)
                     if not o.key_or_group.startswith("hydra")]
        options = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
                   if o.is_sweep_override() else [o.input_line] for o in overrides]
    except Exception:
        return None
    options = [values if (conf_dir() / o.key_or_group).is_dir() else values[:1]
               for o, values in zip(overrides, options)]
    experiments = []
    for combination in itertools.islice(itertools.product(*options), 100):
        try:
            experiments.append(composed(list(combination)))
        except ConfigError as err:
            return str(err)
    from driftfl.common.experiment_settings import settings_problem

    for settings in experiments:  # what needs neither torch nor Flower, refused in a blink
        if problem := settings_problem(settings):
            return problem
    from driftfl.launch import check_destination
    from driftfl.methods import check_experiment

    for settings in experiments:
        try:
            experiment = check_experiment(settings)
            if reachable:
                check_destination(experiment)
        except ConfigError as err:
            return str(err)
    return None


def unparsable(parser, word: str) -> str | None:
    """Why ``word`` cannot be an override, in one line (with the quoting that reads it where
    quoting helps); None when it can."""
    if "'" in word:  # launch.run_config_arg: Flower's run config is passed in single quotes
        return (f"the override {word} holds a single quote ('), which the run config Flower "
                "passes to the ServerApp cannot carry; leave it out")
    if readable(parser, word) is not False:
        return None
    if "=" not in word:  # an empty argument, a key without its value
        return (f"cannot read the override {shlex.quote(word)}: an override is key=value, "
                "e.g. rounds=3 (https://hydra.cc/docs/advanced/override_grammar/basic)")
    key, value = word.split("=", 1)
    quoted = f'{key}="{value}"'
    example = f"; in bash: {shlex.quote(quoted)}" if readable(parser, quoted) else ""
    return (f"cannot read the override {word}: Hydra's override grammar needs a value with "
            f"quotes or unmatched brackets quoted{example} "
            "(https://hydra.cc/docs/advanced/override_grammar/basic)")


def readable(parser, word: str) -> bool | None:
    """Whether Hydra's grammar reads ``word``; None where only Hydra can tell (glob sweeps
    need its config loader)."""
    from hydra.errors import OverrideParseException

    try:
        parser.parse_overrides([word])
    except OverrideParseException:
        return False
    except Exception:
        return None
    return True


def output_dir(hydra_cfg: DictConfig, args: list[str]) -> tuple[str, Path]:
    """The setting that names the directory this command writes, and that directory:
    hydra.run.dir, or hydra.sweep.dir for a sweep; ConfigError where it is empty (Hydra would
    write into the current directory), or a sweep's job subdirectory is."""
    from omegaconf import OmegaConf

    kind = "sweep" if {"-m", "--multirun"} & set(args) else "run"
    key, folder = f"hydra.{kind}.dir", hydra_cfg[kind].dir
    if not folder or not str(folder).strip():
        raise ConfigError(f"{key} is empty; name a directory, e.g. {key}=outputs/first")
    subdir = OmegaConf.to_container(hydra_cfg.sweep)["subdir"]  # ${hydra.job.num}: unresolved
    if kind == "sweep" and (not subdir or not str(subdir).strip()):
        raise ConfigError("hydra.sweep.subdir is empty, so every job of the sweep would write "
                          "the same directory; leave it at its default (the job's number)")
    return key, Path(folder).absolute()


def _hydra_settings(args: list[str]) -> DictConfig:
    """Hydra's own section under the command's hydra overrides; ConfigError where it does not
    compose."""
    from driftfl.common.composing import hydra_section

    return hydra_section([a for a in overrides_in(args) if a.lstrip("+~").startswith("hydra")])


def resumed(args: list[str]) -> tuple[list[str], bool]:
    """``resume=DIR`` becomes ``hydra.run.dir=DIR`` (the run goes on in its own directory) and
    the overrides the run was started with (DIR/.hydra/overrides.yaml), each one the command
    line gives again replaced by its value there; whether it was there. A resumed run may
    change only rounds and how it is carried out: the checkpoint's check names any other."""
    chosen = [a for a in args if a.startswith("resume=")]
    if not chosen:
        return args, False
    folder = Path(chosen[-1].split("=", 1)[1]).expanduser().absolute()
    if {"-m", "--multirun"} & set(args):
        raise ConfigError("resume= goes on with one run; drop -m")
    if any(a.startswith("hydra.run.dir=") for a in args):
        raise ConfigError("resume=DIR runs in DIR; drop hydra.run.dir")
    if not folder.is_dir():
        raise ConfigError(f"resume={folder}: no such run directory")
    args = [a for a in args if a not in chosen]
    given = overrides_in(args)
    merged = with_overrides(ran_with(folder), given)
    at = next((i for i, a in enumerate(args) if a in given), len(args))  # Hydra's flags first
    return ([*args[:at], *merged, *args[at + len(given):], f"hydra.run.dir={folder}"], True)


def checked_job(args: list[str]) -> tuple[list[str], Callable, Path]:
    """Hydra's arguments and the job to give it, once the experiment and the directory it
    writes are checked, and that directory (a sweep's); ConfigError names the first problem."""
    args, resume = resumed(args)
    problem = refusal(args)
    if problem:
        raise ConfigError(problem)
    hydra_cfg = _hydra_settings(args)
    key, folder = output_dir(hydra_cfg, args)
    if reason := cannot_write(folder):
        raise ConfigError(f"cannot write the {key.split('.')[1]} directory {folder}: {reason}; "
                          f"choose another with {key}=...")
    subdir, keep = hydra_cfg.output_subdir, existing_ancestor(folder)
    # beside the other overrides: Hydra's argparse takes them only as one run of words
    overrides = set(overrides_in(args))
    last = max((i for i, a in enumerate(args) if a in overrides), default=len(args) - 1)
    return ([*args[:last + 1], NO_HYDRA_FILES, *args[last + 1:]],
            lambda cfg: _run_job(cfg, subdir, keep, resume), folder)


def run(args: list[str]) -> None:
    from driftfl.help import run_answer  # --help, --version: driftfl's own, before Hydra's

    try:
        answer = run_answer(args, overrides_in, refusal)
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if answer is not None:
        print(answer, end="")
        return
    import hydra

    from driftfl.common.composing import conf_dir

    job, folder = _run_job, None  # Hydra runs no job for a flag that only shows something
    try:
        config_path = str(conf_dir())
        if not SHOWING & set(args):
            args, job, folder = checked_job(args)
        elif not NO_OVERRIDES & set(args):
            args, _ = resumed(args)
            if problem := refusal(args, reachable=False):
                raise ConfigError(problem)
            _hydra_settings(args)
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv = ["driftfl run", *args]
    hydra_main = hydra.main(config_path=config_path, config_name="config",
                            version_base="1.3")(job)
    if not ({"-m", "--multirun"} & set(args)) or SHOWING & set(args):
        hydra_main()
        return
    global _sweep_codes
    from driftfl.host import HostFailed, shared_hosts
    from driftfl.launch import EXIT_CODES

    _sweep_codes = []
    # the sweep's jobs share one SuperLink and Ray; the joblib launcher's jobs run in worker
    # processes, which the host started here is lent to
    lend = folder / "superlink.log" if "hydra/launcher=joblib" in args and not any(
        a.startswith("simulation.ray_address=") for a in args) else None  # a cluster: theirs
    try:
        with shared_hosts(lend):
            hydra_main()
        codes = _sweep_codes
    except HostFailed as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_CODES["failed"]) from None
    finally:
        _sweep_codes = None
    if code := worst(codes):
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    # Flower and flwr-datasets send usage events unless told not to: nothing leaves by surprise
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    try:
        dispatch(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # Ctrl-C before a run started (a run says more itself)
        from driftfl.quiet import say

        say("driftfl: stopped")
        raise SystemExit(130) from None


def dispatch(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    if argv[0] in ("--version", "-V"):
        from driftfl.help import version_text

        print(version_text(), end="")
        return
    command, args = argv[0], argv[1:]
    if command == "run":
        run(args)
    elif command == "report":
        from driftfl.report import main as report

        report(args)
    elif command == "audit":
        from driftfl.audit import main as audit

        audit(args)
    elif command == "evaluate":
        from driftfl.evaluate import main as evaluate

        evaluate(args)
    elif command == "split":
        from driftfl.deploy.split import main as split

        split(args)
    elif command == "secure":
        from driftfl.deploy.command import main as secure

        secure(args)
    else:
        print(f"driftfl: unknown command '{command}'; valid: audit, evaluate, report, run, "
              f"secure, split\n\n{USAGE}", file=sys.stderr, end="")
        raise SystemExit(2)


if __name__ == "__main__":
    main()
