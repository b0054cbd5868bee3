"""Every release is charged: a DP run stopped after its clients replied and before its
checkpoint, then resumed, sends that round again with fresh noise; the privacy ledger written
before each round's messages go out makes the resumed run charge both sendings, and its epsilon
is what dp-accounting makes of the ledger alone."""

from __future__ import annotations

import csv
import json
import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import MessageType

from driftfl.common.accounting import released_epsilon, round_of
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.privacy import PrivacySettings
from driftfl.common.protocol import CONFIG, SERVER_ROUND
from driftfl.server import checkpoint, ledger, seal, treefile
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from driftfl.strategies.parts.release.base import SecureSum
from driftfl.strategies.parts.release.distributed import DistributedRelease
from test_methods import InProcessGrid

CLIENTS = 3
PRIVATE = ["strategy=fedavg", "model=mlp", "dataset.subset=1500", "dataset.test_subset=200",
           f"num_clients={CLIENTS}", "rounds=3", "logit_shift_samples=8",
           "privacy=distributed", "privacy.noise_multiplier=2", "privacy.min_survivors=2"]


class Stopped(Exception):
    """The server process dies."""


def nodes(first_id: int) -> dict[int, dict]:
    return {first_id + i: {"dataset": "fmnist", "partition-id": i, "num-partitions": CLIENTS}
            for i in range(CLIENTS)}


class DyingGrid(InProcessGrid):
    """Its server dies right after round ``stop``'s training replies arrive (before the round
    is recorded or checkpointed); it notes what the ledger on disk held as each round's
    training went out."""

    def __init__(self, node_configs, stop: int, run_dir):
        super().__init__(node_configs)
        self.stop, self.run_dir, self.replied = stop, run_dir, False
        self.ledger_at_send: dict[int, list[dict]] = {}

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if self.replied:
            raise Stopped
        train = [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        if train:
            server_round = int(train[0].content[CONFIG][SERVER_ROUND])
            self.ledger_at_send[server_round] = read_ledger(self.run_dir)["releases"]
            replies = super().send_and_receive(messages, timeout)
            self.replied = server_round == self.stop
            return replies
        return super().send_and_receive(messages, timeout)


def read_ledger(run_dir) -> dict:
    return json.loads((run_dir / ledger.LEDGER).read_text())


def recomputed(run_dir) -> float:
    """docs/privacy.md's recomputation: dp-accounting alone, from the ledger."""
    book = read_ledger(run_dir)
    accountant = RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    for release in book["releases"]:
        event = dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(s) for s in release["sigmas"].values()])
        q = release["q"]
        accountant.compose(event if q >= 1 else dp_accounting.PoissonSampledDpEvent(q, event))
    return accountant.get_epsilon(book["delta"])


def experiment():
    return prepare_experiment(compose(PRIVATE))


def test_a_round_released_before_a_stop_is_charged_again_when_it_is_sent_again(
        tmp_path, fmnist_available, server_task):
    dying = DyingGrid(nodes(100), stop=2, run_dir=tmp_path)
    with pytest.raises(Stopped):
        run_experiment(dying, experiment(), tmp_path, run_id=1)
    # each round was charged on disk, at its worst, before its messages went out
    assert [e["round"] for e in dying.ledger_at_send[1]] == [1]
    assert dying.ledger_at_send[1][0]["outcome"] == "going out"
    assert [(e["round"], e["outcome"]) for e in dying.ledger_at_send[2]] == [
        (1, "released"), (2, "going out")]
    assert treefile.read(tmp_path / checkpoint.CHECKPOINT)["round"] == 1

    run_experiment(InProcessGrid(nodes(200)), experiment(), tmp_path, run_id=2, resume=True)

    book = read_ledger(tmp_path)
    assert [(e["round"], e["outcome"]) for e in book["releases"]] == [
        (1, "released"), (2, "released"), (2, "sent again after a stop"), (3, "released")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    sigma = 2 / math.sqrt(2)  # each share as the server sees it, without SecAgg+
    four = released_epsilon((round_of(1.0, [sigma]),) * 4, 1e-5)
    assert summary["epsilon"] == pytest.approx(four, rel=1e-9)
    assert summary["epsilon"] == pytest.approx(recomputed(tmp_path), rel=1e-9)
    assert summary["epsilon"] > released_epsilon((round_of(1.0, [sigma]),) * 3, 1e-5)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["dp_releases"] for r in rows[1:]] == ["1", "2", "1"]


