"""Readers for the on-disk formats of the datasets driftfl knows.

Each reader returns uint8 images shaped (N, C, H, W) and int64 labels. torchvision fetches and
verifies downloads; the readers themselves accept any file in the real format, so they can be
tested on small files.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
from pathlib import Path

import numpy as np

from .errors import ConfigError
from .paths import cache_dir
from .untrusted import replaced

IDX_MAGIC = {0x0801: 1, 0x0803: 3}  # unsigned-byte labels (1-D) and images (3-D)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (MNIST family), gzipped or not. A gzipped file is decompressed once and
    kept decoded in driftfl's cache, by its path, size and time: every process of a run reads
    the training set (the CLI, the ServerApp, each client worker), and decompressing
    Fashion-MNIST's took each about 0.4 s of CPU, reading the decoded copy 0.1 s."""
    decoded = _decoded_copy(path) if path.suffix == ".gz" else None
    if decoded is not None and decoded.is_file():
        try:
            return np.load(decoded, allow_pickle=False)
        except (OSError, ValueError):  # a copy cut short: decode the file again
            pass
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[:4], "big")
    if magic not in IDX_MAGIC:
        raise ConfigError(f"{path} is not an unsigned-byte IDX file (magic {magic:#x})")
    ndim = IDX_MAGIC[magic]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ConfigError(f"{path} is truncated: expected {dims}, found {data.size} bytes")
    data = data.reshape(dims).copy()  # writable, so torch can share it without warnings
    if decoded is not None:
        _keep(decoded, data)
    return data


def _decoded_copy(path: Path) -> Path:
    """Where the decoded copy of the gzipped IDX file ``path`` is kept: a name that changes
    when the file is replaced or touched."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return cache_dir() / "idx" / f"{path.name.removesuffix('.gz')}-{key.hexdigest()[:16]}.npy"


def _keep(target: Path, data: np.ndarray) -> None:
    """Write ``data`` to ``target`` whole or not at all (``untrusted.replaced``: processes
    starting together never read half a file); a cache that cannot be written is skipped."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with replaced(target, "wb") as f:
            np.save(f, data, allow_pickle=False)
    except OSError:
        pass


