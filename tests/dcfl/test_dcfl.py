"""DCFL and FedDisco: the server's arithmetic on hand-checked cases, and DCFL's rounds through
the real ClientApp handlers (in process)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from driftfl.dcfl.settings import condensation_settings, privacy_plan
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.models import build_model
from driftfl.common.protocol import (CONDENSED, DATASET_META, EXPERIMENT, LOCAL_STEPS,
                                     NUM_EXAMPLES, PROXIMAL_MU, model_to_arrays)
from driftfl.methods import build_strategy, check_experiment
from driftfl.server.survey import survey_clients
from driftfl.server.experiment import prepare_experiment
from driftfl.strategies.parts.aggregation import to_numpy, to_record
from driftfl.dcfl.cka import (cka_input, cka_matrix, complementary_group, exploit_probabilities,
                              keep_lowest_loss, linear_cka, select_clients, selection_tv)
from driftfl.dcfl.strategy import check_condensed
from driftfl.strategies.parts.feddisco import discrepancy, disco_weights
from test_methods import InProcessGrid, fmnist_nodes


# -- CKA ----------------------------------------------------------------------------------
def test_cka_is_one_for_alike_matrices_symmetric_and_matches_a_hand_computed_value():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(10, 6))
    assert linear_cka(w, w) == pytest.approx(1.0)
    assert linear_cka(w, 3.5 * w) == pytest.approx(1.0)  # scale
    assert linear_cka(w, w + rng.normal(size=(1, 6))) == pytest.approx(1.0)  # rows re-centred
    v = rng.normal(size=(10, 4))
    assert linear_cka(w, v) == pytest.approx(linear_cka(v, w))
    assert 0 <= linear_cka(w, v) < 1
    # by hand: centred Grams K_X = [[5,-4,-1],[-4,5,-1],[-1,-1,2]]/9 and
    # K_Y = [[5,-1,-4],[-1,2,-1],[-4,-1,5]]/9: <K_X, K_Y> / (|K_X| |K_Y|) = 63 / 90
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    y = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    assert linear_cka(x, y) == pytest.approx(0.7)
    matrix = cka_matrix([x, y, x])
    assert np.allclose(matrix, matrix.T) and np.allclose(np.diag(matrix), 1.0)
    assert matrix[0, 2] == pytest.approx(1.0) and matrix[0, 1] == pytest.approx(0.7)


def one_class_update(classes, d=30, scale=0.1):
    """A head update (rows = classes) that moves only the given class rows, all along one
    direction v: what a client holding only those classes mostly does to the classifier."""
    v = np.random.default_rng(7).normal(size=d)
    return scale * np.outer(classes, v)


def test_cka_of_updates_tells_apart_what_the_weights_cannot():
    """Rank-one updates a v^T share v, so CKA = cos^2 of the centred class vectors a, b. Two
    clients that each moved a single, different class (of n = 10): a~ = e_0 - 1/n, b~ =
    e_1 - 1/n, <a~, b~> = -1/n, |a~|^2 = |b~|^2 = (n - 1)/n: CKA = 1/(n - 1)^2 = 1/81. From one
    common start W_0 their weights W_0 + update still score near 1: W_0 is in both."""
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(10, 30))
    a, b = one_class_update(np.eye(10)[0]), one_class_update(np.eye(10)[1])
    ua, ub = cka_input(w0 + a, w0, "update"), cka_input(w0 + b, w0, "update")
    assert np.allclose(ua, a) and linear_cka(ua, ua) == pytest.approx(1.0)  # identical: 1
    assert linear_cka(ua, cka_input(w0 + 2 * a, w0, "update")) == pytest.approx(1.0)
    assert linear_cka(ua, ub) == pytest.approx(1 / 81)  # unrelated: near 0
    weights = [cka_input(w0 + u, w0, "weights") for u in (a, b)]
    assert np.array_equal(weights[0], w0 + a)
    assert linear_cka(*weights) > 0.99  # the old reading: the common start dominates
    # independent dense random 10 x 30 matrices already score high with rows = classes (the
    # issue's 0.90-0.98 for d = 84-512): the update reading does not change that baseline,
    # it removes the common start; the probe's updates span 0.0-0.97 (docs/algorithms.md)
    baseline = np.mean([linear_cka(rng.normal(size=(10, 30)), rng.normal(size=(10, 30)))
                        for _ in range(20)])
    assert 0.6 < baseline < 0.9
    with pytest.raises(ValueError, match="unknown CKA input 'bias'; valid: update, weights"):
        cka_input(w0, w0, "bias")
    with pytest.raises(ValueError, match="needs the classifier the client was sent"):
        cka_input(w0, None, "update")


def test_eq_4_on_three_clients_by_hand():
    """4 classes; client a moved class 0, b class 1, c classes 0 and 1 (rank-one updates along
    one v). Centred: a~ = (3,-1,-1,-1)/4, b~ = (-1,3,-1,-1)/4, c~ = (1,1,-1,-1)/2; CKA =
    cos^2: M_ab = (1/4)^2/(3/4)^2 = 1/9, M_ac = M_bc = (1/2)^2/(3/4) = 1/3. Eq. 4: row sums
    4/9, 4/9, 6/9 of 14/9: p = (2/7, 2/7, 3/7), TV from uniform (1/2)(1/21 + 1/21 + 2/21)
    = 2/21. Under the weights reading (a common W_0) Eq. 4 is close to uniform."""
    updates = [one_class_update(np.array(c, float)) for c in
               ([1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0])]
    matrix = cka_matrix(updates)
    assert np.allclose(matrix, [[1, 1 / 9, 1 / 3], [1 / 9, 1, 1 / 3], [1 / 3, 1 / 3, 1]])
    assert np.allclose(exploit_probabilities(matrix), [2 / 7, 2 / 7, 3 / 7])
    assert selection_tv(matrix) == pytest.approx(2 / 21)
    assert selection_tv(np.ones((3, 3))) == 0 and selection_tv(np.zeros((0, 0))) == 0
    w0 = np.random.default_rng(1).normal(size=(4, 30))
    assert selection_tv(cka_matrix([w0 + u for u in updates])) < 0.01


@pytest.mark.parametrize("cka_of", ["update", "weights"])
def test_dcfl_explore_uses_the_reading_its_setting_names_and_reports_it(cka_of):
    """strategy.cka_of=update (the default) measures each classifier against the head it was
    sent; weights (the reading before issue #28) the classifier itself. The row reports the
    off-diagonal range and Eq. 4's distance from uniform."""
    overrides = ["strategy=dcfl", "model=mlp"] + ([] if cka_of == "update"
                                                  else ["strategy.cka_of=weights"])
    cfg = check_experiment(compose(overrides))
    strategy = build_strategy(cfg, build_model(cfg.model, (1, 28, 28), 10), None)
    assert strategy.cka_of == cka_of
    w0 = np.random.default_rng(2).normal(size=(10, 200))
    strategy.global_arrays = {"head.weight": w0}
    images, labels = np.zeros((1, 1, 28, 28), np.float32), np.zeros(1, np.int64)
    row = strategy.server_metrics(None)
    assert "selection_tv" not in row  # no pair yet
    for node, classes in enumerate(([1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0])):
        update = one_class_update(np.array(classes + [0] * 6, float), d=200)
        strategy.explore(node, (w0 + update).astype(np.float32), images, labels, {})
    row = strategy.server_metrics(None)
    if cka_of == "update":  # as by hand for n = 10: M_ab = 1/81, M_ac = M_bc = 4/9 * 10/8
        a, c = np.eye(10)[0] - 0.1, np.r_[1, 1, [0] * 8] - 0.2
        mac = (a @ c) ** 2 / ((a @ a) * (c @ c))
        assert strategy.matrix[0, 1] == pytest.approx(1 / 81, abs=1e-6)
        assert row["cka_offdiag_min"] == pytest.approx(1 / 81, abs=1e-6)
        assert row["cka_offdiag_max"] == pytest.approx(mac, abs=1e-6)
        assert row["selection_tv"] > 0.1
    else:
        assert row["cka_offdiag_min"] > 0.99 and row["selection_tv"] < 0.01
    assert {"cka_offdiag_min", "cka_offdiag_max", "selection_tv"} <= strategy.server_columns


def test_a_bad_cka_of_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="unknown strategy.cka_of 'bias'; valid: update, "
                                          "weights$"):
        check_experiment(compose(["strategy=dcfl", "strategy.cka_of=bias"]))