def test_a_ledger_changed_or_missing_refuses_the_resume_in_one_line(
        tmp_path, fmnist_available, server_task):
    with pytest.raises(Stopped):
        run_experiment(DyingGrid(nodes(100), stop=2, run_dir=tmp_path), experiment(), tmp_path,
                       run_id=1)
    path = tmp_path / ledger.LEDGER
    book = read_ledger(tmp_path)
    assert checkpoint.check(tmp_path, experiment())["round"] == 1  # the CLI's check passes
    book["releases"] = book["releases"][:1]  # the lost sending dropped
    path.write_text(json.dumps(book))
    changed = (f"cannot resume {tmp_path}: its privacy_ledger.json does not verify with this "
               "machine's checkpoint key: it was changed after driftfl wrote it; resume another "
               "run directory, or run without resume= to start afresh")
    with pytest.raises(ConfigError) as refused:
        checkpoint.check(tmp_path, experiment())  # before a run is launched
    assert str(refused.value) == changed
    with pytest.raises(ConfigError, match="does not verify"):
        run_experiment(InProcessGrid(nodes(200)), experiment(), tmp_path, run_id=2, resume=True)
    path.unlink()
    with pytest.raises(ConfigError, match="its privacy_ledger.json is missing"):
        checkpoint.check(tmp_path, experiment())


