"""Privacy accounting by Google's dp-accounting library: an accountant is never written by
hand here.

- DP-FedAvg's rounds (``released_epsilon``): each round a Poisson-sampled composition of the
  Gaussian sums it released (the model update, a method's payload, adaptive clipping's count),
  each against its own sensitivity, under zero-out neighbours, by the library's RDP
  accountant. The release parts record every round's rate and multipliers (metrics.csv's
  dp_q and dp_sigma*), so the figure can be recomputed from a run's own files.
- DP-DM (``replace_one_epsilon``): per class, Poisson-sampled Gaussian steps under replace-one
  neighbours (the class counts are public), by the library's PLD accountant.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Sequence


def _accountant(relation):
    # the library logs a warning for every Rényi order it cannot evaluate; it skips them and
    # the epsilon stays valid (an upper bound over the orders it kept)
    logging.getLogger("absl").setLevel(logging.ERROR)
    from dp_accounting.rdp import RdpAccountant

    return RdpAccountant(neighboring_relation=relation)


def _event(sample_rate: float, noise_multiplier: float, steps: int):
    """``steps`` Poisson-sampled Gaussian steps, as one event."""
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)


# One round as a run released it: (the Poisson sampling rate credited, 1 for none; the noise
# multipliers of the Gaussian sums it released, each against its own sensitivity).
Released = tuple[float, tuple[float, ...]]


@functools.lru_cache(maxsize=4096)
def released_epsilon(rounds: tuple[Released, ...], delta: float) -> float:
    """Epsilon at ``delta`` of ``rounds``, each a Poisson-sampled composition of its Gaussian
    sums (a client is in the sample for all of a round's sums or for none). The neighbour
    relation is zero-out (REPLACE_SPECIAL: one client's contribution replaced by nothing),
    which the library accounts as add/remove: what the release modes' sensitivities assume."""
    import dp_accounting

    if not rounds:
        return 0.0
    accountant = _accountant(dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    for (rate, sigmas), count in Counter(rounds).items():
        gaussians = [dp_accounting.GaussianDpEvent(s) for s in sigmas]
        event = gaussians[0] if len(gaussians) == 1 else dp_accounting.ComposedDpEvent(gaussians)
        if rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(rate, event)
        accountant.compose(event, count)
    return float(accountant.get_epsilon(delta))


def round_of(rate: float, sigmas: Sequence[float]) -> Released:
    """A round's entry, as ``released_epsilon`` takes it (floats, hashable)."""
    return float(rate), tuple(float(s) for s in sigmas)


# -- replace-one neighbours (DP-DM), by the library's PLD accountant -----------------------
# DP-DM divides by the public class count n_c, so its neighbours keep the counts: one image
# replaced by another (sensitivity 2C, twice add/remove's). The PLD library's REPLACE adjacency
# models exactly that: mu(x + C) against mu(x - C), each sharing the (1 - q) unsampled part.

# Calibration never goes below this noise multiplier: a PLD of hundreds of steps under less
# noise takes most of a gigabyte, and epsilons there are past any use.
REPLACE_ONE_NOISE_FLOOR = 0.5
# The search's PLD discretisation, 10x the library's default: 3-8x faster, the same epsilon to
# 3 decimals where measured; the sigma found is then checked at the default (what plans report).
SEARCH_INTERVAL, SEARCH_TOL = 1e-3, 0.005


def _replace_one_accountant(value_discretization_interval: float = 1e-4):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    return PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
                         value_discretization_interval=value_discretization_interval)


@functools.lru_cache(maxsize=4096)
def replace_one_epsilon(sample_rate: float, noise_multiplier: float, steps: int,
                        delta: float) -> float:
    """Epsilon at ``delta`` of ``steps`` Poisson-subsampled Gaussian steps under replace-one
    neighbours, each sample clipped to norm C and noised with std ``noise_multiplier`` x C."""
    accountant = _replace_one_accountant()
    accountant.compose(_event(sample_rate, noise_multiplier, steps))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def replace_one_noise_for_epsilon(sample_rate: float, steps: int, epsilon: float,
                                  delta: float) -> float:
    """The smallest noise multiplier, to SEARCH_TOL and at least REPLACE_ONE_NOISE_FLOOR, whose
    replace-one epsilon stays within (``epsilon``, ``delta``)."""
    import dp_accounting

    search = functools.partial(_replace_one_accountant, SEARCH_INTERVAL)

    def event(sigma: float):
        return _event(sample_rate, sigma, steps)

    sigma = REPLACE_ONE_NOISE_FLOOR
    if search().compose(event(sigma)).get_epsilon(delta) > epsilon:
        sigma = dp_accounting.calibrate_dp_mechanism(
            search, event, epsilon, delta,
            dp_accounting.mechanism_calibration.LowerEndpointAndGuess(sigma, 2 * sigma),
            tol=SEARCH_TOL)
    if not math.isfinite(sigma):
        raise ValueError(f"no noise multiplier reaches epsilon {epsilon:g} at delta {delta:g}")
    while replace_one_epsilon(sample_rate, sigma, steps, delta) > epsilon:
        sigma += SEARCH_TOL  # the default discretisation's figure is a hair above the search's
    return float(sigma)
