"""Each reader on small files written in the real on-disk format of its dataset."""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from driftfl.common import loaders
from driftfl.common.datasets import load_dataset
from driftfl.common.errors import ConfigError


def write_idx(path, array, gz=True):
    magic = {1: 0x0801, 3: 0x0803}[array.ndim]
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def make_idx_dataset(folder, n_train=40, n_test=10, prefix="", gz=True, size=28):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}{split}-images-idx3-ubyte{suffix}",
                  rng.integers(0, 256, (n, size, size)), gz)
        write_idx(folder / f"{prefix}{split}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, gz)


def test_idx_reader_reads_gzip_and_plain(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, (5, 28, 28)).astype(np.uint8)
    write_idx(tmp_path / "a.gz", images, gz=True)
    write_idx(tmp_path / "b", images, gz=False)
    assert np.array_equal(loaders.read_idx(tmp_path / "a.gz"), images)
    assert np.array_equal(loaders.read_idx(tmp_path / "b"), images)


def test_a_gzipped_idx_file_is_decoded_once_and_again_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFTFL_CACHE", str(tmp_path / "cache"))
    images = np.random.default_rng(1).integers(0, 256, (5, 28, 28)).astype(np.uint8)
    write_idx(tmp_path / "a.gz", images, gz=True)
    assert np.array_equal(loaders.read_idx(tmp_path / "a.gz"), images)
    [kept] = (tmp_path / "cache" / "idx").glob("a-*.npy")
    assert np.array_equal(np.load(kept), images)
    monkeypatch.setattr(loaders.gzip, "open", None)  # the second read does not decompress
    assert np.array_equal(loaders.read_idx(tmp_path / "a.gz"), images)
    monkeypatch.undo()
    monkeypatch.setenv("DRIFTFL_CACHE", str(tmp_path / "cache"))
    write_idx(tmp_path / "a.gz", images[:3], gz=True)  # the file replaced: read afresh
    os.utime(tmp_path / "a.gz", ns=(1, 1))
    assert np.array_equal(loaders.read_idx(tmp_path / "a.gz"), images[:3])
    kept.write_bytes(kept.read_bytes()[:40])  # a copy cut short is never read as data
    [newer] = set((tmp_path / "cache" / "idx").glob("a-*.npy")) - {kept}
    newer.write_bytes(newer.read_bytes()[:40])
    assert np.array_equal(loaders.read_idx(tmp_path / "a.gz"), images[:3])


def test_idx_reader_rejects_other_files(tmp_path):
    (tmp_path / "x").write_bytes(b"\x00\x00\x09\x01" + b"\x00" * 12)  # signed-byte magic
    with pytest.raises(ConfigError, match="not an unsigned-byte IDX"):
        loaders.read_idx(tmp_path / "x")
    write_idx(tmp_path / "t", np.zeros((4, 3, 3)), gz=False)
    (tmp_path / "t").write_bytes((tmp_path / "t").read_bytes()[:-5])
    with pytest.raises(ConfigError, match="truncated"):
        loaders.read_idx(tmp_path / "t")


@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_mnist_from_flat_or_torchvision_layout(tmp_path, layout):
    folder = tmp_path / "MNIST" / "raw" if layout == "torchvision" else tmp_path
    make_idx_dataset(folder, gz=layout == "flat")
    data = load_dataset({"name": "mnist", "root": str(tmp_path)})
    assert data.train_x.shape == (40, 1, 28, 28) and data.test_x.shape == (10, 1, 28, 28)
    assert data.num_classes == 10 and data.train_y.dtype == np.int64


def test_emnist_letters_are_transposed_and_shifted(tmp_path):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (6, 28, 28))
    folder = tmp_path / "EMNIST" / "raw"
    folder.mkdir(parents=True)
    for split in ("train", "test"):
        write_idx(folder / f"emnist-letters-{split}-images-idx3-ubyte", images, gz=False)
        write_idx(folder / f"emnist-letters-{split}-labels-idx1-ubyte", np.arange(1, 7), gz=False)
    data = load_dataset({"name": "emnist", "split": "letters", "root": str(tmp_path)})
    assert data.classes[0] == "a" and data.num_classes == 26
    assert list(data.train_y) == [0, 1, 2, 3, 4, 5]
    assert np.array_equal(data.train_x[0, 0], images[0].T)


