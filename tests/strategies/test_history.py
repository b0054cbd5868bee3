"""trust=none bounds a client's influence summed over the rounds (history.py), not only each
round's: hand-checked cases."""

from __future__ import annotations

import numpy as np

from driftfl.strategies.parts.aggregation import Aggregation
from driftfl.strategies.parts.bounded import BoundedAggregation, centred_clip
from driftfl.strategies.parts.history import History

HONEST_AND_ONE = [1, 2, 3, 4, 5]  # nodes; 5 pushes +1 every round


def round_values(t: int) -> list[float]:
    """Four honest clients whose deviations change sign from round to round (2: the one that
    sits at the centre) and one that sends +1, inside the round's bound, every round."""
    s = 1.0 if t % 2 == 0 else -1.0
    return [s, -s, 0.0, 0.5 * s, 1.0]


def test_a_client_pushing_the_same_way_every_round_is_held_to_its_first_rounds_push():
    """Round 1: sums (1, -1, 0, 0.5, 1), median 0.5, distances (.5, 1.5, .5, 0, .5): tau_D 0.5,
    node 2 cut to 0. Round 2: sums (0, 1, 0, 0, 2), median 0, tau_D = 1: node 5's sum cut to 1,
    so it adds 1 - 1 = 0; and so on every round: over 20 rounds it has added 1 in all, where
    one round's bound alone let it add 20. The honest clients near the middle are used exactly
    as sent every round."""
    history = History(lambda vectors: centred_clip(vectors, 1.0))
    total = np.zeros(5)
    for t in range(20):
        out, factors = history.bound("w", HONEST_AND_ONE,
                                     [{"w": np.array([v])} for v in round_values(t)],
                                     {"w": np.zeros(1)})
        used = [float(v["w"][0]) for v in out]
        total += used
        assert [used[0], used[2], used[3]] == [round_values(t)[0], 0.0, round_values(t)[3]]
        if t > 0:
            assert used[4] == 0.0 and factors[4] < 1.0
    assert total.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]  # node 2 lost its first round's cut


def test_the_bounded_mean_moves_by_the_pushers_weight_once_not_every_round():
    """The same clients through BoundedAggregation.combine (SCAFFOLD's Delta c_k): the sum of
    the 20 rounds' means is 1.2, where the per-round bound alone gives 0.2 x 20 = 4 more."""
    rule = BoundedAggregation(Aggregation(), clip_ratio=1.0)
    means = []
    for t in range(20):
        rule.nodes = HONEST_AND_ONE  # as bound_updates leaves them
        means.append(float(rule.combine([{"w": np.array([v])} for v in round_values(t)],
                                        np.ones(5))["w"][0]))
    assert means[:2] == [0.5, -0.1] and set(np.round(means[5:], 12)) == {0.1, -0.1}
    assert sum(means) < 1.21


def test_histories_are_kept_per_client_and_per_payload():
    rule = BoundedAggregation(Aggregation(), clip_ratio=1.0)
    rule.nodes = [7, 8, 9]
    rule.combine([{"a": np.ones(1)}, {"a": np.zeros(1)}, {"a": np.zeros(1)}], np.ones(3))
    rule.combine([{"b": np.ones(1)}, {"b": np.zeros(1)}, {"b": np.zeros(1)}], np.ones(3),
                 among=[0, 1, 2])
    assert set(rule.history.sums) == {"payload:a", "payload:b"}
    assert set(rule.history.sums["payload:a"]) == {7, 8, 9}
    rule.history.rekey({7: 70})
    assert set(rule.history.sums["payload:b"]) == {70, 8, 9}


def test_payloads_of_unknown_replies_are_bounded_in_their_round_only():
    """combine before any bound replies (FedCSD's prototype phase: ``standalone``) keeps no
    history: the replies' clients are not known."""
    rule = BoundedAggregation(Aggregation(), clip_ratio=1.0)
    five = [{"w": np.array([v])} for v in (1.0, 2.0, 3.0, 4.0, 100.0)]
    assert float(rule.combine(five, np.ones(5))["w"][0]) == 3.0 and not rule.history.sums
    rule.nodes = HONEST_AND_ONE
    standalone = rule.standalone()
    assert isinstance(standalone, BoundedAggregation) and not standalone.nodes
