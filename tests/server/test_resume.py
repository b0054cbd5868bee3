"""Resume: a run stopped in round 3 of 3 and resumed from its checkpoint ends with the same
model, bit for bit, and the same metrics rows as the run that was not stopped, for every method
whose state lives on the server. The resumed run's nodes have other node ids, as they do after
a restart: state kept by node id must follow its partition."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import MessageType

from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import CONFIG, SERVER_ROUND
from driftfl.methods import METHODS
from driftfl.server import checkpoint, treefile
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from test_methods import TINY, InProcessGrid

pytestmark = pytest.mark.slow  # every method stopped and resumed

# a client keeps state of its own between rounds in these (SCAFFOLD's c_k, FedDyn's gradient,
# MOON's previous model): a resumed run starts it again, so they cannot match bit for bit
CLIENT_STATE = {"scaffold", "feddyn", "moon"}
TIMING = {"seconds", "train_seconds", "eval_seconds", "condense_seconds"}


class Stopped(Exception):
    """The server process dies."""


def nodes(first_id: int) -> dict[int, dict]:
    return {first_id + i: {"dataset": "fmnist", "partition-id": i, "num-partitions": 2}
            for i in range(2)}


class StoppingGrid(InProcessGrid):
    """Its server dies as it sends round ``stop``'s training."""

    def __init__(self, node_configs, stop: int):
        super().__init__(node_configs)
        self.stop = stop

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if any(m.metadata.message_type == MessageType.TRAIN
               and m.content[CONFIG][SERVER_ROUND] == self.stop for m in messages):
            raise Stopped
        return super().send_and_receive(messages, timeout)


# DCFL condenses little: what is checked is its store and matrix across the resume
SMALL = {"dcfl": ["strategy.condense_iterations=4", "strategy.ipc=2", "strategy.pretrain_epochs=2"]}


def experiment(name: str, *more: str):
    return prepare_experiment(compose([f"strategy={name}", *TINY, "rounds=3",
                                       *SMALL.get(name, []), *more]))


def rows_without_timing(run_dir):
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    return [{k: v for k, v in r.items() if not any(k.startswith(t) for t in TIMING)}
            for r in rows]


# FedCSD's prototypes=previous keeps the last round's P_G for the next (exchange: made anew)
VARIANTS = [pytest.param(name, [], id=name) for name in sorted(set(METHODS) - CLIENT_STATE)] + [
    pytest.param("fedcsd", ["strategy.prototypes=previous"], id="fedcsd-previous")]


@pytest.mark.parametrize("name, more", VARIANTS)
def test_a_run_stopped_in_its_last_round_and_resumed_ends_as_the_uninterrupted_one(
        name, more, tmp_path, fmnist_available, server_task):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    run_experiment(InProcessGrid(nodes(100)), experiment(name, *more), whole, run_id=1)
    with pytest.raises(Stopped):
        run_experiment(StoppingGrid(nodes(100), stop=3), experiment(name, *more), stopped,
                       run_id=2)
    assert treefile.read(stopped / checkpoint.CHECKPOINT)["round"] == 2
    assert not (stopped / "summary.json").exists()

    run_experiment(InProcessGrid(nodes(200)), experiment(name, *more), stopped, run_id=3,
                   resume=True)

    final, resumed = (torch.load(d / "model.pt", weights_only=True) for d in (whole, stopped))
    assert final.keys() == resumed.keys()
    assert all(torch.equal(final[k], resumed[k]) for k in final), name
    assert rows_without_timing(stopped) == rows_without_timing(whole)
    meta = json.loads((stopped / "meta.json").read_text())
    assert meta["resumed_after_round"] == 2 and meta["earlier"][0]["flower_run_id"] == 2


def test_a_different_experiment_or_a_finished_run_is_refused_with_one_line(
        tmp_path, fmnist_available, server_task):
    # trust=clients: checkpoint.check builds the strategy a simulated resume would, and this
    # run's in-process nodes count as deployed (trust=auto would bound them, keeping state)
    with pytest.raises(Stopped):
        run_experiment(StoppingGrid(nodes(100), stop=2), experiment("fedavg", "trust=clients"),
                       tmp_path, 1)
    other = experiment("fedavg", "trust=clients", "lr=0.01", "round_timeout=60")
    with pytest.raises(ConfigError, match=r"cannot resume .*: its experiment differs in "
                                          r"lr \(0.05 there, 0.01 here\); a resumed run keeps "
                                          r"the settings it ran with \(its config.yaml\) but "
                                          r"for rounds and max_rounds_without_reply, min_clients, "):
        checkpoint.check(tmp_path, other)  # round_timeout may differ: how, not what
    with pytest.raises(ConfigError, match="it has no checkpoint.pt"):
        checkpoint.check(tmp_path / "nothing", other)
    with pytest.raises(ConfigError, match=r"all 1 rounds are done; more with rounds=<more "
                                          r"than 1>$"):
        checkpoint.check(tmp_path, experiment("fedavg", "trust=clients", "rounds=1"))
    assert checkpoint.check(tmp_path, experiment("fedavg", "trust=clients",
                                                 "round_timeout=60"))["round"] == 1


def test_a_finished_run_given_more_rounds_ends_as_the_longer_run(tmp_path, fmnist_available,
                                                                  server_task):
    """rounds is the one setting of what a run computes that a resume may change: no server
    state depends on how many rounds are to come."""
    longer, extended = tmp_path / "longer", tmp_path / "extended"
    run_experiment(InProcessGrid(nodes(100)), experiment("fedavgm"), longer, run_id=1)
    run_experiment(InProcessGrid(nodes(100)), experiment("fedavgm", "rounds=2"), extended, 2)
    assert json.loads((extended / "summary.json").read_text())["status"] == "completed"
    run_experiment(InProcessGrid(nodes(200)), experiment("fedavgm"), extended, run_id=3,
                   resume=True)
    final, resumed = (torch.load(d / "model.pt", weights_only=True) for d in (longer, extended))
    assert all(torch.equal(final[k], resumed[k]) for k in final)
    assert rows_without_timing(extended) == rows_without_timing(longer)
    assert json.loads((extended / "summary.json").read_text())["rounds"] == 3


def test_a_finished_run_resumed_past_its_end_and_stopped_says_it_is_stopped(
        tmp_path, fmnist_available, server_task):
    """A completed run resumed with more rounds is running again from its first resumed
    round: stopped there, its directory holds no summary of the earlier end, so the stop's line
    says where it is saved and how to go on, and `driftfl report` does not count it finished."""
    from driftfl.launch import saved
    from driftfl.report.runs import find_runs
    from driftfl.resume import STOPPED

    run = tmp_path / "run"
    run_experiment(InProcessGrid(nodes(100)), experiment("fedavg", "rounds=1"), run, run_id=1)
    assert saved(run, []).startswith("the run had finished (completed)")
    (run / STOPPED).write_text("driftfl: stopped; ...\n")  # an earlier stop's line
    with pytest.raises(Stopped):
        run_experiment(StoppingGrid(nodes(200), stop=3), experiment("fedavg", "rounds=4"), run,
                       run_id=2, resume=True)
    assert not (run / "summary.json").exists() and not (run / STOPPED).exists()
    assert treefile.read(run / checkpoint.CHECKPOINT)["round"] == 2
    assert saved(run, []) == f"it is saved after round 2 of 4, go on with: driftfl run resume={run}"
    assert find_runs([tmp_path]) == ([], [run])