def find_idx(root: Path, stem: str) -> Path | None:
    """Find ``stem`` (e.g. 'train-images-idx3-ubyte'), gzipped or not, flat or in torchvision's
    ``<Name>/raw`` layout."""
    for folder in [root, root / "raw", *sorted(root.glob("*/raw"))]:
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def read_idx_split(root: Path, prefix: str, split: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Images and labels of one split ('train', 't10k', 'test'), or None if a file is missing."""
    images = find_idx(root, f"{prefix}{split}-images-idx3-ubyte")
    labels = find_idx(root, f"{prefix}{split}-labels-idx1-ubyte")
    if images is None or labels is None:
        return None
    x, y = read_idx(images), read_idx(labels)
    if len(x) != len(y):
        raise ConfigError(f"{images} holds {len(x)} images but {labels} holds {len(y)} labels")
    return x[:, None, :, :], y.astype(np.int64)


# What a CIFAR python batch holds: dicts, lists, strings, numbers and NumPy arrays (or scalars).
# Rebuilding those needs only these globals (numpy.core in the files' own numpy 1.x, numpy._core
# in 2.x), none of which runs code; a pickle that names any other could, and is refused.
ARRAY_GLOBALS = {(module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
                 for name in ("_reconstruct", "scalar")} | {("numpy", "ndarray"),
                                                            ("numpy", "dtype")}


class ArraysOnlyUnpickler(pickle.Unpickler):
    """Python's own unpickler, restricted to ARRAY_GLOBALS (the "Restricting Globals" recipe of
    the pickle module's documentation)."""

    def find_class(self, module: str, name: str):
        if (module, name) not in ARRAY_GLOBALS:
            raise pickle.UnpicklingError(f"it asks for {module}.{name}")
        return super().find_class(module, name)


def read_pickled_arrays(path: Path) -> dict:
    """A CIFAR python batch: a pickled dict of lists and arrays, read without running code;
    ConfigError names the file when it is anything else."""
    try:
        with open(path, "rb") as f:
            found = ArraysOnlyUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
        raise ConfigError(f"{path} is not a CIFAR python batch ({err}); a pickle that asks for "
                          "more than arrays is never loaded (it could run code)") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{path} is not a CIFAR python batch (it holds a "
                          f"{type(found).__name__}, not a dict)")
    return found


def read_cifar(folder: Path, files: list[str], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate CIFAR python batches (pickled dicts with 'data' (N, 3072) and labels)."""
    xs, ys = [], []
    for name in files:
        batch = read_pickled_arrays(folder / name)
        xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch[label_key], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def read_cifar_classes(folder: Path, meta_file: str, key: str) -> list[str] | None:
    path = folder / meta_file
    if not path.is_file():
        return None
    return list(read_pickled_arrays(path)[key])


def read_svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN cropped digits: X (32, 32, 3, N), y (N, 1) with digit 0 stored as 10."""
    from scipy.io import loadmat  # only SVHN needs scipy

    mat = loadmat(path)
    x = np.ascontiguousarray(np.transpose(mat["X"], (3, 2, 0, 1)), dtype=np.uint8)
    y = mat["y"].astype(np.int64).reshape(-1) % 10
    return x, y


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def read_image_folder(root: Path, classes: list[str] | None, size: int, channels: int):
    """Images in ``root/<class>/*`` as (N, C, size, size) uint8, labels by position in ``classes``
    (the sorted class folder names when None). Returns (x, y, classes)."""
    from PIL import Image

    if not root.is_dir():
        raise ConfigError(f"image folder {root} does not exist")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    names = [p.name for p in folders]
    if classes is None:
        classes = names
    index = {name: i for i, name in enumerate(classes)}
    index.update({str(i): i for i in range(len(classes))})  # folders may be named 0..C-1
    unknown = [n for n in names if n not in index]
    if unknown:
        raise ConfigError(
            f"class folders {unknown} in {root} are not classes of this dataset; "
            f"name them after the classes: {', '.join(classes)} (or 0..{len(classes) - 1})"
        )
    mode = {1: "L", 3: "RGB"}[channels]
    xs, ys = [], []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                with Image.open(path) as img:
                    img = img.convert(mode).resize((size, size))
                    xs.append(np.asarray(img, dtype=np.uint8).reshape(size, size, channels))
                ys.append(index[folder.name])
    if not xs:
        raise ConfigError(
            f"no images found in {root}: expected {root}/<class>/<image>.png "
            f"(suffixes {', '.join(sorted(IMAGE_SUFFIXES))})"
        )
    x = np.stack(xs).transpose(0, 3, 1, 2).copy()
    return x, np.asarray(ys, dtype=np.int64), classes


def as_nchw_uint8(x: np.ndarray, source: str) -> np.ndarray:
    """Accept (N,H,W), (N,H,W,C) or (N,C,H,W) uint8 images; return (N,C,H,W)."""
    if x.dtype != np.uint8:
        raise ConfigError(
            f"{source}: images must be uint8 (0-255), got {x.dtype}; "
            "convert with (x * 255).round().astype('uint8') if they are floats in [0, 1]"
        )
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if x.ndim == 4 and x.shape[1] in (1, 3):
        return x
    raise ConfigError(f"{source}: cannot read image array of shape {x.shape} as (N, C, H, W)")


def class_indices(y: np.ndarray, path: Path, key: str) -> np.ndarray:
    """The labels ``key`` of an .npz as int64 class indices; float labels are taken only where
    every one is a whole number (3.0, not 3.5)."""
    y = np.asarray(y)
    fix = (f"labels must be class indices (whole numbers 0..C-1), one per sample; "
           f"save each sample's class index in {key}")
    if y.ndim != 1 and y.size != len(y):
        raise ConfigError(f"{path}: {key} has shape {y.shape}; {fix} "
                          "(one-hot labels: y.argmax(axis=1))")
    y = y.reshape(-1)
    if y.dtype.kind not in "biuf":
        raise ConfigError(f"{path}: {key} holds non-numeric labels ({y.dtype.name}); {fix}")
    y = y.astype(np.int64) if y.dtype.kind == "b" else y
    wrong = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)) | (y < 0))
    if len(wrong):
        raise ConfigError(f"{path}: {key}[{wrong[0]}] is {y[wrong[0]].item()!r}; {fix}")
    return y.astype(np.int64)


def read_npz(path: Path):
    """Arrays from an .npz: (x_train, y_train, x_test, y_test) or (x, y, None, None)."""
    if not path.is_file():
        raise ConfigError(f"npz file {path} does not exist")
    with np.load(path, allow_pickle=False) as npz:
        keys = set(npz.files)
        if {"x_train", "y_train", "x_test", "y_test"} <= keys:
            names = ("x_train", "y_train", "x_test", "y_test")
        elif {"x", "y"} <= keys:
            names = ("x", "y")
        else:
            raise ConfigError(
                f"{path} holds arrays {sorted(keys)}; expected x and y "
                "(or x_train, y_train, x_test, y_test)"
            )
        arrays = [npz[k] for k in names]
    result = []
    for x_key, y_key, x, y in zip(names[0::2], names[1::2], arrays[0::2], arrays[1::2]):
        if len(x) != len(y):
            raise ConfigError(f"{path}: {len(x)} images in {x_key} but {len(y)} labels in {y_key}")
        result += [as_nchw_uint8(x, str(path)), class_indices(y, path, y_key)]
    return tuple(result + [None, None])[:4]