# -- selection ------------------------------------------------------------------------------
M3 = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, 0.8], [0.2, 0.8, 1.0]])


def test_exploit_probabilities_are_eq_4():
    # row sums without the diagonal: 0.7, 1.3, 1.0 over a total of 3.0
    assert np.allclose(exploit_probabilities(M3), [0.7 / 3, 1.3 / 3, 1.0 / 3])
    assert np.allclose(exploit_probabilities(np.eye(3)), [1 / 3] * 3)  # all 0: uniform


def test_select_draws_by_eq_4_and_splits_by_epsilon():
    explored, unexplored = [10, 11, 12], [20, 21, 22, 23]
    counts = np.zeros(3)
    for seed in range(3000):
        old, new = select_clients(explored, unexplored, M3, 2, 0.5, np.random.default_rng(seed))
        assert len(old) == 1 and len(new) == 1 and new[0] in unexplored
        counts[explored.index(old[0])] += 1
    assert np.allclose(counts / counts.sum(), exploit_probabilities(M3), atol=0.03)
    rng = np.random.default_rng(1)
    old, new = select_clients(explored, unexplored, M3, 3, 0.0, rng)
    assert old == [] and len(set(new)) == 3  # epsilon 0: explore only
    old, new = select_clients(explored, unexplored, M3, 3, 1.0, rng)
    assert sorted(old) == explored and new == []  # epsilon 1: exploit only
    old, new = select_clients(explored, [20], M3, 3, 0.0, rng)
    assert new == [20] and len(old) == 2  # too few unexplored: the explored fill in
    old, new = select_clients([], unexplored, np.zeros((0, 0)), 2, 1.0, rng)
    assert old == [] and len(new) == 2  # nothing explored yet: explore


