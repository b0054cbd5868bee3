"""One reply inside the bounds cannot outsize its peers, and a strategy's state is replaced only
by a finite state that moved within the bound (driftfl/strategies/parts/guard.py)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from driftfl.strategies import FedAvg
from driftfl.strategies.parts.aggregation import Aggregation
from driftfl.strategies.parts.aggregation import model_norm as norm
from driftfl.strategies.parts.guard import (lower_median, peer_bar, peer_outliers,
                                            state_problem)
from driftfl.strategies.parts.robust import (KrumAggregation, MedianAggregation,
                                             TrimmedMeanAggregation)
from test_reply_checks import train_reply

GLOBAL = {"w": np.array([1.0, 1.0], np.float32)}


def test_the_lower_median_is_the_smaller_middle_value():
    assert lower_median([3.0]) == 3.0
    assert lower_median([5.0, 1.0]) == 1.0  # two replies: the smaller one sets the bound
    assert lower_median([4.0, 1.0, 9.0]) == 4.0
    assert lower_median([4.0, 1.0, 9.0, 2.0]) == 2.0


def test_a_norm_over_ratio_times_the_lower_median_is_an_outlier():
    assert peer_outliers([1.0, 2.0, 20.0, 20.01], 10.0) == ([3], 20.0)
    assert peer_outliers([float("nan"), 1.0, 2.0, 3.0], 10.0) == ([0], 20.0)
    assert peer_outliers([], 10.0)[0] == []


def test_fewer_than_three_nonzero_norms_set_no_bar():
    """With two, the smaller would be the bar: a client sending a payload of 1e-6 x its peer's
    would get its one peer rejected (issue 52)."""
    assert peer_bar([1e-6, 1.0]) == math.inf and peer_bar([0.0, 1e-6, 1.0]) == math.inf
    assert peer_outliers([1e-6, 1.0], 30.0) == ([], math.inf)
    assert peer_outliers([float("nan"), 1.0], 10.0)[0] == [0]  # not finite: no bar needed
    assert peer_bar([1e-6, 1.0, 1.1]) == 1.0  # three: one client cannot be the lower median


def test_a_state_is_refused_when_it_goes_non_finite_or_moves_over_the_bound():
    old = {"c": np.array([3.0, 4.0])}  # norm 5: may move by 10 * 5 = 50
    assert state_problem({"c": np.array([3.0, 53.0])}, old, 10.0) is None
    assert "over the bound 50" in state_problem({"c": np.array([3.0, 54.1])}, old, 10.0)
    assert "NaN" in state_problem({"c": np.array([np.nan, 4.0])}, old, 10.0)
    # no state yet: it may move from zero by 10 x max(1, 0)
    assert state_problem({"c": np.array([6.0, 8.0])}, None, 10.0) is None
    assert state_problem({"c": np.array([6.0, 8.1])}, None, 10.0) is not None
    assert norm({"c": np.array([3.0, 4.0]), "n": np.array([7])}) == 5.0  # floats only


def test_a_reply_ten_times_the_median_update_is_rejected_and_never_aggregated(caplog):
    strategy = FedAvg(max_peer_ratio=10.0)
    strategy.global_arrays = GLOBAL
    strategy.trained = [1, 2, 3]
    replies = [train_reply(1, [1.1, 1.0], 5), train_reply(2, [1.0, 1.2], 5),
               train_reply(3, [1.0, 1.0 + 2.01], 5)]  # 0.1, 0.2 and 2.01: over 10 x 0.2
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = strategy.aggregate_train(1, replies)
    assert strategy.report.clients == 2 and strategy.report.rejected_partitions == ["node3"]
    assert "over max_peer_ratio=10 x the round's median 0.2" in strategy.report.rejected[0]
    np.testing.assert_allclose(arrays["w"].numpy(), [1.05, 1.1], rtol=1e-6)
    assert "round reply from node 3 rejected" in caplog.text


def test_a_reply_only_a_peer_bar_rejects_is_never_excluded(server_task):
    """Exclusion needs evidence of the reply alone: node 3's update outsizes its peers' every
    round, is rejected every round, and keeps no strike (guard.count_offences)."""
    strategy = FedAvg(max_peer_ratio=10.0, exclude_after=2)
    strategy.global_arrays = GLOBAL
    for server_round in (1, 2, 3):
        strategy.trained = [1, 2, 3]
        strategy.aggregate_train(server_round, [
            train_reply(1, [1.1, 1.0], 5), train_reply(2, [1.0, 1.2], 5),
            train_reply(3, [1.0, 1.0 + 2.01], 5)])
        assert strategy.report.rejected_partitions == ["node3"]
        assert strategy.report.outsized == [3] and strategy.report.offenders == []
    assert strategy.guard.strikes == {} and strategy.clients.excluded == []


@pytest.mark.parametrize("compares", [True, False])
def test_under_dp_a_rejected_reply_strikes_nobody(compares, server_task):
    """A release that may not compare clients (DP) excludes nobody: whether a round struck a
    client would depend on how many other replies it rejected (guard.count_offences)."""
    strategy = FedAvg(exclude_after=1)
    strategy.release.compares_clients = compares  # PrivateRelease's is False
    strategy.global_arrays = GLOBAL
    strategy.trained = [1, 2, 3]
    strategy.aggregate_train(1, [train_reply(1, [1.1, 1.0], 5), train_reply(2, [1.0, 1.2], 5),
                                 train_reply(3, [1.0, float("nan")], 5)])
    assert strategy.report.offenders == [3]  # a check of the reply alone rejected it
    assert strategy.clients.excluded == (["node3"] if compares else [])


def test_refused_state_is_logged_and_recorded(caplog):
    strategy = FedAvg()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.guard.refuse_state(strategy.report, 3, "SCAFFOLD's c",
                                    "it would move by 9, over the bound 1")
    assert strategy.report.refused_state == ["SCAFFOLD's c: it would move by 9, over the "
                                             "bound 1"]
    assert "round 3: the update of SCAFFOLD's c refused" in caplog.text


PAYLOADS = [{"p": np.array([1.0, 0.0])}, {"p": np.array([2.0, 10.0])},
            {"p": np.array([3.0, 1.0])}, {"p": np.array([100.0, 2.0])},
            {"p": np.array([4.0, 3.0])}]


@pytest.mark.parametrize("rule, expected", [
    (Aggregation(), [22.0, 3.2]),  # the plain weighted mean, by the weights given
    (MedianAggregation(), [3.0, 2.0]),
    (TrimmedMeanAggregation(beta=0.2), [3.0, 2.0]),  # 1 cut at each end of 5
])
def test_robust_rules_combine_a_methods_payloads_as_they_treat_models(rule, expected):
    np.testing.assert_allclose(rule.combine(PAYLOADS, np.ones(5))["p"], expected)


def test_krum_combines_the_payloads_of_the_replies_it_kept_for_the_model():
    rule = KrumAggregation(num_malicious=1, num_selected=2)
    rule.kept = [0, 2]
    np.testing.assert_allclose(rule.combine(PAYLOADS, np.array([1.0, 1, 3, 1, 1]))["p"],
                               [2.5, 0.75])
