"""Identity binds partitions, and no client outweighs the rest by claiming (issue 27).

With an owners file (node id -> key, partition, declared examples) the data survey accepts from
a node only its key's partition: a squatter that answers before the owner, a node the file does
not know and a node claiming more than declared are refused. Without declared counts a reply
weighs as at most max_examples_ratio x the survey's median count."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.owners import MAX_EXAMPLES, Owner, read_owners, write_owners
from driftfl.common.protocol import DATASET_META, METRICS, NUM_EXAMPLES
from driftfl.deploy.register import merged, planned_owners
from driftfl.methods import build_strategy, check_experiment
from driftfl.server.roster import Roster
from driftfl.server.survey import survey_clients
from driftfl.strategies import FedAvg
from test_deploy import _driftfl, _one_line_error
from test_reply_checks import (META, ScriptedGrid, metadata, summary_reply, surveyed,
                               train_reply)
from test_roster import CLIENTS, ChangingGrid

OWNERS = {11: Owner("node-0.key.pub", 0), 12: Owner("node-1.key.pub", 1),
          13: Owner("node-2.key.pub", 2, num_examples=5), 14: Owner("lab.key.pub", -1)}


@pytest.fixture(autouse=True)
def _task(server_task):  # the survey creates messages
    yield


def survey(replies, owners=None):
    return survey_clients(ScriptedGrid(replies), ConfigRecord({DATASET_META: META}),
                          len(replies), node_wait=5, timeout=5, owners=owners)


def admitted(clients):
    return [(c["node_id"], c["partition_id"]) for c in clients]


def test_with_owners_a_node_gets_only_its_keys_partition_even_before_the_owner(caplog):
    replies = [summary_reply(13, 0, 5, [2, 3, 0]),  # the squatter answers first, with n = 5
               summary_reply(11, 0, 5, [2, 3, 0]),  # partition 0's owner
               summary_reply(99, 1, 5, [5, 0, 0]),  # a node the owners file does not know
               summary_reply(12, 1, 4, [4, 0, 0]),
               summary_reply(14, -1, 3, [1, 1, 1])]  # own data, as its entry says
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert admitted(survey(replies, OWNERS)) == [(14, -1), (11, 0), (12, 1)]
    assert "node 13 refused: claims partition 0; the owners file gives its key " \
           "node-2.key.pub partition 2" in caplog.text
    assert "node 99 refused: claims partition 1, but its node id has no entry in the " \
           "owners file" in caplog.text
    # without an owners file the first claimant keeps it: the squatter wins (README says so)
    assert admitted(survey(replies)) == [(14, -1), (13, 0), (99, 1)]


def test_a_claim_over_the_declared_count_or_a_sane_bound_is_refused(caplog):
    owners = [summary_reply(11, 0, 5, [5, 0, 0]), summary_reply(12, 1, 4, [4, 0, 0])]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert admitted(survey([*owners, summary_reply(13, 2, 6, [6, 0, 0])], OWNERS)) == [
            (11, 0), (12, 1)]
    assert "claims 6 examples; the owners file declares 5 for its key node-2.key.pub" \
           in caplog.text
    assert admitted(survey([*owners, summary_reply(13, 2, 5, [5, 0, 0])], OWNERS)) == [
        (11, 0), (12, 1), (13, 2)]
    # the probe's 1e15 and 1e18, accepted before; the bound itself still is
    clients = survey([summary_reply(21, 0, 10**15, [10**15, 0, 0]),
                      summary_reply(22, 1, 10**18, [0, 10**18, 0]),
                      summary_reply(23, 2, MAX_EXAMPLES, [0, 0, MAX_EXAMPLES])])
    assert admitted(clients) == [(23, 2)]


def test_with_owners_a_newcomer_cannot_take_a_lost_clients_partition():
    """Without owners a node that connects later takes a lost client's partition (a restarted
    SuperNode without a key); with owners only the key's own node id holds it."""
    owners = {10 + p: Owner(f"node-{p}.key.pub", p) for p in range(3)}
    grid = ChangingGrid([10, 11, 99], [summary_reply(99, 2, 5, [1, 1, 3])])
    roster = Roster(grid, ConfigRecord({DATASET_META: META}), CLIENTS, num_partitions=3,
                    min_clients=1, rejoin_wait=0.0, timeout=5, poll=0.01, owners=owners,
                    on_change=lambda clients, moved: pytest.fail("nobody may rejoin"))
    assert roster.nodes(3, lost=[12]) == [10, 11] and grid.asked == [99]