def test_a_client_with_a_cka_row_of_0_cannot_crash_a_round_that_exploits_every_client():
    """Issue 43: a client returning the model it was sent has an update of 0, so a CKA row of
    0 and an Eq. 4 probability of 0; a round exploiting all three explored clients (the
    default fraction=1.0 with 3 clients, none left unexplored) asked rng.choice for more picks
    than non-zero probabilities (ValueError). Now every client Eq. 4 can draw is exploited
    and the rest drawn uniformly among the others."""
    copied = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.5], [0.0, 0.5, 1.0]])
    assert cka_matrix([np.zeros((3, 2)), *np.random.default_rng(0).normal(size=(2, 3, 2))])[0] \
        .tolist() == [0.0, 0.0, 0.0]
    assert exploit_probabilities(copied).tolist() == [0.0, 0.5, 0.5]
    old, new = select_clients([10, 11, 12], [], copied, 3, 0.5, np.random.default_rng(0))
    assert sorted(old) == [10, 11, 12] and new == []
    # two of four at 0, three picks: both non-zero ones, then one of the two others uniformly
    two = np.zeros((4, 4))
    two[2:, 2:] = [[1.0, 0.3], [0.3, 1.0]]
    filled = []
    for seed in range(200):
        old, _ = select_clients([10, 11, 12, 13], [], two, 3, 1.0, np.random.default_rng(seed))
        assert len(old) == 3 and {12, 13} <= set(old)
        filled.append(*(set(old) - {12, 13}))
    assert 0.35 < filled.count(10) / len(filled) < 0.65
    # no more picks than non-zero probabilities: Eq. 4's draw as before, never a zero one
    for seed in range(50):
        old, _ = select_clients([10, 11, 12, 13], [], two, 2, 1.0, np.random.default_rng(seed))
        assert sorted(old) == [12, 13]
    nan = np.array([[1.0, np.nan], [np.nan, 1.0]])
    assert exploit_probabilities(nan).tolist() == [0.5, 0.5]


