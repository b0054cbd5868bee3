"""What a DP run says of itself: each round's update norms and share clipped (exact where the
trusted server saw them, otherwise only what the release covers), and the warning before round 1
when the noise outweighs the clients' updates. Every figure checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from driftfl.common.privacy import PrivacySettings
from driftfl.common.protocol import LOCAL_STEPS, NUM_EXAMPLES
from driftfl.strategies.parts.aggregation import ClientUpdate
from driftfl.strategies.parts.release import (CentralRelease, DistributedRelease, Release,
                                              RoundFacts)

GLOBAL = {"w": np.zeros((50, 40), np.float32), "b": np.zeros(40, np.float32)}  # d = 2040
LENET5 = 44_426  # model=lenet5's float coordinates (docs/privacy.md)


def moved(node: int, norm: float) -> ClientUpdate:
    """A reply whose update has L2 norm ``norm``, all of it on one coordinate."""
    arrays = {k: v.copy() for k, v in GLOBAL.items()}
    arrays["w"][0, 0] = norm
    return ClientUpdate(node, arrays, {NUM_EXAMPLES: 10.0, LOCAL_STEPS: 1.0}, None)


def facts(sent: int) -> RoundFacts:
    return RoundFacts(GLOBAL, list(range(sent)), {}, "", list(range(sent)))


def central(clients: int, rate: float = 1.0, **settings) -> CentralRelease:
    return CentralRelease(PrivacySettings(name="central", **settings), num_clients=clients,
                          per_round=max(1, math.floor(rate * clients)), rate=rate)


def distributed(per_round: int, **settings) -> DistributedRelease:
    return DistributedRelease(PrivacySettings(name="distributed", **settings), num_clients=100,
                              per_round=per_round)


def test_central_reports_the_exact_median_norm_and_share_clipped_only_when_asked():
    replies = [moved(0, 0.5), moved(1, 2.0), moved(2, 3.0)]
    quiet = central(10, clip=1.0, noise_multiplier=0.0)
    quiet.release(1, facts(10), replies)
    assert "dp_median_norm" not in quiet.columns(1)  # exact, not covered: opt-in
    assert "dp_clipped_share" not in quiet.summary()["dp_last_round"]
    release = central(10, clip=1.0, noise_multiplier=0.0, exact_diagnostics=True)
    release.release(1, facts(10), replies)
    row = release.columns(1)
    assert row["dp_median_norm"] == pytest.approx(2.0)
    assert row["dp_clipped_share"] == pytest.approx(2 / 3)  # 2.0 and 3.0 exceed C = 1
    # (0.5 + 1 + 1) / q N = 2.5 / 10 on one coordinate; no noise
    assert row["dp_update_norm"] == pytest.approx(0.25)
    assert row["dp_noise_norm"] == 0.0
    assert release.summary()["dp_last_round"] == {"round": 1, **{
        k: row[k] for k in ("dp_update_norm", "dp_noise_norm", "dp_median_norm",
                            "dp_clipped_share")}}


def test_central_noise_norm_is_sigma_c_sqrt_d_over_qn():
    release = central(20, rate=0.5, clip=1.5, noise_multiplier=2.0)
    release.release(1, facts(10), [moved(0, 0.5)])
    # std per coordinate 2 x 1.5 / (0.5 x 20) = 0.3, over d = 2040: 0.3 sqrt(2040) = 13.55
    assert release.columns(1)["dp_noise_norm"] == pytest.approx(0.3 * math.sqrt(2040))
    assert release.columns(1)["dp_noise_norm"] == pytest.approx(13.5499, abs=1e-4)


def test_distributed_reports_only_what_its_release_covers():
    """Clients clip their own updates: the server never sees a norm before the clip, nor
    whether one was clipped (a client's own flag would be a disclosure)."""
    release = distributed(10, clip=1.0, noise_multiplier=1.0)  # m_min = 8
    release.release(1, facts(10), [moved(n, 0.1) for n in range(10)])
    row = release.columns(1)
    assert "dp_median_norm" not in row and "dp_clipped_share" not in row
    assert row["dp_update_norm"] == pytest.approx(0.1)  # the shares as sent, noise-free here
    # 10 shares of std 1 x 1 / sqrt(8) on their mean: 1 / sqrt(80) per coordinate
    assert row["dp_noise_norm"] == pytest.approx(math.sqrt(2040 / 80))


def test_a_run_whose_noise_outweighs_the_updates_is_warned_with_the_clients_it_needs():
    # central, m = q N = 10: sigma C / m = 0.1 against C / sqrt(44426) = 0.00474;
    # m >= sigma sqrt(d) = 210.8 clients would do
    line = central(10, clip=1.0, noise_multiplier=1.0).swamped(LENET5)
    assert line.startswith("privacy: warning: the noise per coordinate") and "\n" not in line
    assert "sigma C / m = 1 x 1 / 10 = 0.1," in line and "C / sqrt(d) = 0.00474" in line
    assert "m >= 211 clients a round (now 10)" in line
    # distributed, 20 a round, m_min = 16: 1 / sqrt(20 x 16) = 0.0559; the least m with
    # m ceil(0.8 m) >= 44426 is 236 (236 x 189 = 44604; 235 x 188 = 44180)
    line = distributed(20, noise_multiplier=1.0).swamped(LENET5)
    assert "sigma C / sqrt(m m_min) = 1 x 1 / sqrt(20 x 16) = 0.0559" in line
    assert "m >= 236 clients a round (now 20)" in line


def test_no_warning_where_the_noise_is_within_the_spread_update():
    assert central(10, noise_multiplier=1.0).swamped(100) == ""  # 1 / 10 = 1 / sqrt(100)
    assert central(10, noise_multiplier=1.0).swamped(101) != ""
    assert central(10, noise_multiplier=0.0).swamped(LENET5) == ""
    assert Release().swamped(LENET5) == "" and Release(secure=True).swamped(LENET5) == ""


def test_the_release_names_itself_for_the_round_line():
    assert Release().label == "" and Release(secure=True).label == "secagg+"
    assert central(10).label == "DP central"
    assert DistributedRelease(PrivacySettings(name="distributed"), num_clients=10,
                              per_round=10, secure=True).label == "DP distributed, secagg+"
