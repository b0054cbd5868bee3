"""`driftfl evaluate RUN_DIR|MODEL.pt [overrides] [--out FILE.json]`: a saved global model
measured on an experiment's data: test accuracy overall and per class, and each client's
accuracy on its own held-out share (``client_test_fraction``).

The experiment of a run directory is the one it ran (its config.yaml), with the overrides given
on top; a bare model file takes conf/'s defaults and the overrides, like `driftfl run`. The data
and the partition are built by the project's own code (prepare_experiment) and the test set is
measured as the server measures it each round (driftfl.common.evaluation), so a run directory
evaluated without overrides gives its last metrics.csv row again. A client's share is the split
its node holds out (driftfl.common.client_split), measured with the global model, as a client
does before local training.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import stat
import sys
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.common.untrusted import UnsafeFile, mib, read_bytes

USAGE = "usage: driftfl evaluate RUN_DIR|MODEL.pt [overrides] [--out FILE.json]"
MODEL_FILE = "model.pt"
MATCH_HINT = ("give the model= and dataset= it was trained with (a run directory: "
              "driftfl evaluate RUN_DIR)")
# where the evaluation runs unless device= says otherwise: any machine can read a run's data
ON_ANY_MACHINE = {"device": "cpu", "superlink": None, "owners": None}


def overrides_named(given: list[str]) -> list[tuple[str, bool]]:
    """(the key or config group, whether it is deleted) of each override; ConfigError for one
    that is a sweep, or Hydra's own: an evaluation takes one experiment."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from driftfl.common.composing import one_line

    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except Exception as err:
        raise ConfigError(f"{one_line(err)} (https://hydra.cc/docs/advanced/override_grammar/"
                          "basic)") from None
    named = []
    for override in parsed:
        key = override.key_or_group
        if key.startswith("hydra"):
            raise ConfigError(f"{override.input_line}: driftfl evaluate takes the experiment's "
                              "settings only, not Hydra's; use --out FILE.json for where it writes")
        if override.is_sweep_override():
            raise ConfigError(f"{override.input_line} is a sweep; driftfl evaluate takes one "
                              "value per setting (run it once per value)")
        named.append((key, override.is_delete()))
    return named


def run_settings(saved: dict, earlier: list[str], given: list[str]) -> dict:
    """The run's settings (``saved``, its config.yaml) with what ``given`` names replaced: each
    setting (``partition.alpha``) or section (``dataset=mnist``) as Hydra composes it over the
    overrides the run was started with (``earlier``), so that ``partition.alpha`` is the alpha of
    the run's own partition; a deleted key (``~dataset.subset``) falls back to its default."""
    from driftfl.common.composing import composed
    from driftfl.resume import with_overrides

    settings = copy.deepcopy(saved)
    named = overrides_named(given)
    if not named:
        return settings
    new = composed(with_overrides(earlier, given))
    for key, deleted in named:
        *parents, leaf = key.split(".")
        into, source = settings, new
        for part in parents:
            into = into.setdefault(part, {}) if isinstance(into, dict) else {}
            source = source.get(part, {}) if isinstance(source, dict) else {}
        if deleted or not isinstance(source, dict) or leaf not in source:
            if isinstance(into, dict):
                into.pop(leaf, None)
        else:
            into[leaf] = copy.deepcopy(source[leaf])
    return settings


def experiment_of(source: Path, given: list[str]):
    """(the prepared Experiment, the model file, the run's own settings or None for a bare model
    file) for ``source``, a run directory or a model file, with the overrides ``given``;
    ConfigError says what is wrong."""
    from driftfl.audit import read_config
    from driftfl.common.composing import composed
    from driftfl.resume import ran_with
    from driftfl.server.experiment import prepare_experiment

    chosen = {key for key, _ in overrides_named(given)}
    if source.is_dir():
        saved, model_file = read_config(source), source / MODEL_FILE
        if not isinstance(saved, dict):
            raise ConfigError(f"{source / 'config.yaml'} holds no settings; name a directory "
                              "`driftfl run` wrote")
        settings = run_settings(saved, ran_with(source), given)
        if not (model_file.is_file() or model_file.is_symlink()):  # a link: read_bytes says
            raise ConfigError(f"{source} has no {MODEL_FILE}: a run writes it when its last "
                              "round ends (a stopped run: go on with driftfl run resume=DIR)")
    else:
        saved, model_file = None, existing(source)
        settings = composed(given)
    settings.update({k: v for k, v in ON_ANY_MACHINE.items() if k not in chosen})
    settings["simulation"] = {**settings.get("simulation", {}), "client_gpus": 0.0}
    return prepare_experiment(settings, make_partition=True), model_file, saved


def existing(source: Path) -> Path:
    """``source``, where it is there to be read; ConfigError says what to name instead."""
    if not (source.is_dir() or source.is_file() or source.is_symlink()):
        raise ConfigError(f"{source}: no such run directory or model file; name a directory "
                          f"`driftfl run` wrote, or its {MODEL_FILE}")
    return source