def test_complementary_group_is_the_least_similar_explored_clients():
    assert complementary_group(10, [10, 11, 12], M3, 1) == [12]
    assert complementary_group(10, [10, 11, 12], M3, 2) == [12, 11]
    assert complementary_group(11, [10, 11, 12], M3, 5) == [10, 12]
    assert complementary_group(12, [10, 11, 12], M3, 0) == []


def test_filter_drops_exactly_the_share_with_the_highest_loss():
    losses = np.array([0.1, 2.0, 0.5, 3.0, 0.2, 1.0, 0.3, 0.4, 0.6, 0.7])
    assert keep_lowest_loss(losses, 0.2).tolist() == [0, 2, 4, 5, 6, 7, 8, 9]  # 3.0, 2.0 gone
    assert keep_lowest_loss(losses, 0.0).tolist() == list(range(10))
    assert len(keep_lowest_loss(losses, 0.25)) == 8  # floor(2.5) dropped


# -- FedDisco -------------------------------------------------------------------------------
def test_feddisco_weights_on_a_hand_case_and_the_fall_back():
    assert discrepancy([5, 5]) == pytest.approx(0.0)
    assert discrepancy([10, 0]) == pytest.approx(np.sqrt(0.5))
    # n = (60, 40): n_k/n = 0.6, 0.4; d = (sqrt(0.5), 0): 0.6 - 0.5*0.7071 + 0.1 = 0.3464, 0.5
    weights = disco_weights(np.array([60.0, 40.0]), np.array([np.sqrt(0.5), 0.0]), 0.5, 0.1)
    raw = np.array([0.7 - 0.5 * np.sqrt(0.5), 0.5])
    assert np.allclose(weights, raw / raw.sum())
    # every p_k clipped to 0: the example weights
    assert np.allclose(disco_weights(np.array([30.0, 10.0]), np.array([1.0, 1.0]), 5.0, 0.0),
                       [0.75, 0.25])


# -- DCFL through the real ClientApp --------------------------------------------------------
TINY = ["model=mlp", "dataset.subset=3000", "dataset.test_subset=300", "num_clients=4",
        "fraction=0.5", "logit_shift_samples=32", "strategy.condense_iterations=4",
        "strategy.ipc=2", "strategy.pretrain_epochs=2"]


def run_rounds(overrides: list[str], rounds: int = 2):
    experiment = prepare_experiment(compose(overrides))
    cfg = experiment.cfg
    model = experiment.initial_model()
    strategy = build_strategy(cfg, model, None)
    grid = InProcessGrid(fmnist_nodes(4))
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    clients = survey_clients(grid, record, 4, node_wait=5, timeout=60)
    strategy.meet(clients)
    result = strategy.start(grid=grid, initial_arrays=model_to_arrays(model), num_rounds=rounds,
                            train_config=record, evaluate_config=ConfigRecord(dict(record)))
    return strategy, to_numpy(result.arrays), {c["node_id"]: c for c in clients}


def test_dcfl_without_its_parts_trains_exactly_like_fedavg(fmnist_available, server_task):
    bare = ["selection=uniform", "strategy.pretrain_requests=0", "strategy.finetune_epochs=0",
            "strategy.dsa=false"]
    _, dcfl, _ = run_rounds(["strategy=dcfl", *TINY, *bare])
    _, fedavg, _ = run_rounds(["strategy=fedavg", *TINY[:5]])
    assert dcfl.keys() == fedavg.keys()
    assert all(np.array_equal(dcfl[k], fedavg[k]) for k in dcfl)


