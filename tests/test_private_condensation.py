"""DP-DM: each real embedding clipped to C, the class sum noised with N(0, sigma^2 C^2), Poisson
sampling at rate q, and the privacy loss accounted by dp-accounting (never by hand)."""

from __future__ import annotations

import logging

import pytest
import torch

from driftfl.client.condense import CondenseConfig, _Condenser, condense
from driftfl.common.accounting import noise_for_epsilon, subsampled_gaussian_epsilon
from driftfl.common.condensation import PrivacyPlan, condensation_settings, privacy_plan
from driftfl.common.errors import ConfigError
from driftfl.common.models import mlp

SHAPE = (1, 4, 4)


def plan(noise: float = 1.0, clip: float = 1.0, rate: float = 0.5) -> PrivacyPlan:
    return PrivacyPlan(clip=clip, delta=1e-5, iterations=1, rates={0: rate}, noise={0: noise},
                       epsilons={0: 1.0})


def condenser(pool_size: int, privacy: PrivacyPlan, seed: int = 0) -> _Condenser:
    x = torch.zeros(pool_size, *SHAPE)
    pools = [torch.arange(pool_size)]
    return _Condenser(x, pools, [0], torch.zeros(1, *SHAPE), CondenseConfig(ipc=1), None,
                      torch.Generator().manual_seed(seed), privacy)


def test_a_huge_sample_moves_the_noised_mean_by_at_most_c_over_qn():
    n, privacy = 40, plan(noise=1.0, clip=1.5, rate=0.5)
    """Add/remove adjacency, as the accountant assumes: a batch with one more sample, however
    large its embedding, has its mean moved by at most C / (q n) (same noise in both)."""
    batch = torch.rand(20, 8, generator=torch.Generator().manual_seed(1)) * 0.1
    with_huge = torch.cat([batch, torch.full((1, 8), 1e6)])
    same_noise = [condenser(n, privacy).private_mean(0, b) for b in (batch, with_huge)]
    shift = float((same_noise[1] - same_noise[0]).norm())
    assert shift == pytest.approx(1.5 / (0.5 * n), rel=1e-5)  # clipped to C, and no more


def test_the_noise_has_the_stated_scale():
    """Zero embeddings: the mean is pure noise of standard deviation sigma C / (q n)."""
    n, privacy = 64, plan(noise=3.0, clip=2.0, rate=0.25)
    state = condenser(n, privacy, seed=7)
    draws = torch.stack([state.private_mean(0, torch.zeros(16, 50)) for _ in range(400)])
    expected = 3.0 * 2.0 / (0.25 * n)
    assert abs(float(draws.std()) / expected - 1) < 0.03
    assert abs(float(draws.mean())) < 0.05 * expected
    again = condenser(n, privacy, seed=7).private_mean(0, torch.zeros(16, 50))
    assert torch.equal(again, draws[0])  # seeded


def test_poisson_sampling_at_the_plan_rate():
    state = condenser(2000, plan(rate=0.1))
    sizes = [len(state.real_batches()[0]) for _ in range(50)]
    assert 180 < sum(sizes) / len(sizes) < 220
    assert len(set(sizes)) > 5  # Poisson: the batch size varies


def test_epsilon_is_the_librarys_own_figure():
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    logging.getLogger("absl").setLevel(logging.ERROR)
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1)), 300))
    assert subsampled_gaussian_epsilon(0.05, 1.1, 300, 1e-5) == accountant.get_epsilon(1e-5)
    sigma = noise_for_epsilon(0.05, 300, 2.0, 1e-5)
    assert 1.9 < subsampled_gaussian_epsilon(0.05, sigma, 300, 1e-5) <= 2.0 + 1e-6
    assert subsampled_gaussian_epsilon(0.05, sigma * 0.9, 300, 1e-5) > 2.0


def test_plan_by_class_and_the_client_epsilon_is_the_largest():
    settings = condensation_settings({"condense_dp": True, "condense_dp_noise": 1.0,
                                      "condense_batch": 100, "condense_iterations": 50})
    p = privacy_plan(settings, [1000, 0, 50])
    assert p.rates == {0: 0.1, 2: 1.0} and p.noise == {0: 1.0, 2: 1.0}
    assert p.epsilons[0] == subsampled_gaussian_epsilon(0.1, 1.0, 50, 1e-5)
    assert p.epsilon == p.epsilons[2] > p.epsilons[0]  # the fully sampled class costs most
    target = privacy_plan(condensation_settings({"condense_dp": True, "condense_dp_epsilon": 4.0,
                                                 "condense_batch": 100,
                                                 "condense_iterations": 50}), [1000, 0, 50])
    assert all(3.8 < e <= 4.0 + 1e-6 for e in target.epsilons.values())
    assert target.noise[2] > target.noise[0]
    assert privacy_plan(condensation_settings({}), [10, 10]) is None


def test_private_condensation_runs_and_is_seeded():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, *SHAPE, generator=gen), torch.arange(3).repeat_interleave(20)
    privacy = privacy_plan(condensation_settings({"condense_dp": True, "condense_dp_noise": 2.0,
                                                  "condense_batch": 10,
                                                  "condense_iterations": 5}), [20, 20, 20])
    config = CondenseConfig(ipc=2, iterations=5, real_per_class=10)
    runs = [condense(x, y, 3, config, make_network=lambda: mlp(SHAPE, 3, hidden=(8,)),
                     augment=None, generator=torch.Generator().manual_seed(seed),
                     privacy=privacy)[0] for seed in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    with pytest.raises(ConfigError, match="condense_init=noise"):
        condense(x, y, 3, CondenseConfig(init="real", iterations=1),
                 make_network=lambda: mlp(SHAPE, 3, hidden=(8,)), augment=None,
                 generator=torch.Generator(), privacy=privacy)


@pytest.mark.parametrize("settings, message", [
    ({"condense_dp": True, "condense_dp_epsilon": -1.0}, "condense_dp_epsilon must be > 0"),
    ({"condense_dp": True, "condense_dp_noise": 0.0}, "condense_dp_noise must be > 0"),
    ({"condense_init": "zeros"}, "unknown strategy.condense_init 'zeros'; valid: noise, real"),
    ({"condense_dp": True}, "exactly one of condense_dp_noise"),
    ({"condense_dp": True, "condense_dp_noise": 1.0, "condense_init": "real"},
     "needs condensation=dm and condense_init=noise"),
    ({"condense_dp": True, "condense_dp_noise": 1.0, "condensation": "dsa"},
     "needs condensation=dm"),
])
def test_bad_settings_one_line(settings, message):
    with pytest.raises(ConfigError) as caught:
        condensation_settings(settings)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("override, message", [
    ("strategy.condense_dp_epsilon=-1", "strategy.condense_dp_epsilon must be > 0"),
    ("strategy.condense_dp_noise=0", "strategy.condense_dp_noise must be > 0"),
])
def test_bad_dp_settings_refused_by_the_experiment_check(override, message):
    """The whole experiment's check (what `driftfl run` does before anything is written)."""
    from driftfl.common.config import compose
    from driftfl.methods import check_experiment

    with pytest.raises(ConfigError) as caught:
        check_experiment(compose(["strategy=dcfl", "strategy.condense_dp=true", override]))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="valid: noise, real"):
        check_experiment(compose(["strategy=dcfl", "strategy.condense_init=zeros"]))
