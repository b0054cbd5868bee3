"""What DCFL's clients ship, said before any of it leaves them, and the figures each client
sends about its own condensed set (informative: the server records them by client; `driftfl
audit` measures the sets again from the data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING

import numpy as np
from flwr.supercore import log

from driftfl.dcfl.settings import CondensationSettings, privacy_plan
from driftfl.common.protocol import (CONDENSE_EPSILON, CONDENSE_SECONDS, CONDENSED_COPIES,
                                     CONDENSED_SIMILARITY)

# Measured (docs/results.md, DCFL: what leaves a client): at DCFL's earlier default, DM from
# real images for 200 iterations, every shipped image had a real image of its client with
# Pearson correlation >= 0.99 (median 0.9993).
REAL_INIT_WARNING = (
    "driftfl: WARNING: condense_init=real: the condensed images start as the clients' own "
    "photos and DM moves them little (measured on Fashion-MNIST: at 200 iterations every "
    "image DCFL shipped had a real image with Pearson correlation >= 0.99; at 2,000, 94-100 % "
    "of them >= 0.95; at 20,000, 63 %): what leaves the clients is, in effect, their images. "
    "Each client prints how close its set is when it condenses.")

# condensation=real, on every run that uses it
REAL_IMAGES_LINE = (
    "DCFL: NOT PRIVATE: condensation=real is a research ablation: each explored client ships "
    "{ipc} random real images of each class it holds, its own photos, not condensed ones (the "
    "bound of what condensed images could do); refused outside simulation.")

# a client's own figures (reply metric -> the round row's column, a dict by client)
COLUMNS = {CONDENSE_SECONDS: "condense_seconds", CONDENSE_EPSILON: "condense_epsilon",
           CONDENSED_COPIES: "condensed_copies", CONDENSED_SIMILARITY: "condensed_similarity"}


def figures(metrics: Mapping) -> dict[str, float]:
    """A reply's figures of its condensation: informative only, so a missing or non-finite one
    is left out, not refused."""
    return {key: float(metrics[key]) for key in COLUMNS
            if isinstance(metrics.get(key), (int, float)) and np.isfinite(metrics[key])}


def most_sampled(histogram: Sequence[int], min_class: int = 1) -> list[int]:
    """The count of a client's smallest condensed class (at least ``min_class`` images): at one
    noise multiplier the epsilon grows with the sampling rate, so that class's is the
    client's (one PLD call, not one per class)."""
    held = [int(n) for n in histogram if n >= max(1, min_class)]
    return [min(held)] if held else []


def announce(s: CondensationSettings, histograms: Sequence[tuple[str, np.ndarray]]) -> None:
    """Print what will leave the clients (``histograms``: each client's name and surveyed label
    histogram, for the epsilon each gets from a fixed noise multiplier)."""
    how = ("random real images, not condensed" if s.condensation == "real" else
           f"{s.condensation.upper()} from {s.condense_init}, {s.condense_iterations} iterations")
    print(f"DCFL: each explored client sends the server {s.ipc} condensed images of each "
          f"class of which it holds at least {s.min_class} images ({how}) and its classifier; "
          "the server sends them on to other clients. Each client measures how close its set "
          "is to its own images when it condenses (condensed_copies, condensed_similarity in "
          "metrics.csv"
          + (", not sent under DP-DM" if s.condense_dp else "") + "; a deployed node prints "
          "it); `driftfl run` prints the audit of a simulation's sets after the run, and "
          "`driftfl audit <run dir>` measures them again.", flush=True)
    if s.condensation == "real":
        print(REAL_IMAGES_LINE.format(ipc=s.ipc), flush=True)
    elif s.condense_init == "real":
        log(WARNING, REAL_INIT_WARNING)
    clip = (f"{s.condense_dp_clip:g}" if s.condense_dp_clip is not None else
            "the median norm of noise images under fresh networks (each client prints it)")
    if not s.condense_dp:
        print("DCFL: condensation is not differentially private (condense_dp=false).",
              flush=True)
    elif s.condense_dp_epsilon is not None:
        print(f"DCFL: DP-DM, every client's condensation is ({s.condense_dp_epsilon:g}, "
              f"{s.condense_dp_delta:g})-DP for its images (replace-one), each class's noise "
              f"multiplier calibrated to it; embeddings clipped to {clip}.", flush=True)
    else:
        epsilons = ", ".join(f"{name}: "
                             f"{privacy_plan(s, most_sampled(histogram, s.min_class)).epsilon:.3g}"
                             for name, histogram in histograms)
        print(f"DCFL: DP-DM with noise multiplier {s.condense_dp_noise:g}, embeddings clipped "
              f"to {clip}: (epsilon, delta={s.condense_dp_delta:g}, replace-one) by client "
              + epsilons, flush=True)

