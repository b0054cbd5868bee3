"""The dataset registry: every dataset loads by name into one in-memory form, ImageData.

Images stay uint8 (N, C, H, W) until a client turns its own partition into float tensors, so a
process holding the full Fashion-MNIST costs 47 MB, not 190.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from . import loaders
from .dataset_settings import (  # noqa: F401  (declared there, torch-free; imported from here)
    DATASET_SETTINGS, DatasetSettings, EmnistSettings, FolderSettings, OwnDataSettings,
    dataset_settings)
from .errors import ConfigError
from .paths import data_dir

FMNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


@dataclass(frozen=True)
class ImageData:
    train_x: np.ndarray  # uint8 (N, C, H, W)
    train_y: np.ndarray  # int64 (N,)
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...]
    mean: tuple[float, ...]  # per channel, of the training images scaled to [0, 1]
    std: tuple[float, ...]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and std of uint8 images, from a 256-bin histogram (no float copy;
    torch counts the bytes as they are, where NumPy first widens them to 8 bytes each)."""
    levels = np.arange(256) / 255.0
    means, stds = [], []
    for c in range(x.shape[1]):
        channel = torch.from_numpy(np.ascontiguousarray(x[:, c])).ravel()
        counts = torch.bincount(channel, minlength=256).numpy()
        mean = float(counts @ levels / counts.sum())
        stds.append(float(np.sqrt(counts @ (levels - mean) ** 2 / counts.sum())) or 1.0)
        means.append(mean)
    return tuple(means), tuple(stds)


