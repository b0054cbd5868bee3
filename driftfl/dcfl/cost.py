"""What DCFL's condensation will cost each client, said before a simulated run starts: one
iteration of the run's settings and model timed on this machine with one torch thread (a
simulated client's), times the iterations. It runs the clients' condensation code on noise
images (no client's data), so it lives beside both halves of DCFL, and `driftfl run` calls it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from driftfl.common.augment import SiameseAugment, parse_transforms
from driftfl.common.models import DriftModel, ModelSettings, build_model
from driftfl.dcfl.condense import CondenseConfig, condense, condense_config
from driftfl.dcfl.settings import CondensationSettings, condensation_settings


def seconds_per_iteration(config: CondenseConfig, make_network: Callable[[], DriftModel],
                          shape: Sequence[int], num_classes: int,
                          augment: SiameseAugment | None, timed: int = 3) -> float:
    """One iteration of ``config`` on this machine with one torch thread: ``timed`` iterations
    on N(0, 1) images, a full real batch of every class, after a first one (which also builds
    and checks the network)."""
    x = torch.randn((num_classes * config.real_per_class, *shape),
                    generator=torch.Generator().manual_seed(0))
    y = torch.arange(num_classes).repeat_interleave(config.real_per_class)
    done: list[float] = []  # seconds at the end of each iteration
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        condense(x, y, num_classes, replace(config, iterations=1 + timed, log_every=1,
                                            min_class=1),
                 make_network=make_network, augment=augment if config.method != "dc" else None,
                 generator=torch.Generator().manual_seed(0),
                 progress=lambda _, __, seconds: done.append(seconds))
    finally:
        torch.set_num_threads(threads)
    return (done[-1] - done[0]) / timed


def cost_line(strategy: dict, model: ModelSettings, shape: Sequence[int],
              num_classes: int) -> str:
    """The line: about how many seconds condensing takes a client holding every class."""
    s: CondensationSettings = condensation_settings(strategy)
    if s.condensation == "real":
        return ("DCFL: condensation=real (a research ablation, NOT private): each explored "
                "client ships random real images of its own, at no condensing cost")
    seconds = seconds_per_iteration(
        condense_config(s), lambda: build_model(model, tuple(shape), num_classes), shape,
        num_classes, SiameseAugment(parse_transforms(s.dsa_transforms)))
    how = (f"{s.condensation} from {s.condense_init}, {s.condense_iterations} iterations of "
           f"{s.condense_batch} real images per class, {s.condense_optimizer} lr "
           f"{s.condense_lr:g}")
    return (f"DCFL: condensing costs each explored client about "
            f"{s.condense_iterations * seconds:.0f} s once ({how}): {1e3 * seconds:.1f} ms an "
            f"iteration of the {model.name}, timed here on one thread for a client holding "
            "every class")
