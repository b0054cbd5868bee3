"""`driftfl audit RUN_DIR [--data DIR] [--threshold T]`: how close the images a run's clients
shipped (DCFL's condensed sets, ``images/client_<id>.npz``) are to each client's own real
training data (the measure: driftfl.common.leakage).

A simulated run's client data is rebuilt as the simulation split it (the run's config.yaml:
dataset, partition, seed, the server's aux set left out). A deployed run's data stayed on its
nodes: ``--data DIR`` names the files `driftfl split` wrote (``client-<k>.npz``), or a copy
of each node's own .npz named so. Writes ``audit.json`` and ``images/pairs_client_<id>.png``
into the run directory and prints a line per client. `driftfl run` runs it after every
simulated run that shipped images and adds the result to summary.json (``condensed_leakage``).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np

from driftfl.common.errors import ConfigError
from driftfl.common.leakage import THRESHOLD, channels_last, nearest_real, plot_pairs, summarise
from driftfl.common.untrusted import (UnsafeFile, npz_arrays, read_bytes, read_text, refuse_links,
                                      replaced_path, write_text)

# what one client's shipped set may declare: a condensed set is a few images per class, so this
# bounds the audit's memory (the set as float32, times a chunk of 4,096 real images) well
# before a file made by someone else could exhaust it
MAX_SHIPPED_IMAGES = 10_000
MAX_SHIPPED_BYTES = 64 * 2**20
# what a client's own data file (--data) may declare: a partition of any dataset driftfl knows,
# even as float32, is well below it; it bounds the audit's memory before a file made by someone
# else (a few KB of zeros inflating to gigabytes) could exhaust it
MAX_CLIENT_DATA_BYTES = 2 * 2**30
USAGE = "driftfl audit RUN_DIR [--data DIR] [--threshold T]"
SPLIT_HINT = "pass --data DIR with the client-<k>.npz files `driftfl split` wrote"


def shipped_sets(run_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every client's shipped set in the run directory, by client name (``client_<name>``);
    each file's arrays are checked by the shapes they declare before any is loaded."""
    found = {}
    for path in sorted((run_dir / "images").glob("client_*.npz")):
        try:
            data = read_bytes(path, MAX_SHIPPED_BYTES)
            declared = npz_arrays(io.BytesIO(data), MAX_SHIPPED_BYTES)
            if problem := unlike_a_set(declared):
                raise UnsafeFile(problem)
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                found[path.stem.removeprefix("client_")] = (arrays["x"], arrays["y"])
        except UnsafeFile as err:
            raise ConfigError(f"{path} {str(err).removeprefix(f'{path} ')}; driftfl audit "
                              "reads only the sets a run wrote") from None
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"cannot read {path}: {err}") from None
    return dict(sorted(found.items(), key=lambda item: _order(item[0])))


def unlike_a_set(declared: dict) -> str | None:
    """Why arrays of these declared shapes are no shipped set (None: they are one): images x
    (N, H, W) or (N, H, W, C) of at most MAX_SHIPPED_IMAGES, labels y (N,)."""
    if set(declared) != {"x", "y"}:
        return "does not hold exactly the arrays x and y"
    (x_shape, _), (y_shape, _) = declared["x"], declared["y"]
    if len(x_shape) not in (3, 4) or y_shape != x_shape[:1]:
        return (f"declares images of shape {list(x_shape)} and labels of shape "
                f"{list(y_shape)}; a shipped set is (N, H, W[, C]) images and N labels")
    if x_shape[0] > MAX_SHIPPED_IMAGES:
        return (f"declares {x_shape[0]} images, more than the {MAX_SHIPPED_IMAGES} a client's "
                "shipped set may hold")
    return None


def shipped_anything(run_dir: Path) -> bool:
    return any((run_dir / "images").glob("client_*.npz"))


def _order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def read_config(run_dir: Path) -> dict:
    import yaml

    config = run_dir / "config.yaml"
    if not run_dir.is_dir() or not (config.is_file() or config.is_symlink()):
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml); name a "
                          "directory `driftfl run` wrote")
    try:
        return yaml.safe_load(read_text(config))
    except UnsafeFile as err:
        raise ConfigError(str(err)) from None
    except yaml.YAMLError as err:  # where, never what: the file's lines are not echoed
        mark = getattr(err, "problem_mark", None)
        raise ConfigError(f"cannot read {config}: not YAML"
                          + (f" (line {mark.line + 1})" if mark else "")) from None