def to_tensors(x: np.ndarray, y: np.ndarray, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images -> normalised float32 tensor; labels -> int64 tensor."""
    images = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (images - m) / s, torch.from_numpy(np.asarray(y, dtype=np.int64))


def _root(spec: DatasetSettings, default: Path) -> Path:
    return Path(os.path.expanduser(spec.root)) if spec.root else default


def _missing(name: str, where: list[Path], how: str) -> ConfigError:
    places = ", ".join(str(p) for p in where)
    return ConfigError(f"{name} not found in {places}. {how}")


def _download_hint(name: str) -> str:
    return (f"Set dataset.download=true to fetch {name} with torchvision (needs internet), "
            "or point dataset.root at a copy in torchvision's format.")


def _idx_dataset(spec, *, title, prefix, roots, fetch, how, classes, test_split="t10k",
                 transpose=False, label_offset=0):
    """MNIST-family datasets stored as IDX files."""
    def read(root):
        train, test = (loaders.read_idx_split(root, prefix, s) for s in ("train", test_split))
        return (train, test) if train and test else None

    found = next((r for r in map(read, roots) if r is not None), None)
    if found is None and spec.download:
        fetch(roots[-1])
        found = read(roots[-1])
    if found is None:
        raise _missing(title, roots, how)
    (xtr, ytr), (xte, yte) = found
    if transpose:  # EMNIST stores images transposed
        xtr, xte = xtr.transpose(0, 1, 3, 2), xte.transpose(0, 1, 3, 2)
    return xtr, ytr - label_offset, xte, yte - label_offset, classes


def _fetch_with(dataset: str) -> Callable[[Path], object]:
    """A torchvision download, imported only when a download runs: the import costs a
    deployment node about 2 s per message (each message is a fresh process)."""
    def fetch(root: Path):
        import torchvision.datasets

        return getattr(torchvision.datasets, dataset)(root, download=True)
    return fetch


def load_fmnist(spec):
    roots = [_root(spec, FMNIST_SYSTEM_DIR)] if spec.root else [
        FMNIST_SYSTEM_DIR, data_dir() / "fashion-mnist"]
    how = ("Install it with: sudo apt-get install -y dataset-fashion-mnist "
           "(or set dataset.download=true to fetch it with torchvision; needs internet).")
    return _idx_dataset(spec, title="Fashion-MNIST", prefix="", roots=roots, how=how,
                        fetch=_fetch_with("FashionMNIST"), classes=FMNIST_CLASSES)


def load_mnist(spec):
    return _idx_dataset(spec, title="MNIST", prefix="", roots=[_root(spec, data_dir() / "mnist")],
                        how=_download_hint("MNIST"), fetch=_fetch_with("MNIST"),
                        classes=[str(d) for d in range(10)])


def load_emnist(spec):
    from torchvision.datasets import EMNIST

    split = spec.split
    classes = EMNIST.classes_split_dict[split]
    offset = 1 if split == "letters" else 0  # letters are labelled 1..26 ('N/A' is class 0)
    return _idx_dataset(spec, title=f"EMNIST ({split})", prefix=f"emnist-{split}-",
                        roots=[_root(spec, data_dir() / "emnist")], how=_download_hint("EMNIST"),
                        fetch=lambda r: EMNIST(r, split=split, download=True),
                        classes=classes[offset:], test_split="test", transpose=True,
                        label_offset=offset)


def _cifar(spec, *, title, folder, train, test, label_key, meta, tv_name):
    import torchvision.datasets as tvd

    root = _root(spec, data_dir())
    path = root / folder
    files_present = all((path / f).is_file() for f in [*train, test])
    if not files_present and spec.download:
        getattr(tvd, tv_name)(str(root), download=True)
    elif not files_present:
        raise _missing(title, [path], _download_hint(title))
    xtr, ytr = loaders.read_cifar(path, train, label_key)
    xte, yte = loaders.read_cifar(path, [test], label_key)
    classes = loaders.read_cifar_classes(path, *meta)
    return xtr, ytr, xte, yte, classes or [str(i) for i in range(int(ytr.max()) + 1)]


def load_cifar10(spec):
    return _cifar(spec, title="CIFAR-10", folder="cifar-10-batches-py",
                  train=[f"data_batch_{i}" for i in range(1, 6)], test="test_batch",
                  label_key="labels", meta=("batches.meta", "label_names"), tv_name="CIFAR10")


def load_cifar100(spec):
    return _cifar(spec, title="CIFAR-100", folder="cifar-100-python", train=["train"],
                  test="test", label_key="fine_labels", meta=("meta", "fine_label_names"),
                  tv_name="CIFAR100")


def load_svhn(spec):
    from torchvision.datasets import SVHN

    root = _root(spec, data_dir() / "svhn")
    files = {s: root / f"{s}_32x32.mat" for s in ("train", "test")}
    for split, path in files.items():
        if not path.is_file():
            if not spec.download:
                raise _missing("SVHN", [path], _download_hint("SVHN"))
            SVHN(str(root), split=split, download=True)
    (xtr, ytr), (xte, yte) = (loaders.read_svhn(files[s]) for s in ("train", "test"))
    return xtr, ytr, xte, yte, [str(d) for d in range(10)]


def _hold_out(x, y, fraction: float):
    """Split off a fixed (seed 0) test share, the same for every experiment seed."""
    order = np.random.default_rng(0).permutation(len(y))
    n_test = max(1, int(round(len(y) * fraction)))
    return x[order[n_test:]], y[order[n_test:]], x[order[:n_test]], y[order[:n_test]]


def load_folder(spec):
    root = _root(spec, Path("."))
    size, channels = spec.image_size, spec.channels
    train_dir = root / "train" if (root / "train").is_dir() else root
    xtr, ytr, classes = loaders.read_image_folder(train_dir, None, size, channels)
    if (root / "test").is_dir():
        xte, yte, _ = loaders.read_image_folder(root / "test", classes, size, channels)
    else:
        xtr, ytr, xte, yte = _hold_out(xtr, ytr, spec.test_fraction)
    return xtr, ytr, xte, yte, classes


def load_npz(spec):
    xtr, ytr, xte, yte = loaders.read_npz(_root(spec, Path("data.npz")))
    if xte is None:
        xtr, ytr, xte, yte = _hold_out(xtr, ytr, spec.test_fraction)
    return xtr, ytr, xte, yte, [str(c) for c in range(int(max(ytr.max(), yte.max())) + 1)]


# name -> its loader; DATASETS: name -> (its settings, its loader)
LOADERS: dict[str, Callable] = {
    "fmnist": load_fmnist, "mnist": load_mnist, "emnist": load_emnist, "cifar10": load_cifar10,
    "cifar100": load_cifar100, "svhn": load_svhn, "folder": load_folder, "npz": load_npz,
}
DATASETS: dict[str, tuple[type[DatasetSettings], Callable]] = {
    name: (settings, LOADERS[name]) for name, settings in DATASET_SETTINGS.items()}


def load_dataset(spec: Mapping | DatasetSettings) -> ImageData:
    """Load the dataset a ``dataset`` section names (cached per process)."""
    return _load_cached(dataset_settings(spec))


@lru_cache(maxsize=2)
def _load_cached(spec: DatasetSettings) -> ImageData:
    xtr, ytr, xte, yte, classes = DATASETS[spec.name][1](spec)
    mean, std = channel_stats(xtr)
    if spec.subset:
        xtr, ytr = xtr[: spec.subset], ytr[: spec.subset]
    if spec.test_subset:
        xte, yte = xte[: spec.test_subset], yte[: spec.test_subset]
    bad = [int(v) for v in np.unique(np.concatenate([ytr, yte])) if not 0 <= v < len(classes)]
    if bad:
        raise ConfigError(f"dataset '{spec.name}' has labels {bad[:5]} "
                          f"outside 0..{len(classes) - 1}")
    return ImageData(xtr, ytr, xte, yte, tuple(classes), mean, std)
