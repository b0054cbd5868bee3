"""How close shipped images (DCFL's condensed sets) are to the real images of the client that
made them: a measure of what leaks when a client's synthetic data leaves it.

For every shipped image the nearest real image of the same client is the one with the highest
Pearson correlation over the flattened pixels, and a shipped image counts as a copy at
correlation >= THRESHOLD. Why Pearson:

- a copy stays a copy under a change of brightness or contrast (x -> a·x + b, a > 0), which
  is exactly what correlation ignores and what a pixel distance does not;
- every shipped image can be compared with every real image of its client (up to 60,000) by
  one matrix product of standardised rows, chunked to bound memory;
- it is the similarity the near-copies DCFL used to ship were first found with.

SSIM compares local windows, needs another library and a loop over all N·M pairs; a
perceptual distance (LPIPS and kin) needs a trained network, which an offline measure that has
to work for any dataset (grey or colour, any size) does not have. Correlation misses a copy
that is shifted or flipped: it measures near-copies, not every way an image can reveal data.

Pure NumPy (matplotlib only for the picture), so that a client and the CLI can both use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

THRESHOLD = 0.95  # Pearson correlation at or above which a shipped image counts as a copy


def channels_last(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, H, W) for one channel, (N, H, W, C) for more: the layout image
    files and the run directory's arrays use."""
    return x[:, 0] if x.shape[1] == 1 else x.transpose(0, 2, 3, 1)


def to_pixels(images: np.ndarray, mean, std) -> np.ndarray:
    """Normalised float images (N, C, H, W), as clients train on them
    (``(pixel / 255 - mean) / std`` per channel), back in the dataset's pixel scale: uint8,
    (N, H, W) for one channel or (N, H, W, C) for more, clipped to 0..255 and rounded."""
    x = np.asarray(images, dtype=np.float64)
    m = np.asarray(mean, dtype=np.float64)[None, :, None, None]
    s = np.asarray(std, dtype=np.float64)[None, :, None, None]
    pixels = np.clip(np.rint((x * s + m) * 255.0), 0, 255).astype(np.uint8)
    return channels_last(pixels)


def _standardised(x: np.ndarray) -> np.ndarray:
    """Rows centred and scaled to unit norm (float32), so that a dot product of two rows is
    their Pearson correlation; a constant row becomes zeros (correlation 0 with anything)."""
    rows = x.reshape(len(x), -1).astype(np.float32)
    size = np.linalg.norm(rows, axis=1, keepdims=True)
    rows -= rows.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(rows, axis=1, keepdims=True)
    flat = norm <= 1e-5 * size  # constant up to float32 rounding of its mean (or all zeros)
    return np.divide(rows, norm, out=np.zeros_like(rows), where=~flat)