def test_dcfl_explores_exchanges_and_weights_by_local_plus_condensed(fmnist_available,
                                                                     server_task, capsys):
    strategy, _, clients = run_rounds(["strategy=dcfl", *TINY], rounds=3)
    printed = capsys.readouterr().out
    # what leaves the clients is said before it does, and each client's set is measured
    assert "DCFL: each explored client sends the server 2 condensed images" in printed
    assert "(DM from noise, 4 iterations)" in printed and "not differentially private" in printed
    assert "DCFL pre-training" in printed
    assert "condense: client" in printed  # the clients' progress lines
    assert printed.count("have a real image of this client with Pearson correlation") \
        == len(strategy.explored)
    assert len(strategy.explored) >= 3 and set(strategy.store) == set(strategy.explored)
    for node, (images, labels) in strategy.store.items():
        held = np.flatnonzero(clients[node]["label_histogram"])
        assert images.shape == (2 * len(held), 1, 28, 28)  # ipc per held class
        assert sorted(set(labels.tolist())) == held.tolist()
    assert np.allclose(strategy.matrix, strategy.matrix.T)
    assert ((strategy.matrix >= -1e-9) & (strategy.matrix <= 1 + 1e-9)).all()
    # the last round: explored clients got condensed images and are weighted n_k + ñ_k
    assert strategy.sent_images and strategy.log.bytes_sent > 0
    for update in strategy.last_updates:
        own = clients[update.node_id]["num_examples"]
        assert update.num_examples == own + strategy.sent_images.get(update.node_id, 0)
    assert any(update.num_examples > clients[update.node_id]["num_examples"]
               for update in strategy.last_updates)
    cka = strategy.round_arrays()["cka"]
    assert cka.shape == (4, 4) and np.isnan(cka).sum() == 16 - len(strategy.explored) ** 2


def test_dp_dm_epsilons_printed_at_the_start_and_recorded_per_client(fmnist_available,
                                                                      server_task, capsys):
    """The server prints every client's (epsilon, delta) before any image leaves; each client
    prints its plan and sends its epsilon, which the round's row keeps, by client."""
    strategy, _, clients = run_rounds(["strategy=dcfl", *TINY, "strategy.pretrain_requests=0",
                                       "strategy.condense_dp=true",
                                       "strategy.condense_dp_noise=1.5"], rounds=1)
    printed = capsys.readouterr().out
    start = printed.index("DP-DM with noise multiplier 1.5")
    assert start < printed.index("condense: client")
    by_client = {c["partition_id"]: privacy_plan(
        condensation_settings({"condense_dp": True, "condense_dp_noise": 1.5,
                               "condense_iterations": 4}), c["label_histogram"]).epsilon
        for c in clients.values()}
    for partition, epsilon in by_client.items():
        assert f"{partition}: {epsilon:.3g}" in printed
    row = strategy.server_metrics(lambda arrays: 0.0)
    assert row["condense_epsilon"].keys() == {f"client_{p}" for p in row["explored_now"].split()}
    for name, epsilon in row["condense_epsilon"].items():
        assert epsilon == pytest.approx(by_client[int(name.removeprefix("client_"))])
    # what no DP covers stays with the clients, the server's row reads its absence
    assert row["condensed_copies"] == row["condensed_similarity"] == row["condense_seconds"] == {}
    assert printed.count("have a real image of this client") == len(row["condense_epsilon"])


def condense_twice(overrides: list[str], one_run: bool = False
                   ) -> tuple[list[np.ndarray], list[dict]]:
    """Two alike dcfl_condense queries (same experiment seed, round and node) through the real
    ClientApp, to the node of two runs (fresh node state each) or, ``one_run``, twice to the
    node of one run: the images and metrics of both replies."""
    from flwr.app import MessageType

    from driftfl.common.protocol import ARRAYS, CONFIG, DCFL_CONDENSE, METRICS, SERVER_ROUND

    experiment = prepare_experiment(compose(["strategy=dcfl", *TINY, *overrides]))
    record = ConfigRecord({EXPERIMENT: experiment.cfg.to_json(),
                           DATASET_META: experiment.meta.to_json(), SERVER_ROUND: 0})
    arrays = model_to_arrays(experiment.initial_model())
    query = [Message(RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(dict(record))}),
                     dst_node_id=100, message_type=f"{MessageType.QUERY}.{DCFL_CONDENSE}")
             for _ in range(2)]
    if one_run:
        replies = InProcessGrid(fmnist_nodes(4)).send_and_receive(query)
    else:
        replies = [InProcessGrid(fmnist_nodes(4)).send_and_receive([q])[0] for q in query]
    assert not any(reply.has_error() for reply in replies)
    return ([r.content.array_records[CONDENSED]["images"].numpy() for r in replies],
            [dict(r.content.metric_records[METRICS]) for r in replies])