def test_a_ledger_put_back_or_of_another_run_is_refused_and_two_resumes_charge_every_sending(
        tmp_path, fmnist_available, server_task):
    """The audit replaced the ledger with an older genuine one (written by driftfl after round
    1, its tag valid): round 2's first sending went uncharged. The ledger's generation and
    digest are now recorded beside the key, and the checkpoint names its run: an earlier copy
    and another run's ledger are refused. Then two resumes in a row, each after a stop that
    lost a sending: epsilon from the ledger alone counts every sending."""
    dying = DyingGrid(nodes(100), stop=2, run_dir=tmp_path)
    with pytest.raises(Stopped):
        run_experiment(dying, experiment(), tmp_path, run_id=1)
    path = tmp_path / ledger.LEDGER
    latest = path.read_text()
    book = json.loads(latest)
    assert [(e["round"], e["outcome"]) for e in book["releases"]] == [
        (1, "released"), (2, "going out")]
    # the ledger as driftfl wrote it after round 1, before round 2 went out (generation 2)
    earlier = dict(book, generation=2, releases=book["releases"][:1])
    earlier["hmac"] = seal.tag(ledger._body(book["run"], 2, book["delta"],
                                            earlier["releases"]), seal.key()).hex()
    path.write_text(json.dumps(earlier))
    with pytest.raises(ConfigError) as refused:
        checkpoint.check(tmp_path, experiment())
    assert str(refused.value).startswith(
        f"cannot resume {tmp_path}: its privacy_ledger.json is an earlier copy (generation 2; "
        f"driftfl last wrote generation 3, {ledger.head_path(book['run'])}): a ledger put back "
        "would leave sendings uncharged")
    with pytest.raises(ConfigError, match="is an earlier copy"):
        run_experiment(InProcessGrid(nodes(200)), experiment(), tmp_path, run_id=2, resume=True)

    other = tmp_path / "other"  # another run's genuine ledger, its tag and record valid
    with pytest.raises(Stopped):
        run_experiment(DyingGrid(nodes(300), stop=1, run_dir=other), experiment(), other,
                       run_id=3)
    path.write_text((other / ledger.LEDGER).read_text())
    with pytest.raises(ConfigError, match="is another run's ledger than its checkpoint's"):
        checkpoint.check(tmp_path, experiment())
    path.write_text(latest)

    # resumed, and stopped again after round 3 went out: its first sending is charged too
    with pytest.raises(Stopped):
        run_experiment(DyingGrid(nodes(200), stop=3, run_dir=tmp_path), experiment(),
                       tmp_path, run_id=2, resume=True)
    run_experiment(InProcessGrid(nodes(400)), experiment(), tmp_path, run_id=4, resume=True)
    sendings = [(e["round"], e["outcome"]) for e in read_ledger(tmp_path)["releases"]]
    assert sendings == [(1, "released"), (2, "released"), (2, "sent again after a stop"),
                        (3, "released"), (3, "sent again after a stop")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    sigma = 2 / math.sqrt(2)
    assert summary["epsilon"] == pytest.approx(recomputed(tmp_path), rel=1e-9)
    assert summary["epsilon"] == pytest.approx(
        released_epsilon((round_of(1.0, [sigma]),) * 5, 1e-5), rel=1e-9)


def test_a_run_stopped_before_its_first_checkpoint_keeps_its_charge(tmp_path, fmnist_available,
                                                                  server_task):
    """The audit's run died after round 1's charge, before any checkpoint: resume was refused
    and the same command in the same directory overwrote the ledger (5.377 recorded against
    6.482 with the lost sending). Now a fresh start there is refused in one line, and the
    resume goes on from round 0 with the charge kept."""
    with pytest.raises(Stopped):
        run_experiment(DyingGrid(nodes(100), stop=1, run_dir=tmp_path), experiment(), tmp_path,
                       run_id=1)
    assert not (tmp_path / checkpoint.CHECKPOINT).exists()
    before = (tmp_path / ledger.LEDGER).read_text()
    with pytest.raises(ConfigError) as refused:
        run_experiment(InProcessGrid(nodes(200)), experiment(), tmp_path, run_id=2)
    assert str(refused.value) == (
        f"{tmp_path} holds privacy_ledger.json, the record of what a run under differential "
        "privacy released there, which a fresh start would overwrite; go on with driftfl run "
        f"resume={tmp_path} (from its last checkpoint, or from round 0 where it has none, every "
        "charge kept), or choose another directory")
    assert (tmp_path / ledger.LEDGER).read_text() == before
    assert checkpoint.check(tmp_path, experiment()) is None  # the CLI's check: from round 0
    run_experiment(InProcessGrid(nodes(200)), experiment(), tmp_path, run_id=2, resume=True)
    sendings = [(e["round"], e["outcome"]) for e in read_ledger(tmp_path)["releases"]]
    assert sendings == [(1, "released"), (1, "sent again after a stop"), (2, "released"),
                        (3, "released")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["epsilon"] == pytest.approx(recomputed(tmp_path), rel=1e-9)
    assert summary["epsilon"] == pytest.approx(
        released_epsilon((round_of(1.0, [2 / math.sqrt(2)]),) * 4, 1e-5), rel=1e-9)


def test_a_secure_sum_unmasked_then_withheld_is_charged_as_released():
    settings = PrivacySettings(name="distributed", noise_multiplier=1.0, min_survivors=2)
    for unmasked, charged in ((False, math.inf), (True, 1.0 * math.sqrt(3 / 2))):
        release = DistributedRelease(settings, num_clients=4, per_round=4, secure=True)
        facts = type("Facts", (), {"sent": [1, 2, 3, 4]})()
        release.release(1, facts, [object()] * 3, SecureSum(
            [], {}, set(), None, halted="out of range", unmasked=unmasked))
        assert release.columns(1)["dp_sigma"] == pytest.approx(charged)