def nearest_real(shipped: np.ndarray, real: np.ndarray,
                 chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """For each shipped image (any shape (N, ...)), the index of the real image with the
    highest Pearson correlation over the flattened pixels, and that correlation. The real
    images are standardised ``chunk`` at a time, so memory stays at chunk x pixels floats
    however many there are; ties go to the first."""
    if len(real) == 0:
        raise ValueError("no real images to compare the shipped ones with")
    if np.prod(shipped.shape[1:]) != np.prod(real.shape[1:]):
        raise ValueError(f"shipped images of shape {list(shipped.shape[1:])} cannot be "
                         f"compared with real images of shape {list(real.shape[1:])}")
    left = _standardised(shipped)
    best = np.full(len(shipped), -np.inf, dtype=np.float32)
    index = np.zeros(len(shipped), dtype=np.int64)
    for start in range(0, len(real), max(1, chunk)):
        scores = left @ _standardised(real[start:start + chunk]).T  # (shipped, chunk)
        top = scores.argmax(axis=1)
        value = scores[np.arange(len(shipped)), top]
        better = value > best
        best[better], index[better] = value[better], start + top[better]
    return index, np.clip(best.astype(np.float64), -1.0, 1.0)


@dataclass(frozen=True)
class Leakage:
    """One client's shipped set measured against its real data."""

    images: int  # shipped images
    copies: int  # ... whose nearest real image correlates >= threshold
    share: float  # copies / images (0 for none shipped)
    median: float  # median correlation with the nearest real image (nan for none shipped)
    max: float
    threshold: float = THRESHOLD

    def line(self) -> str:
        return (f"{self.copies} of {self.images} shipped images ({100 * self.share:.1f} %) have "
                f"a real image of this client with Pearson correlation >= {self.threshold:g}; "
                f"median nearest {self.median:.2f}, max {self.max:.2f}")

    def as_dict(self) -> dict:
        """For audit.json and summary.json (nan, for an empty set, as null)."""
        def number(v: float):
            return None if not np.isfinite(v) else round(float(v), 6)

        return {"images": self.images, "copies": self.copies, "share": number(self.share),
                "median": number(self.median), "max": number(self.max),
                "threshold": self.threshold, "similarity": "pearson"}


def summarise(correlation: np.ndarray, threshold: float = THRESHOLD) -> Leakage:
    """Leakage from the nearest-real correlations of a set (or of several sets pooled)."""
    c = np.asarray(correlation, dtype=np.float64)
    if len(c) == 0:
        return Leakage(0, 0, 0.0, float("nan"), float("nan"), threshold)
    copies = int((c >= threshold).sum())
    return Leakage(len(c), copies, copies / len(c), float(np.median(c)), float(c.max()),
                   threshold)


def measure(shipped_pixels: np.ndarray, real_pixels: np.ndarray,
            threshold: float = THRESHOLD) -> Leakage:
    """The share of shipped images that are near-copies of a real one, and how close the
    nearest real images are."""
    if len(shipped_pixels) == 0:
        return summarise(np.zeros(0), threshold)
    return summarise(nearest_real(shipped_pixels, real_pixels)[1], threshold)


PAIRS_PER_ROW = 10


def plot_pairs(shipped_pixels: np.ndarray, shipped_labels: np.ndarray, real_pixels: np.ndarray,
               nearest_index: np.ndarray, correlation: np.ndarray, path: Path, title: str,
               threshold: float = THRESHOLD) -> None:
    """A PNG of every shipped image (left) beside its nearest real image (right), the
    correlation under each pair (red at or above ``threshold``), a block of rows per class of
    the shipped image, at most PAIRS_PER_ROW pairs to a row: for a person to look at."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shipped, real = np.asarray(shipped_pixels), np.asarray(real_pixels)[nearest_index]
    grey = shipped.ndim == 3
    h, w = shipped.shape[1:3]
    labels = np.asarray(shipped_labels)
    rows = []  # (label, members) per row of pairs
    for label in sorted(set(labels.tolist())):
        members = np.flatnonzero(labels == label)
        rows += [(label, members[i:i + PAIRS_PER_ROW])
                 for i in range(0, len(members), PAIRS_PER_ROW)]
    rows = rows or [(None, np.zeros(0, dtype=np.int64))]
    columns = max(1, max(len(m) for _, m in rows))
    pair_w, row_h = 2 * w + 1 + 6, h + 8  # 1 pixel between the two, 6 between pairs; text below
    canvas = np.ones((row_h * len(rows), pair_w * columns) + (() if grey else (shipped.shape[3],)))
    fig, ax = plt.subplots(figsize=(max(4.0, columns * 1.3), len(rows) * 0.8 + 0.8))
    for r, (_, members) in enumerate(rows):
        for col, i in enumerate(members):
            top, left = r * row_h, col * pair_w
            canvas[top:top + h, left:left + w] = shipped[i] / 255.0
            canvas[top:top + h, left + w + 1:left + 2 * w + 1] = real[i] / 255.0
            ax.text(left + w, top + h + 0.5, f"{correlation[i]:.2f}", ha="center", va="top",
                    fontsize=6, color="red" if correlation[i] >= threshold else "black")
    ax.imshow(canvas, cmap="gray" if grey else None, vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks([r * row_h + h / 2 for r in range(len(rows))],
                  [f"class {label}" if label is not None else "" for label, _ in rows],
                  fontsize=7)
    ax.set_xticks([])
    ax.set_title(f"{title}\nleft: shipped, right: its nearest real image; Pearson correlation "
                 f"below (red: >= {threshold:g})", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