def test_dp_dm_through_the_client_app_draws_fresh_noise_and_sends_its_epsilon_only(
        fmnist_available, server_task):
    """The seed the handler gives (experiment seed, round, partition) is the server's to know:
    under DP-DM the same query twice condenses to other images; without DP to the same."""
    from driftfl.common.protocol import CONDENSE_EPSILON, CONDENSED_COPIES

    images, metrics = condense_twice(["strategy.condense_dp=true",
                                      "strategy.condense_dp_noise=1.5"])
    assert not np.array_equal(*images)
    assert set(metrics[0]) == set(metrics[1]) == {NUM_EXAMPLES, CONDENSE_EPSILON}
    assert metrics[0][CONDENSE_EPSILON] == metrics[1][CONDENSE_EPSILON]  # public counts only
    images, metrics = condense_twice([])
    assert np.array_equal(*images) and CONDENSED_COPIES in metrics[0]


def test_dp_dm_releases_a_nodes_set_once_per_run(fmnist_available, server_task):
    """Asked again in one run (a round re-run after a crash), a DP-DM node sends the set it
    released before: condensing anew would spend its epsilon a second time."""
    images, metrics = condense_twice(["strategy.condense_dp=true",
                                      "strategy.condense_dp_noise=1.5"], one_run=True)
    assert np.array_equal(*images) and metrics[0] == metrics[1]


def test_real_initialisation_warns_how_close_the_images_are(fmnist_available, server_task,
                                                            capsys, caplog):
    strategy, _, _ = run_rounds(["strategy=dcfl", *TINY, "strategy.pretrain_requests=0",
                                 "strategy.condense_init=real"], rounds=1)
    printed = capsys.readouterr().out
    assert "condense_init=real" in caplog.text and "Pearson correlation >= 0.99" in caplog.text
    assert "DM from real" in printed
    row = strategy.server_metrics(lambda arrays: 0.0)
    assert row["condensed_copies"] and all(share > 0.5 for share in
                                           row["condensed_copies"].values())


def test_the_cost_line_says_what_condensation_costs_a_client():
    """Before a simulated DCFL run starts (`driftfl run` prints it): the iterations times one
    iteration of the run's settings and model, timed here on noise images."""
    from driftfl.common.models import model_settings
    from driftfl.dcfl.cost import cost_line

    line = cost_line({"condense_iterations": 40, "condense_batch": 16, "dsa": True},
                     model_settings({"name": "mlp"}), (1, 28, 28), 10)
    seconds, per_iteration = re.search(r"about (\d+) s once .* ([\d.]+) ms an iteration",
                                       line).groups()
    assert "40 iterations of 16 real images per class, adam lr 0.1" in line
    assert "of the mlp" in line and int(seconds) == round(40 * float(per_iteration) / 1e3)
    assert 0 < float(per_iteration) < 5000


def test_dcfl_over_fedprox_sends_mu_and_refuses_an_objective_it_cannot_serve():
    cfg = check_experiment(compose(["strategy=dcfl", "strategy.objective=prox",
                                    "+strategy.mu=0.05", "aggregation=feddisco"]))
    assert cfg.strategy.mu == 0.05 and cfg.aggregation.name == "feddisco"
    from driftfl.common.models import build_model
    from driftfl.dcfl.strategy import DCFL

    strategy = DCFL.from_config(cfg, build_model(cfg.model, (1, 28, 28), 10))
    assert strategy.proximal_mu == 0.05
    with pytest.raises(ConfigError, match="objective 'csd' needs"):
        check_experiment(compose(["strategy=dcfl", "strategy.objective=csd"]))
    with pytest.raises(ConfigError, match="selection=cka needs what only strategy=dcfl"):
        check_experiment(compose(["strategy=fedavg", "selection=cka"]))
    with pytest.raises(ConfigError, match="unknown DSA transform 'blur'"):
        check_experiment(compose(["strategy=dcfl", "strategy.dsa_transforms=color_blur"]))
    assert PROXIMAL_MU in DCFL.provides