def test_a_claimed_count_weighs_at_most_max_examples_ratio_times_the_median(caplog):
    """Nine honest clients of 100 examples and a liar that claimed 1e6 in the survey (nothing
    declared), its reply matching: its share of FedAvg's mean is 10 / (10 + K - 1) with K = 10
    clients, 52.6 %, where uncapped it was 99.9 %."""
    clients = [{"node_id": n, "partition_id": n, "num_examples": 100} for n in range(1, 10)]
    clients.append({"node_id": 10, "partition_id": 10, "num_examples": 10**6})
    shares = {}
    for ratio in (10.0, float("inf")):
        strategy = surveyed(FedAvg(max_examples_ratio=ratio), clients)
        replies = [train_reply(n, [2.0, 2.0], n=100) for n in range(1, 10)]
        with caplog.at_level(logging.WARNING, logger="flwr"):
            arrays, metrics = strategy.aggregate_train(
                1, [*replies, train_reply(10, [3.0, 3.0], n=10**6)])
        shares[ratio] = float(arrays["w"].numpy()[0]) - 2.0  # honest 2, liar 3: its weight
    assert shares[10.0] == pytest.approx(10 / 19, abs=1e-6)  # 0.526
    assert shares[float("inf")] == pytest.approx(10**6 / (10**6 + 900), abs=1e-6)
    assert "partition 10 (node 10) weighs as 1000 examples, not its 1000000" in caplog.text
    # the mean of the evaluation replies too: nine at accuracy 0, the liar's 1
    strategy = surveyed(FedAvg(max_examples_ratio=10.0), clients)
    metrics = strategy.aggregate_evaluate(1, [
        Message(metadata=metadata(n, "evaluate"), content=RecordDict({METRICS: MetricRecord(
            {NUM_EXAMPLES: 10**6 if n == 10 else 100, "local-accuracy": float(n == 10)})}))
        for n in range(1, 11)])
    assert metrics["local-accuracy"] == pytest.approx(10 / 19)


def test_the_cap_holds_with_two_nodes_where_a_median_would_be_their_mean(caplog):
    """Two nodes (the deployment guide's layout, counts not declared), one claiming 1e8: the
    median of two counts was their mean, so the liar kept 99.999 % of the weight; the lower
    median caps it at r x the honest count, r / (r + 1) of the mean (90.9 % at r = 10)."""
    clients = [{"node_id": 1, "partition_id": 0, "num_examples": 100},
               {"node_id": 2, "partition_id": 1, "num_examples": MAX_EXAMPLES}]
    strategy = surveyed(FedAvg(max_examples_ratio=10.0), clients)
    assert strategy.guard.weight_cap() == 1000
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = strategy.aggregate_train(1, [train_reply(1, [2.0, 2.0], n=100),
                                                 train_reply(2, [3.0, 3.0], n=MAX_EXAMPLES)])
    share = float(arrays["w"].numpy()[0]) - 2.0  # honest 2, liar 3: the liar's weight
    assert share == pytest.approx(10 / 11, abs=1e-6) and share <= 10 / 11 + 1e-6
    assert "weighs as 1000 examples, not its 100000000" in caplog.text


