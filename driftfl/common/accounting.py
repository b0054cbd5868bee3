"""Privacy accounting of the subsampled Gaussian mechanism, by Google's dp-accounting library
(its RDP accountant): an accountant is never written by hand here.

A mechanism run ``steps`` times, each time on a Poisson sample of the data at rate
``sample_rate``, adding Gaussian noise of standard deviation ``noise_multiplier`` x the
sensitivity, is (epsilon, delta)-DP with the epsilon these functions give. With ``parts`` > 1
each step releases that many Gaussian sums (the model update, and a method's payload beside
it, each clipped to its own norm and noised by the same multiplier), composed by the library
inside the sampled step: a client is in the sample for all of them or for none.
"""

from __future__ import annotations

import functools
import logging
import math


def _accountant():
    # the library logs a warning for every Rényi order it cannot evaluate; it skips them and
    # the epsilon stays valid (an upper bound over the orders it kept)
    logging.getLogger("absl").setLevel(logging.ERROR)
    from dp_accounting.rdp import RdpAccountant

    return RdpAccountant()


def _event(sample_rate: float, noise_multiplier: float, steps: int, parts: int = 1):
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    released = gaussian if parts == 1 else dp_accounting.ComposedDpEvent([gaussian] * parts)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, released), steps)


@functools.lru_cache(maxsize=4096)
def subsampled_gaussian_epsilon(sample_rate: float, noise_multiplier: float, steps: int,
                                delta: float, parts: int = 1) -> float:
    """Epsilon at ``delta`` of ``steps`` Poisson-subsampled steps of ``parts`` Gaussians each."""
    accountant = _accountant()
    accountant.compose(_event(sample_rate, noise_multiplier, steps, parts))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def noise_for_epsilon(sample_rate: float, steps: int, epsilon: float, delta: float) -> float:
    """The smallest noise multiplier (to the library's tolerance) whose ``steps`` subsampled
    Gaussian steps stay within (``epsilon``, ``delta``)."""
    import dp_accounting

    sigma = dp_accounting.calibrate_dp_mechanism(
        _accountant, lambda s: _event(sample_rate, s, steps), epsilon, delta,
        dp_accounting.mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-3)
    if not math.isfinite(sigma):
        raise ValueError(f"no noise multiplier reaches epsilon {epsilon:g} at delta {delta:g}")
    return float(sigma)