def condensed_reply(images, labels) -> Message:
    content = RecordDict({CONDENSED: ArrayRecord({"images": Array(images),
                                                  "labels": Array(labels)}),
                          "metrics": MetricRecord({NUM_EXAMPLES: 10})})
    return Message(content, dst_node_id=0, message_type="train")


@pytest.mark.parametrize("images, labels, reason", [
    (np.zeros((3, 1, 28, 28), np.float32), np.array([0, 1, 2], np.int32), "condensed set is"),
    (np.zeros((3, 1, 28, 28), np.float64), np.array([0, 1, 2], np.int64), "condensed set is"),
    (np.zeros((3, 1, 8, 8), np.float32), np.array([0, 1, 2], np.int64), "condensed set is"),
    (np.full((3, 1, 28, 28), np.nan, np.float32), np.array([0, 1, 2], np.int64), "NaN"),
    (np.full((3, 1, 28, 28), 3e38, np.float32), np.array([0, 1, 2], np.int64), "out-of-range"),
    (np.zeros((3, 1, 28, 28), np.float32), np.array([0, 1, 12], np.int64), "labels outside"),
    (np.zeros((30, 1, 28, 28), np.float32), np.zeros(30, np.int64), "more than ipc"),
])
def test_a_bad_condensed_set_is_refused_with_its_reason(images, labels, reason, server_task):
    checked = check_condensed(condensed_reply(images, labels), (1, 28, 28), 10, ipc=20)
    assert isinstance(checked, str) and reason in checked
    good = check_condensed(condensed_reply(np.zeros((3, 1, 28, 28), np.float32),
                                           np.array([0, 1, 2], np.int64)), (1, 28, 28), 10, 20)
    assert not isinstance(good, str)


@pytest.mark.parametrize("use, steps", [("finetune", 2 * 4 + 3 * 3), ("mix", 2 * 5)])
def test_dcfl_expects_the_steps_of_both_stages_or_of_the_mixed_one(use, steps):
    """100 local examples, 40 images sent: E_c = 2 epochs in batches of 32 (4 a pass), then
    E_s = 3 in batches of 16 (3 a pass); mixed, 2 epochs of 140 in batches of 32 (5 a pass).
    A client sent nothing trains its local stage only."""
    from driftfl.strategies.parts.aggregation import ClientUpdate

    cfg = check_experiment(compose(["strategy=dcfl", "model=mlp", "local_epochs=2",
                                    "batch_size=32", "strategy.finetune_epochs=3",
                                    "strategy.finetune_batch_size=16",
                                    f"strategy.condensed_use={use}"]))
    strategy = build_strategy(cfg, build_model(cfg.model, (1, 28, 28), 10), None)
    strategy.sent_images = {7: 40}
    claim = lambda node: ClientUpdate(node, {}, {NUM_EXAMPLES: 100.0}, None)
    assert strategy.local_steps(claim(7)) == steps and strategy.local_steps(claim(8)) == 8


def test_a_reply_with_a_bad_condensed_set_changes_no_dcfl_state(fmnist_available, server_task):
    strategy, _, _ = run_rounds(["strategy=dcfl", *TINY, "strategy.pretrain_requests=0"], 1)
    before = (list(strategy.explored), dict(strategy.store))
    strategy.asked = {999}
    strategy.clients.surveyed[999] = 10  # a surveyed node
    from driftfl.strategies.parts.aggregation import ClientUpdate

    # a reply that passed the common checks, from a node asked to condense
    bad = condensed_reply(np.full((2, 1, 28, 28), np.nan, np.float32), np.zeros(2, np.int64))
    steps = float(strategy.local_training.steps(10))
    update = ClientUpdate(999, {}, {NUM_EXAMPLES: 10.0, LOCAL_STEPS: steps}, bad)
    assert "NaN" in strategy.reject(update)
    assert (strategy.explored, strategy.store) == before


def test_a_dcfl_node_that_sends_nothing_back_is_reported_late(fmnist_available, server_task):
    strategy, arrays, clients = run_rounds(["strategy=dcfl", *TINY,
                                            "strategy.pretrain_requests=0"], 1)
    grid = InProcessGrid(fmnist_nodes(4))
    messages = list(strategy.configure_train(2, to_record(arrays), ConfigRecord({}), grid))
    asked = [m.metadata.dst_node_id for m in messages]
    assert strategy.trained == asked and len(asked) == 2
    assert strategy.accept([]) == []
    assert strategy.report.late == [str(clients[n]["partition_id"]) for n in asked]