def test_a_run_with_undeclared_counts_says_what_a_liar_gets(tmp_path, caplog):
    from driftfl.server.federation import DeployedFederation

    path = tmp_path / "owners.json"
    write_owners(path, {11: Owner("node-0.key.pub", 0), 12: Owner("node-1.key.pub", 1, 600)})
    for owners, which in ([f"owners={path}"], "the owners file declares none for 1 of its 2 "
                                              "keys"), ([], "there is no owners file"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            DeployedFederation(ScriptedGrid([]), compose([*owners, "num_clients=2"]))
        assert (f"example counts are not declared ({which}): a node may claim more examples "
                "than it holds and then weighs as max_examples_ratio=10 x the survey's lower "
                "median count, 90.9% of every weighted mean among 2 nodes of equal size; "
                "declare each node's count with `driftfl secure register --examples KEY=N`"
                ) in caplog.text
    write_owners(path, {11: Owner("node-0.key.pub", 0, 600), 12: Owner("node-1.key.pub", 1, 6)})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        DeployedFederation(ScriptedGrid([]), compose([f"owners={path}", "num_clients=2"]))
    assert "example counts are not declared" not in caplog.text


def test_the_cap_is_deployments_only_and_an_honest_federation_never_meets_it():
    for method in ("fedavg", "fedprox"):  # DriftStrategy's own, and one of Flower's first
        cfg = check_experiment(compose([f"strategy={method}"]))
        assert build_strategy(cfg, torch.nn.Linear(2, 2)).max_examples_ratio == float("inf")
        assert build_strategy(cfg, torch.nn.Linear(2, 2),
                              claims_counts=True).max_examples_ratio == 10
    # clients of ordinary, unequal sizes: the weights are n_k / sum n, untouched
    strategy = surveyed(FedAvg(max_examples_ratio=10.0), [
        {"node_id": n, "partition_id": n, "num_examples": 50 * n} for n in (1, 2, 3)])
    arrays, _ = strategy.aggregate_train(1, [train_reply(n, [float(n)] * 2, n=50 * n)
                                             for n in (1, 2, 3)])
    assert np.allclose(arrays["w"].numpy(), (1 * 1 + 2 * 2 + 3 * 3) / 6)


def test_owners_files_that_cannot_be_used_get_one_line_before_anything_runs(tmp_path):
    path = tmp_path / "owners.json"
    cases = [
        (None, "does not exist; `driftfl secure register` writes it"),
        ("{", "cannot be read as JSON"),
        ("[]", "is not a JSON object of node id -> key and partition"),
        ('{"x1": {"key": "a", "partition": 0}}', "node 'x1': is not a node id"),
        ('{"5": {"key": "a"}}', 'node 5: expected {"key": "<file>.key.pub", "partition"'),
        ('{"5": {"key": "a", "partition": 0, "owner": 1}}', "unknown field(s) owner"),
        ('{"5": {"key": "a", "partition": 3}}', "'partition' is 3; expected -1 (own data) or "
                                                "0..2 (num_clients)"),
        ('{"5": {"key": "a", "partition": 0, "num-examples": 1000000000000000}}',
         "'num-examples' is 1000000000000000; expected a count from 1 to 1e+08"),
        ('{"5": {"key": "a", "partition": 0}, "6": {"key": "b", "partition": 0}}',
         "partition 0 is given to both node 5 (a) and node 6 (b); give each partition to one "
         "key"),
        ('{"5": {"key": "a", "partition": 0}, "6": {"key": "a", "partition": 1}}',
         "key a is given to both node 5 (a) and node 6 (a)"),
    ]
    for text, says in cases:
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError) as refused:
            read_owners(path, 3)
        assert says in str(refused.value) and "\n" not in str(refused.value), text
    # a simulation assigns partitions itself: owners= there is a mistake, said at once
    from flwr.superlink.grid import InMemoryGrid

    from driftfl.server.federation import DeployedFederation, Federation

    with pytest.raises(ConfigError, match="owners= binds deployed nodes to partitions"):
        Federation.of(InMemoryGrid.__new__(InMemoryGrid), compose([f"owners={path}"]))
    write_owners(path, OWNERS)
    assert DeployedFederation(ScriptedGrid([]), compose([f"owners={path}"])).owners == OWNERS