def write_cifar(root, name, n_per_file, files, label_key, meta):
    folder = root / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for fname in files:
        batch = {"data": rng.integers(0, 256, (n_per_file, 3072)).astype(np.uint8),
                 label_key: list(rng.integers(0, 10, n_per_file)), "batch_label": fname}
        with open(folder / fname, "wb") as f:
            pickle.dump(batch, f)
    meta_file, key, names = meta
    with open(folder / meta_file, "wb") as f:
        pickle.dump({key: names}, f)
    return folder


def test_cifar10_python_batches(tmp_path):
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    folder = write_cifar(tmp_path, "cifar-10-batches-py", 4, files, "labels",
                         ("batches.meta", "label_names", names))
    data = load_dataset({"name": "cifar10", "root": str(tmp_path)})
    assert data.train_x.shape == (20, 3, 32, 32) and data.test_x.shape == (4, 3, 32, 32)
    assert data.classes == tuple(names)
    with open(folder / "data_batch_1", "rb") as f:
        first = pickle.load(f)
    # row-major 3072 = 3 x 32 x 32, channel first: red plane is the first 1024 bytes
    assert np.array_equal(data.train_x[0, 0].ravel(), first["data"][0, :1024])


class RunsCode:
    """A pickle payload: unpickling it creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_cifar_batch_that_would_run_code_is_refused_without_running_it(tmp_path):
    names = [f"class{i}" for i in range(10)]
    folder = write_cifar(tmp_path, "cifar-10-batches-py", 2, ["data_batch_1"], "labels",
                         ("batches.meta", "label_names", names))
    marker = tmp_path / "ran"
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump({"data": RunsCode(marker), "labels": [0, 1]}, f)
    pickle.loads(pickle.dumps(RunsCode(marker))).close()  # the payload runs when unpickled
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ConfigError, match=r"data_batch_1 is not a CIFAR python batch \(it asks "
                       r"for io.open\); a pickle that asks for more than arrays is "
                       r"never loaded"):
        loaders.read_cifar(folder, ["data_batch_1"], "labels")
    assert not marker.exists()


def test_cifar100_fine_labels(tmp_path):
    names = [f"class{i}" for i in range(100)]
    write_cifar(tmp_path, "cifar-100-python", 5, ["train", "test"], "fine_labels",
                ("meta", "fine_label_names", names))
    data = load_dataset({"name": "cifar100", "root": str(tmp_path)})
    assert data.num_classes == 100 and len(data.train_y) == 5


def test_svhn_mat_files(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(4)
    for split, n in (("train", 7), ("test", 3)):
        x = rng.integers(0, 256, (32, 32, 3, n)).astype(np.uint8)
        y = np.array([[10], [1], [2], [3], [4], [5], [6]][:n], dtype=np.uint8)
        savemat(tmp_path / f"{split}_32x32.mat", {"X": x, "y": y})
        if split == "train":
            train_x = x
    data = load_dataset({"name": "svhn", "root": str(tmp_path)})
    assert data.train_x.shape == (7, 3, 32, 32)
    assert data.train_y[0] == 0  # SVHN stores the digit 0 as label 10
    assert np.array_equal(data.train_x[2, 1], train_x[:, :, 1, 2])


def write_images(folder, classes, per_class, size=(20, 24), mode="RGB"):
    rng = np.random.default_rng(5)
    for c in classes:
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
            Image.fromarray(rng.integers(0, 256, shape).astype(np.uint8), mode).save(
                folder / c / f"{i}.png")


def test_image_folder_with_and_without_test_split(tmp_path):
    write_images(tmp_path / "a" / "train", ["cat", "dog"], 3)
    write_images(tmp_path / "a" / "test", ["cat", "dog"], 1)
    data = load_dataset({"name": "folder", "root": str(tmp_path / "a"), "image_size": 16,
                         "channels": 1})
    assert data.train_x.shape == (6, 1, 16, 16) and data.test_x.shape == (2, 1, 16, 16)
    assert data.classes == ("cat", "dog")

    write_images(tmp_path / "b", ["x", "y"], 5)
    data = load_dataset({"name": "folder", "root": str(tmp_path / "b"), "image_size": 8,
                         "channels": 3, "test_fraction": 0.2})
    assert len(data.train_y) == 8 and len(data.test_y) == 2


def test_image_folder_without_images_is_a_clear_error(tmp_path):
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no images found in .*<class>/<image>.png"):
        load_dataset({"name": "folder", "root": str(tmp_path / "empty")})


def test_client_folder_class_names_must_be_dataset_classes(tmp_path):
    write_images(tmp_path, ["cat", "zebra"], 1)
    with pytest.raises(ConfigError, match=r"\['zebra'\].*name them after the classes: cat, dog"):
        loaders.read_image_folder(tmp_path, ["cat", "dog"], 8, 3)


def test_npz_layouts(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (10, 12, 12, 3)).astype(np.uint8)  # NHWC
    np.savez(tmp_path / "xy.npz", x=x, y=np.arange(10) % 3)
    data = load_dataset({"name": "npz", "root": str(tmp_path / "xy.npz"), "test_fraction": 0.3})
    assert data.train_x.shape == (7, 3, 12, 12) and data.num_classes == 3
    np.savez(tmp_path / "split.npz", x_train=x[:, :, :, 0], y_train=np.arange(10) % 2,
             x_test=x[:4, :, :, 0], y_test=np.arange(4) % 2)
    data = load_dataset({"name": "npz", "root": str(tmp_path / "split.npz")})
    assert data.train_x.shape == (10, 1, 12, 12) and data.test_x.shape == (4, 1, 12, 12)


def test_npz_errors_say_what_to_do(tmp_path):
    np.savez(tmp_path / "f.npz", x=np.zeros((4, 8, 8)), y=np.zeros(4))
    with pytest.raises(ConfigError, match="must be uint8.*astype"):
        load_dataset({"name": "npz", "root": str(tmp_path / "f.npz")})
    np.savez(tmp_path / "k.npz", images=np.zeros((4, 8, 8), np.uint8))
    with pytest.raises(ConfigError, match="expected x and y"):
        load_dataset({"name": "npz", "root": str(tmp_path / "k.npz")})


def test_npz_labels_must_be_class_indices(tmp_path):
    x = np.zeros((4, 8, 8), np.uint8)
    np.savez(tmp_path / "whole.npz", x=x, y=np.array([0.0, 1.0, 2.0, 3.0]))
    _, y, _, _ = loaders.read_npz(tmp_path / "whole.npz")
    assert y.dtype == np.int64 and y.tolist() == [0, 1, 2, 3]
    for name, labels, message in (
            ("half.npz", [0, 1, 2, 3.5], "y[3] is 3.5"),
            ("negative.npz", [0, -1, 2, 3], "y[1] is -1"),
            ("nan.npz", [0, 1, np.nan, 3], "y[2] is nan"),
            ("text.npz", list("abcd"), "y holds non-numeric labels (str32)")):
        np.savez(tmp_path / name, x=x, y=np.array(labels))
        with pytest.raises(ConfigError) as refused:
            loaders.read_npz(tmp_path / name)
        assert str(refused.value) == (f"{tmp_path / name}: {message}; labels must be class "
                                      "indices (whole numbers 0..C-1), one per sample; save "
                                      "each sample's class index in y")
    np.savez(tmp_path / "onehot.npz", x=x, y=np.eye(4))
    with pytest.raises(ConfigError, match=r"y has shape \(4, 4\);.*y.argmax\(axis=1\)"):
        loaders.read_npz(tmp_path / "onehot.npz")
    np.savez(tmp_path / "split.npz", x_train=x, y_train=np.arange(4), x_test=x[:2],
             y_test=np.array([0.5, 1.0]))
    with pytest.raises(ConfigError, match=r"split.npz: y_test\[0\] is 0.5;.* index in y_test$"):
        load_dataset({"name": "npz", "root": str(tmp_path / "split.npz")})


def test_channel_stats_are_the_exact_mean_and_std_of_each_channel():
    """Pinned by hand on a tiny case, and equal to float64 statistics on random images."""
    from driftfl.common.datasets import channel_stats

    x = np.zeros((2, 2, 1, 2), dtype=np.uint8)
    x[:, 0, 0] = [[0, 255], [255, 255]]  # channel 0: three 1.0 and a 0.0
    x[:, 1] = 51  # channel 1: all 0.2, std 0 -> 1.0 so normalising never divides by zero
    means, stds = channel_stats(x)
    assert means == (0.75, 0.2) and stds[1] == 1.0
    assert stds[0] == pytest.approx(np.sqrt(0.75 * 0.25), abs=1e-15)

    images = np.random.default_rng(0).integers(0, 256, (300, 3, 8, 8), dtype=np.uint8)
    means, stds = channel_stats(images)
    scaled = images.astype(np.float64) / 255.0
    assert means == pytest.approx(scaled.mean(axis=(0, 2, 3)), abs=1e-12)
    assert stds == pytest.approx(scaled.std(axis=(0, 2, 3)), abs=1e-12)
