"""What DP-DM costs against plain DM: seconds of condensation per client, side by side.

One client-sized slice of real Fashion-MNIST (benchmarks/dcfl_cost.py's: 600 training images of
each of classes 0-4), the MLP, ipc 10, DSA, 200 iterations (DCFL's default), 1 torch thread
(what a simulated client gets). Alternating repetitions of:
  - dm:      DM from noise (DCFL's default),
  - dp-dm:   DP-DM at a target epsilon of 8 (delta 1e-5): the calibration of each class's noise
             multiplier by dp-accounting (timed apart as `plan`) and the condensation
             (Poisson sampling, per-sample clipping, noise).
Prints the median seconds of each and the ratio dp-dm / dm; first, for the MLP, the CNN and
LeNet-5, the default clip (the median embedding norm of N(0, 1) images under fresh networks from
a public seed, condense.noise_clip) beside the median norm of these real images' embeddings
under the same networks, and the share of those the clip shortens.

    .venv/bin/python benchmarks/dp_condense_cost.py [--repeats 3] [--iterations 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dcfl_cost import client_data  # noqa: E402

from driftfl.dcfl.condense import CondenseConfig, condense, noise_clip, public_networks
from driftfl.common import accounting  # noqa: E402
from driftfl.common.augment import DEFAULT_TRANSFORMS, SiameseAugment, parse_transforms  # noqa: E402,E501
from driftfl.dcfl.settings import condensation_settings, privacy_plan
from driftfl.common.models import build_model, mlp  # noqa: E402


def clip_against_real(name: str, x: torch.Tensor) -> str:
    """The default clip of model ``name``, and the median norm of the real embeddings and the
    share clipped under the same networks (eval mode, as DP-DM runs them)."""
    def make():
        return build_model({"name": name}, (1, 28, 28), 10)

    clip, norms = noise_clip(make, (1, 28, 28)), []
    for net, _ in public_networks(make, (1, 28, 28)):
        with torch.no_grad():
            norms.append(net.features(x).norm(dim=1))
    norms = torch.cat(norms)
    return (f"{name}: default clip {clip:.2f}, real embeddings' median norm "
            f"{float(norms.median()):.2f}, {float((norms > clip).float().mean()):.0%} clipped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, y = client_data()
    counts = torch.bincount(y, minlength=10).tolist()
    for name in ("mlp", "cnn", "lenet5"):
        print(clip_against_real(name, x))
    config = CondenseConfig(method="dm", init="noise", ipc=10, iterations=args.iterations,
                            lr=1.0, real_per_class=256, log_every=args.iterations)
    augment = SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS))
    settings = condensation_settings({"condense_dp": True, "condense_dp_epsilon": 8.0,
                                      "condense_iterations": args.iterations})

    def run(privacy) -> float:
        started = time.perf_counter()
        condense(x, y, 10, config, make_network=lambda: mlp((1, 28, 28), 10), augment=augment,
                 generator=torch.Generator().manual_seed(0), privacy=privacy)
        return time.perf_counter() - started

    seconds: dict[str, list[float]] = {"dm": [], "plan": [], "dp-dm": []}
    for _ in range(args.repeats):
        seconds["dm"].append(run(None))
        started = time.perf_counter()
        accounting.replace_one_noise_for_epsilon.cache_clear()  # time it every repetition
        accounting.replace_one_epsilon.cache_clear()
        plan = privacy_plan(settings, counts, default_clip=noise_clip(
            lambda: mlp((1, 28, 28), 10), (1, 28, 28)))
        seconds["plan"].append(time.perf_counter() - started)
        seconds["dp-dm"].append(run(plan) + seconds["plan"][-1])
    median = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"{len(y)} images, classes 0-4, {args.iterations} iterations, {args.repeats} repeats "
          f"(median seconds); DP-DM at epsilon {plan.epsilon:.3g}, delta 1e-5")
    print(f"dm     {median['dm']:7.2f} s")
    print(f"dp-dm  {median['dp-dm']:7.2f} s  (of which the noise calibration {median['plan']:.2f} s)")
    print(f"ratio dp-dm / dm: {median['dp-dm'] / median['dm']:.2f}")


if __name__ == "__main__":
    main()