class PartitionData:
    """Each client's real training images as the simulation split them."""

    def __init__(self, experiment, expected: dict[str, int]):
        from driftfl.common.client_split import held_out_split

        cfg, data = experiment.cfg, experiment.data
        self.data, self.expected = data, expected
        # what each client trained on: its partition less its held-out split, if any
        self.parts = [p[held_out_split(data.train_y[p], cfg.client_test_fraction, cfg.seed,
                                       i)[0]] for i, p in enumerate(experiment.partitions())]

    def check(self, names: list[str]) -> None:
        """ConfigError for a client whose data cannot be rebuilt here, before any is measured."""
        for name in names:
            if not name.isdigit() or int(name) >= len(self.parts):
                raise ConfigError(f"client {name} is not one of the experiment's partitions "
                                  f"(a node with its own data); {SPLIT_HINT}, or that node's "
                                  f"own .npz as client-{name}.npz")
            known, rebuilt = self.expected.get(name), len(self.parts[int(name)])
            if known is not None and known != rebuilt:
                raise ConfigError(f"client {name}'s partition rebuilt here holds {rebuilt} "
                                  f"images, but the run's partition.json says {known}: not the "
                                  f"data it trained on; {SPLIT_HINT}")

    def __call__(self, name: str) -> np.ndarray:
        return channels_last(self.data.train_x[self.parts[int(name)]])


class FolderData:
    """Each client's real training images from ``client-<name>.npz`` files in a folder."""

    def __init__(self, folder: Path):
        if not folder.is_dir():
            raise ConfigError(f"--data {folder}: no such folder; {SPLIT_HINT}")
        self.folder = folder

    def check(self, names: list[str]) -> None:
        """ConfigError for a client's file that is missing or is no archive of arrays within
        MAX_CLIENT_DATA_BYTES, by what its members declare (nothing is inflated yet)."""
        for name in names:
            path = self.folder / f"client-{name}.npz"
            if not path.is_file():
                raise ConfigError(f"{path} is missing: --data names the folder `driftfl split` "
                                  f"wrote, with client-<k>.npz for each client")
            try:
                npz_arrays(path, MAX_CLIENT_DATA_BYTES)
            except UnsafeFile as err:
                raise ConfigError(f"{path} {err}; {SPLIT_HINT}") from None

    def __call__(self, name: str) -> np.ndarray:
        from driftfl.common.loaders import read_npz

        path = self.folder / f"client-{name}.npz"
        try:  # (check passed: no member inflates past what it declares)
            return channels_last(read_npz(path)[0])
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(f"cannot read {path}: {type(err).__name__}: {err}") from None


def client_counts(run_dir: Path) -> dict[str, int]:
    """Examples per client name as the run's partition.json recorded them (empty if absent)."""
    try:
        clients = json.loads(read_text(run_dir / "partition.json"))["clients"]
        return {str(c["partition_id"]): int(c["num_examples"]) for c in clients
                if c.get("partition_id", -1) >= 0}
    except UnsafeFile as err:
        raise ConfigError(str(err)) from None
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def real_data(run_dir: Path, config: dict, data_dir: Path | None, experiment=None):
    """A function from a client's name to its real images in pixel layout."""
    if data_dir is not None:
        return FolderData(data_dir)
    if experiment is None:
        if config.get("superlink"):
            raise ConfigError(f"{run_dir} is a deployed run: its clients' data stayed on their "
                              f"nodes; {SPLIT_HINT}")
        from driftfl.server.experiment import prepare_experiment

        try:  # on any machine: the run's device is not needed to read its data
            experiment = prepare_experiment({**config, "device": "cpu",
                                             "simulation": {**config.get("simulation", {}),
                                                            "client_gpus": 0.0}})
        except ConfigError as err:
            raise ConfigError(f"cannot rebuild the clients' data of {run_dir}: {err}; or "
                              f"{SPLIT_HINT}") from None
    return PartitionData(experiment, client_counts(run_dir))


