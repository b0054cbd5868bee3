"""DP-DM: each real embedding clipped to C, the class sum noised with N(0, sigma^2 C^2), Poisson
sampling at rate q, and the privacy loss accounted by dp-accounting (never by hand) for
replace-one neighbours; its randomness from the OS, its embeddings per example, its default clip
from no client's data, and its reply the epsilon only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from driftfl.dcfl.condense import CondenseConfig, _Condenser, condense
from driftfl.dcfl.client import DCFLClient
from driftfl.common.accounting import released_epsilon
from driftfl.dcfl.settings import PrivacyPlan, condensation_settings, privacy_plan
from driftfl.common.errors import ConfigError
from driftfl.common.models import DriftModel, build_model, mlp, model_settings
from driftfl.common.protocol import (CONDENSE_EPSILON, CONDENSE_SECONDS, CONDENSED_COPIES,
                                     CONDENSED_SIMILARITY)

SHAPE = (1, 4, 4)


def plan(noise: float = 1.0, clip: float = 1.0, rate: float = 0.5) -> PrivacyPlan:
    return PrivacyPlan(clip=clip, delta=1e-5, iterations=1, rates={0: rate}, noise={0: noise},
                       epsilons={0: 1.0})


def condenser(pool_size: int, privacy: PrivacyPlan, seed: int = 0) -> _Condenser:
    x = torch.zeros(pool_size, *SHAPE)
    pools = [torch.arange(pool_size)]
    return _Condenser(x, pools, [0], torch.zeros(1, *SHAPE), CondenseConfig(ipc=1), None,
                      torch.Generator().manual_seed(seed), privacy)


def test_a_replaced_sample_moves_the_noised_mean_by_at_most_2c_over_qn():
    """Replace-one adjacency, as the accountant assumes (the class count, public, stays): one
    embedding replaced by another, however large, moves the mean by at most 2C / (q n), reached
    by opposite ones (same noise in both)."""
    n, privacy = 40, plan(noise=1.0, clip=1.5, rate=0.5)
    batch = torch.rand(20, 8, generator=torch.Generator().manual_seed(1)) * 0.1
    one, other = batch.clone(), batch.clone()
    one[0], other[0] = torch.full((8,), 1e6), torch.full((8,), -1e6)
    same_noise = [condenser(n, privacy).private_mean(0, b) for b in (one, other)]
    shift = float((same_noise[1] - same_noise[0]).norm())
    assert shift == pytest.approx(2 * 1.5 / (0.5 * n), rel=1e-5)  # clipped to C, and no more


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


def pld_replace_one(rate: float, sigma: float, steps: int) -> float:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    accountant = PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        rate, dp_accounting.GaussianDpEvent(sigma)), steps))
    return accountant.get_epsilon(1e-5)


def test_the_plan_accounts_replace_one_neighbours_by_the_pld_accountant():
    """The class counts are public, so neighbours replace one image (2C apart): the plan's
    epsilon is the PLD REPLACE_ONE figure, above the add/remove RDP figure of the same sigma."""
    settings = condensation_settings({"condense_dp": True, "condense_dp_noise": 1.2,
                                      "condense_batch": 50, "condense_iterations": 100})
    p = privacy_plan(settings, [500, 50])
    for c, rate in ((0, 0.1), (1, 1.0)):
        assert p.epsilons[c] == pytest.approx(pld_replace_one(rate, 1.2, 100), rel=1e-12)
        assert p.epsilons[c] > released_epsilon(((rate, (1.2,)),) * 100, 1e-5)  # add/remove
    assert "replace-one" in p.line()


def test_plan_by_class_and_the_client_epsilon_is_the_largest():
    from driftfl.common.accounting import REPLACE_ONE_NOISE_FLOOR, replace_one_noise_for_epsilon

    settings = condensation_settings({"condense_dp": True, "condense_dp_noise": 1.0,
                                      "condense_batch": 100, "condense_iterations": 50})
    p = privacy_plan(settings, [1000, 0, 50])
    assert p.rates == {0: 0.1, 2: 1.0} and p.noise == {0: 1.0, 2: 1.0}
    assert p.epsilon == p.epsilons[2] > p.epsilons[0]  # the fully sampled class costs most
    target = privacy_plan(condensation_settings({"condense_dp": True, "condense_dp_epsilon": 4.0,
                                                 "condense_batch": 100,
                                                 "condense_iterations": 50}), [1000, 0, 50])
    assert all(3.8 < e <= 4.0 + 1e-6 for e in target.epsilons.values())
    assert pld_replace_one(0.1, target.noise[0] * 0.95, 50) > 4.0  # the smallest, near enough
    assert target.noise[2] > target.noise[0]
    # a target the floor already meets: the floor, and the plan says the smaller epsilon
    assert replace_one_noise_for_epsilon(0.01, 10, 500.0, 1e-5) == REPLACE_ONE_NOISE_FLOOR
    assert privacy_plan(condensation_settings({}), [10, 10]) is None


def test_private_condensation_runs_and_is_seeded():
    """condense() itself uses the generator it is given (DCFLClient gives it one from the OS)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, *SHAPE, generator=gen), torch.arange(3).repeat_interleave(20)
    privacy = privacy_plan(condensation_settings({"condense_dp": True, "condense_dp_noise": 2.0,
                                                  "condense_dp_clip": 1.0, "condense_batch": 10,
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


# -- what a client runs: DCFLClient.condense ------------------------------------------------
IMAGE = (1, 8, 8)
DP = {"condense_dp": True, "condense_dp_noise": 2.0}


def dcfl_client(settings: dict, partition: int = 0) -> DCFLClient:
    """A DCFL client of a 3-class experiment with a small MLP (the job's fields it reads), on
    a node of a fresh run (its own node state)."""
    from flwr.app import Context, RecordDict

    job = SimpleNamespace(
        context=Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}),
        data=SimpleNamespace(partition_id=partition), num_classes=3,
        meta=SimpleNamespace(shape=list(IMAGE), mean=[0.5], std=[0.25]),
        experiment=SimpleNamespace(model=model_settings({"name": "mlp", "hidden": [16]})))
    return DCFLClient(condensation_settings({"condense_iterations": 3, "ipc": 2,
                                             "condense_batch": 10, **settings}), job)


def client_data(seed: int = 0, per_class: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(3 * per_class, *IMAGE, generator=gen),
            torch.arange(3).repeat_interleave(per_class))


def test_dp_condensation_draws_from_the_os_not_the_experiment_seed():
    """The seed a client is given (experiment seed, round, partition) is the server's to know:
    under DP the same data and seed give other images every time, without DP the same."""
    x, y = client_data()

    def twice(settings: dict) -> list[torch.Tensor]:
        return [dcfl_client(settings).condense(x, y, torch.Generator().manual_seed(5))[0]
                for _ in range(2)]

    assert not torch.equal(*twice(DP))
    assert torch.equal(*twice({}))


def test_a_dp_dm_reply_carries_its_epsilon_only(capsys):
    """Not the seconds nor the similarity to the client's images (no DP covers them); the
    client still prints its similarity line."""
    x, y = client_data()
    client = dcfl_client(DP)
    disclosed = client.condense(x, y, torch.Generator())[2]
    assert disclosed == {CONDENSE_EPSILON: privacy_plan(client.settings, [20, 20, 20]).epsilon}
    assert "Pearson correlation" in capsys.readouterr().out
    plain = dcfl_client({}).condense(x, y, torch.Generator())[2]
    assert set(plain) == {CONDENSE_SECONDS, CONDENSED_COPIES, CONDENSED_SIMILARITY}


def test_the_default_clip_comes_from_noise_not_from_a_clients_data(capsys):
    """Null clip: the median embedding norm of N(0, 1) images under fresh networks from a
    public seed, the same for clients of different data, and printed in the plan line."""
    assert condensation_settings({}).condense_dp_clip is None
    from driftfl.dcfl.condense import noise_clip

    expected = noise_clip(lambda: build_model({"name": "mlp", "hidden": [16]}, IMAGE, 3), IMAGE)
    for seed, per_class in ((0, 20), (1, 35)):
        x, y = client_data(seed, per_class)
        client = dcfl_client(DP, partition=seed)
        assert client.privacy(y).clip == expected
        client.condense(3 * x, y, torch.Generator())
        printed = capsys.readouterr().out
        assert f"embeddings clipped to {expected:.4g} (median norm of noise" in printed
    assert dcfl_client({**DP, "condense_dp_clip": 1.5}).privacy(y).clip == 1.5


def embedding_calls(make: callable) -> tuple[list, callable]:
    """A network maker whose features record every batch they embed, with that list."""
    calls = []

    def made() -> DriftModel:
        net = make()
        net.features.register_forward_hook(
            lambda module, args, out: calls.append((module, args[0].detach().clone())))
        return net

    return calls, made


def two_class_run(make: callable) -> None:
    x, y = client_data(per_class=4)
    privacy = PrivacyPlan(clip=1.0, delta=1e-5, iterations=1, rates={0: 1.0, 1: 1.0},
                          noise={0: 1.0, 1: 1.0}, epsilons={0: 1.0, 1: 1.0})
    condense(x[:8], y[:8], 2, CondenseConfig(ipc=1, iterations=1, real_per_class=4),
             make_network=make, augment=None, generator=torch.Generator().manual_seed(0),
             privacy=privacy)


def test_under_dp_each_embedding_is_its_own_images_with_batchnorm():
    """resnet18 has BatchNorm: in train mode an embedding depends on the batch. Every batch DP-DM
    embedded, one image changed: every other image's embedding stays as it was."""
    calls, make = embedding_calls(lambda: build_model({"name": "resnet18"}, IMAGE, 2))
    two_class_run(make)
    assert len(calls) >= 2  # the real and the synthetic batch at least
    for features, batch in list(calls):
        changed = batch.clone()
        changed[0] = 5 * torch.randn(IMAGE, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            before, after = features(batch)[1:], features(changed)[1:]
        assert torch.allclose(before, after, rtol=1e-5, atol=1e-6)


class BatchCentred(nn.Module):
    """Features that couple a batch's images in any mode (each minus the batch mean)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(0, keepdim=True)).flatten(1)


def test_dp_refuses_a_model_that_couples_the_images_of_a_batch():
    with pytest.raises(ConfigError) as caught:
        two_class_run(lambda: DriftModel(BatchCentred(), 64, 2))
    assert "do not depend on the other images" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_server_announces_a_null_clip_as_the_clients_default(capsys):
    from driftfl.dcfl.shipped import announce

    announce(condensation_settings(DP), [("0", [10, 10, 0])])
    printed = capsys.readouterr().out
    assert "clipped to the median norm of noise images" in printed and "replace-one" in printed
    assert "not sent under DP-DM" in printed


def test_a_simulated_client_leaves_its_similarity_line_to_the_audit_after_the_run(
        capsys, monkeypatch):
    """`driftfl run` audits a simulation's shipped sets and prints each client's line once;
    the client's own copy would be the same line twice on the one console."""
    from driftfl.client import node

    x, y = client_data()
    monkeypatch.setattr(node, "in_simulation", lambda: True)
    dcfl_client({}).condense(x, y, torch.Generator())
    printed = capsys.readouterr().out
    assert "condense: client" in printed and "Pearson correlation" not in printed


def test_a_class_too_small_to_condense_is_not_in_the_plan_nor_its_epsilon():
    """condense_min_class (null: ipc): a class below it releases nothing, so it has no rate,
    noise or epsilon, and the client's epsilon is its smallest condensed class's."""
    settings = condensation_settings({"condense_dp": True, "condense_dp_noise": 1.0,
                                      "condense_iterations": 50, "ipc": 10})
    plan = privacy_plan(settings, [500, 4, 0, 600])
    assert sorted(plan.rates) == [0, 3] and plan.epsilon == plan.epsilons[0]
    assert privacy_plan(condensation_settings(
        {**settings.model_dump(), "condense_min_class": 1}), [500, 4, 0, 600]).epsilon \
        > plan.epsilon  # the 4-image class, sampled whole each iteration, would cost the most


def test_real_images_are_shipped_only_in_simulation_and_said_not_private(capsys, monkeypatch):
    """condensation=real (the research ablation): a deployed node refuses to ship its own
    images whatever the server asks; a simulated one ships them, and the run's announcement
    says NOT PRIVATE; a deployed experiment asking for it is refused before it starts."""
    from driftfl.client import node
    from driftfl.common.config import compose
    from driftfl.dcfl.shipped import announce
    from driftfl.methods import check_experiment

    x, y = client_data()
    monkeypatch.setattr(node, "in_simulation", lambda: False)
    with pytest.raises(ConfigError, match=r"condensation=real, which ships this node's own "
                                          r"images .*: refused$"):
        dcfl_client({"condensation": "real"}).condense(x, y, torch.Generator())
    monkeypatch.setattr(node, "in_simulation", lambda: True)
    images, labels, _ = dcfl_client({"condensation": "real"}).condense(x, y, torch.Generator())
    assert all(any(torch.equal(image, own) for own in x[y == label])
               for image, label in zip(images, labels))
    announce(condensation_settings({"condensation": "real"}), [("0", [10, 10, 0])])
    assert "DCFL: NOT PRIVATE: condensation=real is a research ablation" in \
        capsys.readouterr().out
    cfg = compose(["strategy=dcfl", "strategy.condensation=real"])
    check_experiment(cfg)
    with pytest.raises(ConfigError, match="a research ablation for simulation only"):
        check_experiment(cfg.model_copy(update={"superlink": "federation"}))
