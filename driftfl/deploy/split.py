"""Each data owner's share of a dataset, as its own file: `driftfl split DIR [overrides]`.

A demo or a rehearsal of a real federation needs data owners that hold only their own data.
This writes client k's share of the experiment's partition (the same split `driftfl run` with
these overrides trains on) to ``DIR/client-<k>.npz`` (``x``: uint8 images N x C x H x W, ``y``:
class indices), which a SuperNode then reads with ``--node-config "data-dir='...'"``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from driftfl.common.errors import ConfigError
from driftfl.deploy.checks import writable_folder

USAGE = "usage: driftfl split DIR [overrides], e.g. driftfl split owners num_clients=3 partition.alpha=0.1"


def client_file(k: int) -> str:
    return f"client-{k}.npz"


def split(folder: Path, overrides: list[str]) -> list[Path]:
    """Write every client's share to ``folder``; the files written. ConfigError, before
    anything is written, for a bad experiment or a folder that cannot be written or already
    holds shares."""
    from driftfl.common.config import compose
    from driftfl.common.partition import describe, label_histogram, partition
    from driftfl.server.console import partition_table
    from driftfl.server.experiment import prepare_experiment

    writable_folder(folder, "the shares' folder")  # before the dataset loads
    experiment = prepare_experiment(compose(overrides))
    cfg, data = experiment.cfg, experiment.data
    files = [folder / client_file(k) for k in range(cfg.num_clients)]
    taken = [f.name for f in files if f.exists()]
    if taken:
        raise ConfigError(f"{folder} already holds {', '.join(taken[:3])}; choose an empty "
                          "folder (shares are never overwritten)")
    folder.mkdir(parents=True, exist_ok=True)
    parts = partition(data.train_y, cfg.partition, cfg.num_clients, cfg.seed,
                      experiment.aux_indices)
    clients = []
    for k, (path, indices) in enumerate(zip(files, parts)):
        np.savez(path, x=data.train_x[indices], y=data.train_y[indices])
        clients.append({"partition_id": k, "num_examples": len(indices),
                        "label_histogram": label_histogram(data.train_y[indices],
                                                           data.num_classes)})
    print(partition_table(clients, list(data.classes),
                          f"{cfg.dataset.name}, {describe(cfg.partition)}, seed {cfg.seed}"))
    return files


HELP = f"""{USAGE}

Writes client k's share of the experiment's partition (the split `driftfl run` with the same
overrides trains on) to DIR/client-<k>.npz: x, uint8 images N x C x H x W; y, class indices.
A SuperNode reads its file with --node-config "data-dir='DIR/client-<k>.npz'". DIR must be
empty of shares: none is overwritten. The overrides are `driftfl run`'s (driftfl run --help).
"""


def main(args: list[str]) -> None:
    if args[:1] in (["-h"], ["--help"]):
        print(HELP, end="")
        return
    if not args or args[0].startswith("-") or "=" in args[0]:
        print(f"driftfl: error: name the folder to write first\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    try:
        files = split(Path(args[0]), args[1:])
    except ConfigError as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote {len(files)} files to {args[0]}: {files[0].name} .. {files[-1].name}; give "
          "owner k its file and start its SuperNode with --node-config \"data-dir='<file>'\"")