def audit(run_dir: Path, data_dir: Path | None = None, threshold: float = THRESHOLD,
          experiment=None, out=print) -> dict | None:
    """Measure every shipped set of the run against its client's real data; write audit.json
    and the pairs' PNGs; print a line per client with ``out``. The report (per client and
    overall, as in audit.json); None for a run that shipped no images. ``experiment``: the
    run's, already loaded (`driftfl run` has it)."""
    config = read_config(run_dir)
    shipped = shipped_sets(run_dir)
    if not shipped:
        return None
    try:  # before anything is measured or written
        refuse_links(run_dir / "images", run_dir / "audit.json",
                     *(run_dir / "images" / f"pairs_client_{name}.png" for name in shipped))
    except UnsafeFile as err:
        raise ConfigError(str(err)) from None
    real_of = real_data(run_dir, config, data_dir, experiment)
    real_of.check(list(shipped))
    out(f"condensed images each client shipped, against its own real images (Pearson "
        f"correlation; a copy at >= {threshold:g}):")
    clients, pooled = {}, []
    for name, (x, y) in shipped.items():
        real = real_of(name)
        if len(x) == 0:
            leakage = summarise(np.zeros(0), threshold)
        else:
            try:
                index, correlation = nearest_real(x, real)
            except ValueError as err:
                raise ConfigError(f"client {name}: {err}") from None
            leakage = summarise(correlation, threshold)
            pooled.append(correlation)
            with replaced_path(run_dir / "images" / f"pairs_client_{name}.png") as png:
                plot_pairs(x, y, real, index, correlation, png,
                           f"client {name}: {leakage.copies} of {leakage.images} shipped "
                           f"images are near-copies", threshold)
        clients[name] = leakage.as_dict()
        out(f"  client {name}: {leakage.line()}")
    overall = summarise(np.concatenate(pooled) if pooled else np.zeros(0), threshold)
    out(f"  all clients: {overall.line().replace(' of this client', '')}")
    report = {"clients": clients, "overall": overall.as_dict()}
    write_text(run_dir / "audit.json", json.dumps(report, indent=2) + "\n")
    return report


def audit_after_run(run_dir: Path, experiment) -> None:
    """`driftfl run`'s audit of a finished simulated run that shipped images: the lines, and
    ``condensed_leakage`` in summary.json. Any failure is a warning: the run itself is done,
    and its status and exit code stay what the run made them."""
    if not shipped_anything(run_dir):
        return
    try:
        report = audit(run_dir, experiment=experiment)
        if report is None:
            return
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary["condensed_leakage"] = report
        write_text(summary_path, json.dumps(summary, indent=2) + "\n")
    except Exception as err:
        reason = err if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
        print(f"driftfl: warning: the audit of the shipped images failed: {reason} "
              f"(driftfl audit {run_dir})", file=sys.stderr)


def main(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="driftfl audit", usage=USAGE, description=(
        "How close the images a run's clients shipped (DCFL's condensed sets) are to their own "
        "real data: per client the share of near-copies and the median nearest correlation; "
        "writes audit.json and images/pairs_client_<id>.png into the run directory."))
    parser.add_argument("run_dir", type=Path, help="a run directory `driftfl run` wrote")
    parser.add_argument("--data", type=Path, default=None,
                        help="a deployed run: the folder of client-<k>.npz `driftfl split` wrote")
    parser.add_argument("--threshold", type=float, default=THRESHOLD,
                        help=f"Pearson correlation that counts as a copy (default {THRESHOLD})")

    def refuse(message: str):
        raise ConfigError(f"{message} (usage: {USAGE})")

    parser.error = refuse
    try:
        options = parser.parse_args(args)
        if not -1 <= options.threshold <= 1:
            raise ConfigError(f"--threshold must be a correlation in [-1, 1], got "
                              f"{options.threshold}")
        run_dir = options.run_dir.expanduser()
        if audit(run_dir, options.data, options.threshold) is None:
            raise ConfigError(f"{run_dir} holds no shipped images (images/client_<id>.npz): "
                              "only DCFL runs ship images, and runs before `driftfl audit` "
                              "kept them only as PNGs")
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote {run_dir / 'audit.json'} and images/pairs_client_<id>.png")