@pytest.mark.parametrize("text, says", [
    # one node id in two spellings: json would keep the last silently, int() would merge them
    ('{"5": {"key": "a", "partition": 0}, "5": {"key": "b", "partition": 1}}',
     "cannot be read as JSON ('5' is given twice in one object)"),
    ('{"5": {"key": "a", "partition": 0, "partition": 1}}',
     "cannot be read as JSON ('partition' is given twice in one object)"),
    ('{"0111": {"key": "a", "partition": 0}, "111": {"key": "b", "partition": 1}}',
     "node '0111': is not a node id (a positive integer in ASCII digits without leading zeros"),
    ('{"\u0661\u0661\u0661": {"key": "a", "partition": 0}}',  # Arabic-Indic 111
     "node '\\u0661\\u0661\\u0661': is not a node id"),
    ('{"111": {"key": "a", "partition": 0}, "\uff11\uff11\uff11": {"key": "b", "partition": 1}}',
     "node '\\uff11\\uff11\\uff11': is not a node id"),  # fullwidth digits
    ('{"18446744073709551616": {"key": "a", "partition": 0}}', "is not a node id"),  # 2**64
    ('{"5": {"key": "a\\nb.key.pub", "partition": 0}}',
     "node 5: 'key' must be the key's file name (ASCII letters, digits and ._+-"),
    ('{"5": {"key": "../a.key.pub", "partition": 0}}', "'key' must be the key's file name"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than an owners file (an object of objects)"),
    ('{"5": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001,
     "nests deeper than an owners file"),
    (b'{"5": {"key": "\xe9", "partition": 0}}', "cannot be read as JSON ('utf-8' codec"),
    (" " * (4 * 2**20 + 1), "is over 4 MiB, more than any owners file holds"),
])
def test_owners_files_with_ambiguous_ids_or_out_of_bounds_get_one_line(tmp_path, text, says):
    path = tmp_path / "owners.json"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    with pytest.raises(ConfigError) as refused:
        read_owners(path, 3)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_an_owners_file_is_read_only_from_a_regular_file_and_at_once(tmp_path):
    """/dev/zero was read without end; a FIFO would wait for a writer."""
    os.mkfifo(tmp_path / "fifo")
    for path in (Path("/dev/zero"), tmp_path / "fifo"):
        with pytest.raises(ConfigError, match="is not a regular file; give the owners.json"):
            read_owners(path)
    with pytest.raises(ConfigError, match=r"cannot be read \(Is a directory\)"):
        read_owners(tmp_path)


def test_owners_file_refusals_reach_the_command_line_as_one_line(tmp_path):
    from driftfl.deploy.credentials import make_credentials

    make_credentials(tmp_path / "keys", [], nodes=1)
    owners = tmp_path / "keys" / "owners.json"
    owners.write_text('{"5": {"key": "a", "partition": 0}, "5": {"key": "b", "partition": 1}}')
    _one_line_error(_driftfl("secure", "register", "no-such-connection",
                             str(tmp_path / "keys" / "node-0.key.pub")),
                    "'5' is given twice in one object")


def test_register_refuses_ambiguous_numbers_and_key_names(tmp_path):
    keys = [tmp_path / "node-0.key.pub", tmp_path / "lab.key.pub"]
    for partitions, examples, says in [
            (["lab.key.pub=01"], [], "--partition lab.key.pub=01: expected a partition id"),
            (["lab.key.pub=\u0661"], [], "expected a partition id"),  # Arabic-Indic 1
            (["lab.key.pub=1"], ["lab.key.pub=\uff15"], "--examples lab.key.pub=\uff15: "
                                                        "expected a positive count")]:
        with pytest.raises(ConfigError, match=says):
            planned_owners(keys, partitions, examples)
    # node-01 is not the name `driftfl secure init` gives node 1: its partition must be said
    with pytest.raises(ConfigError, match="which partition does node-01.key.pub hold"):
        planned_owners([tmp_path / "node-01.key.pub"], [], [])
    with pytest.raises(ConfigError, match=r"key file 'lab\\nb.key.pub': the owners file "
                                          "records a key by a name of ASCII letters"):
        planned_owners([tmp_path / "lab\nb.key.pub"], ["lab\nb.key.pub=1"], [])


def test_register_plans_each_keys_partition_and_refuses_what_it_cannot_place(tmp_path):
    keys = [tmp_path / "node-0.key.pub", tmp_path / "node-3.key.pub", tmp_path / "lab.key.pub"]
    planned = planned_owners(keys, ["lab.key.pub=own", "node-3.key.pub=1"],
                             ["node-0.key.pub=600"])
    assert planned == {"node-0.key.pub": Owner("node-0.key.pub", 0, 600),
                       "node-3.key.pub": Owner("node-3.key.pub", 1),
                       "lab.key.pub": Owner("lab.key.pub", -1)}
    for partitions, examples, says in [
            ([], [], "which partition does lab.key.pub hold? say --partition lab.key.pub=P"),
            (["lab.key.pub=1", "node-9.key.pub=2"], [], "--partition node-9.key.pub=2: "
                                                        "node-9.key.pub is not among the keys"),
            (["lab.key.pub=x"], [], "--partition lab.key.pub=x: expected a partition id"),
            (["lab.key.pub=2"], ["lab.key.pub=0"], "--examples lab.key.pub=0: expected a "
                                                   "positive count")]:
        with pytest.raises(ConfigError, match=says.replace("?", r"\?")):
            planned_owners(keys, partitions, examples)
    # a key registered again replaces its old entry; a partition taken by another key is not
    old = {7: Owner("node-0.key.pub", 0), 8: Owner("node-1.key.pub", 1)}
    assert merged(old, {9: Owner("node-0.key.pub", 0)}) == {8: old[8],
                                                            9: Owner("node-0.key.pub", 0)}
    with pytest.raises(ConfigError, match="partition 1 is given to both node 8"):
        merged(old, {9: Owner("node-5.key.pub", 1)})


def test_register_says_what_is_wrong_in_one_line_before_calling_flower(tmp_path):
    from driftfl.deploy.credentials import make_credentials

    make_credentials(tmp_path / "keys", [], nodes=2)
    key = str(tmp_path / "keys" / "node-0.key.pub")
    _one_line_error(_driftfl("secure", "register", "no-such-connection", key,
                             "--partition", "node-1.key.pub=1"),
                    "--partition node-1.key.pub=1: node-1.key.pub is not among the keys")
    # a partition another key holds in the owners file already, or two keys one partition
    owners = tmp_path / "keys" / "owners.json"
    owners.write_text(json.dumps({"5": {"key": "node-1.key.pub", "partition": 0}}))
    _one_line_error(_driftfl("secure", "register", "no-such-connection", key),
                    f"node-0.key.pub would hold partition 0, which node-1.key.pub (node 5) in "
                    f"{owners} holds; give it another with --partition node-0.key.pub=P")
    owners.unlink()
    _one_line_error(_driftfl("secure", "register", "no-such-connection", key,
                             key.replace("node-0", "node-1"), "--partition",
                             "node-1.key.pub=0"),
                    "node-1.key.pub would hold partition 0, which node-0.key.pub holds")
    assert not owners.exists()


def test_an_own_data_node_registered_for_a_partition_is_told_the_fix(caplog):
    """A node reading files of its own (driftfl split) whose key was registered for a partition
    is refused with the command that registers it for its own data."""
    replies = [summary_reply(11, 0, 5, [2, 3, 0]), summary_reply(13, -1, 5, [2, 3, 0])]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert admitted(survey(replies, OWNERS)) == [(11, 0)]
    assert ("node 13 refused: claims its own data; the owners file gives its key node-2.key.pub "
            "partition 2: if the node holds that, register its key again with `driftfl secure "
            "register --partition node-2.key.pub=own`") in caplog.text