def test_finetune_own_set_sends_the_clients_own_set_back_after_the_filtered_group(
        fmnist_available, server_task):
    """Algorithm 2 line 13's reading: the received images are the group's, filtered, then the
    client's own stored set, unfiltered; without the setting, the group's only."""
    strategy, arrays, _ = run_rounds(["strategy=dcfl", *TINY, "strategy.finetune_own_set=true"],
                                     rounds=2)
    grid = InProcessGrid(fmnist_nodes(4))
    record = ConfigRecord({})  # round 3's config: the strategy adds what it sends
    messages = strategy.configure_train(3, to_record(arrays), record, grid)
    checked = 0
    for msg in messages:
        node = msg.metadata.dst_node_id
        if CONDENSED not in msg.content.array_records:
            continue
        images = msg.content.array_records[CONDENSED]["images"].numpy()
        own = strategy.store[node][0]
        assert np.array_equal(images[-len(own):], own)
        assert strategy.sent_images[node] == len(images) > len(own)
        checked += 1
    assert checked
    strategy.finetune_own_set = False
    for msg in strategy.configure_train(3, to_record(arrays), record, grid):
        node = msg.metadata.dst_node_id
        if CONDENSED in msg.content.array_records:
            images = msg.content.array_records[CONDENSED]["images"].numpy()
            assert not any(np.array_equal(images[-len(own):], own)
                           for own in [strategy.store[node][0]] if len(images) >= len(own))


def test_an_empty_condensed_set_is_a_valid_reply():
    """A client holding no class with min_class images ships no image, and that is no error."""
    from flwr.app import Array, ArrayRecord

    from driftfl.dcfl.settings import read_condensed

    record = ArrayRecord({"images": Array(np.zeros((0, 1, 28, 28), np.float32)),
                          "labels": Array(np.zeros(0, np.int64))})
    images, labels = read_condensed(record, (1, 28, 28), 10, ipc=10)
    assert images.shape == (0, 1, 28, 28) and labels.shape == (0,)


def trained_with(settings: dict, received: bool = True):
    """A client's round of DCFL training on noise data: (the model, the steps)."""
    from types import SimpleNamespace

    from driftfl.client.objectives import build_objective
    from driftfl.dcfl.client import DCFLClient

    cfg = compose(["strategy=dcfl", "model=mlp", "local_epochs=1", "batch_size=16"])
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 1, 28, 28, generator=gen), torch.arange(48) % 3
    images = (torch.randn(12, 1, 28, 28, generator=gen), torch.arange(12) % 3)
    torch.manual_seed(0)
    model = build_model(cfg.model, (1, 28, 28), 10)
    client = DCFLClient(condensation_settings({"dsa": False, "finetune_lr": 0.05, **settings}),
                        SimpleNamespace(experiment=cfg))
    stats = client.train(model, x, y, build_objective("ce", {}), torch.Generator().manual_seed(1),
                         images if received else None)
    return model, stats.steps


def test_the_received_images_train_the_head_only_and_before_the_local_stage_where_asked():
    """finetune_layers=head: the features are what the local stage alone made of them, the head
    moved on; finetune_order=before: the same two stages the other way round."""
    local, local_steps = trained_with({}, received=False)
    both, steps = trained_with({})
    head, head_steps = trained_with({"finetune_layers": "head"})
    before, before_steps = trained_with({"finetune_order": "before"})
    assert local_steps < steps == head_steps == before_steps
    features = [n for n in local.state_dict() if not n.startswith("head.")]
    assert all(torch.equal(head.state_dict()[n], local.state_dict()[n]) for n in features)
    assert not torch.equal(head.head.weight, local.head.weight)
    assert not torch.equal(both.state_dict()[features[0]], local.state_dict()[features[0]])
    assert not torch.equal(before.head.weight, both.head.weight)
    assert all(p.requires_grad for p in head.parameters())  # nothing left frozen