def load_model(path: Path, experiment):
    """The experiment's model with the weights of ``path`` (a state_dict saved by torch.save),
    read as the checkpoint is: no link, at most the bytes such a model takes, tensors only
    (``weights_only``); ConfigError where the file is not such a model."""
    import torch

    cfg, data = experiment.cfg, experiment.data
    model = experiment.initial_model()
    expected = model.state_dict()
    what = (f"model={cfg.model.name} for {cfg.dataset.name} ({'x'.join(map(str, data.shape))} "
            f"images, {data.num_classes} classes)")
    # the tensors' bytes, and room for the archive's names and headers
    limit = sum(t.numel() * t.element_size() for t in expected.values()) + 2**20
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise ConfigError(f"{path} holds {mib(info.st_size)}, more than a {what} takes "
                              f"({mib(limit)} at most); {MATCH_HINT}")
        raw = read_bytes(path, limit)
    except UnsafeFile as err:
        raise ConfigError(str(err)) from None
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception:  # the unpickler refuses anything but tensors and containers
        raise ConfigError(f"{path} is not a model driftfl saved (a state_dict of tensors "
                          "written by torch.save)") from None
    if problem := unlike(state, expected):
        raise ConfigError(f"{path} is not a {what}: {problem}; {MATCH_HINT}")
    model.load_state_dict(state)
    return model.to(cfg.device)


def unlike(state, expected: dict) -> str | None:
    """How ``state`` differs from the model's own state_dict ``expected``; None: it fits."""
    import torch

    if not (isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())):
        return "it holds no state_dict of tensors"
    if missing := [k for k in expected if k not in state]:
        return f"it lacks {missing[0]}" + (f" and {len(missing) - 1} more" if missing[1:] else "")
    if extra := [k for k in state if k not in expected]:
        return f"it has {extra[0]}, which the model has not"
    for key, mine in expected.items():
        theirs = state[key]
        if theirs.shape != mine.shape or theirs.dtype != mine.dtype:
            return (f"its {key} is {list(theirs.shape)} {theirs.dtype}, the model's "
                    f"{list(mine.shape)} {mine.dtype}")
        if theirs.is_floating_point() and not torch.isfinite(theirs).all():
            return f"its {key} holds NaN or infinity"
    return None


def measure(experiment, model) -> dict:
    """The test set overall and per class, and each client's held-out share (none when
    ``client_test_fraction`` is 0), each measured as the server and the clients do."""
    import numpy as np

    from driftfl.common.client_split import held_out_split, spread
    from driftfl.common.datasets import to_tensors
    from driftfl.common.evaluation import evaluate

    cfg, data = experiment.cfg, experiment.data

    def on(images, labels) -> tuple[float, float, list[float]]:
        x, y = to_tensors(images, labels, data.mean, data.std)
        return evaluate(model, x.to(cfg.device), y.to(cfg.device), cfg.eval_batch_size,
                        data.num_classes)

    loss, accuracy, per_class = on(data.test_x, data.test_y)
    class_sizes = np.bincount(data.test_y, minlength=data.num_classes).tolist()
    clients = []
    if cfg.client_test_fraction > 0:
        for i, part in enumerate(experiment.partitions()):
            _, test = held_out_split(data.train_y[part], cfg.client_test_fraction, cfg.seed, i)
            held = part[test]
            client_loss, client_accuracy, _ = on(data.train_x[held], data.train_y[held])
            clients.append({"client": i, "examples": len(held), "accuracy": client_accuracy,
                            "loss": client_loss})
    return {"test": {"examples": len(data.test_y), "accuracy": accuracy, "loss": loss,
                     "classes": [{"class": name, "examples": n, "accuracy": a}
                                 for name, n, a in zip(data.classes, class_sizes, per_class)]},
            "clients": clients,
            "clients_spread": spread([c["accuracy"] for c in clients])}


def main(args: list[str]) -> None:
    from driftfl.common.untrusted import write_text
    from driftfl.evaluate_output import check_writable, default_out, document, notes, table

    parser = argparse.ArgumentParser(prog="driftfl evaluate", usage=USAGE.removeprefix(
        "usage: "), description=(
        "A saved model measured on an experiment's data: test accuracy overall and per class, "
        "and each client's accuracy on its own held-out share (client_test_fraction). A run "
        "directory is evaluated on its own experiment, with the overrides on top."))
    parser.add_argument("source", type=Path, help="a run directory `driftfl run` wrote, or a "
                        "model.pt (then the experiment is conf/'s defaults and the overrides)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset=mnist "
                        "partition.alpha=0.1 num_clients=10 seed=3 client_test_fraction=0.2")
    parser.add_argument("--out", type=Path, default=None, help="the JSON to write (default: "
                        "evaluation.json beside the model, evaluation-<overrides>.json with "
                        "overrides)")

    def refuse(message: str):
        if message.startswith("the following arguments are required"):  # it names overrides too
            message = "name the run directory or the model.pt to evaluate"
        raise ConfigError(f"{message} ({USAGE})")

    parser.error = refuse
    try:
        options = parser.parse_intermixed_args(args)
        source = existing(options.source.expanduser())
        out = (options.out.expanduser() if options.out
               else default_out(source if source.is_dir() else source.parent, options.overrides))
        check_writable(out)
        experiment, model_file, saved = experiment_of(source, options.overrides)
        model = load_model(model_file, experiment)
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    result = measure(experiment, model)
    said = notes(experiment.cfg, saved)
    print(table(experiment, model_file, result, said))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, document(experiment, model_file, options.overrides, result, said))
    print(f"wrote {out}")
