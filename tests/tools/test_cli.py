"""The `driftfl` command refuses bad input in one line, before starting any Flower process.

Each refusal runs the command's own code in this process (support.cli); the contract as a user
meets it (a real `driftfl` process: exit code 2, one line on stderr, nothing written) is
checked by the three tests marked slow."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO, driftfl_bin
from support.cli import driftfl


def real_driftfl(*args, cwd, env=None):
    """A real `driftfl` process: what the in-process calls stand for, checked as a user meets
    it."""
    return subprocess.run([driftfl_bin(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow  # a real process: the console script, its exit code and streams
def test_help_and_unknown_command(tmp_path):
    out = real_driftfl("--help", cwd=tmp_path)
    assert out.returncode == 0 and "driftfl run" in out.stdout
    out = real_driftfl("frobnicate", cwd=tmp_path)
    assert out.returncode == 2 and "unknown command 'frobnicate'; valid: audit, evaluate, report, run" in out.stderr


@pytest.mark.parametrize("override, message", [
    ("partition.alpha=0", "driftfl: error: partition.alpha must be > 0, got 0"),
    ("fraction=2", r"driftfl: error: fraction must be in (0, 1], got 2"),
    ("model.name=vgg", "driftfl: error: unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, resnet18"),
])
def test_bad_value_exits_2_with_one_line_and_no_run(override, message, tmp_path,
                                                    fmnist_available):
    out = driftfl("run", override, "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "run" / "superlink.log").exists()  # no Flower process was started


@pytest.mark.parametrize("args, message", [
    (["roundz=3"], "driftfl: error: unknown setting roundz; did you mean rounds?"),
    (["strategy=fedcsd", "+strategy.muu=4"],
     "driftfl: error: unknown setting strategy.muu; did you mean strategy.mu?"),
    # a sweep is checked for every swept method before any job runs
    (["-m", "strategy=fedntd,fedcsd", "strategy.tau=0,1"],
     "driftfl: error: strategy.tau must be > 0, got 0"),
    # an override Hydra cannot parse: one line with the quoting that works, not Hydra's three
    (["seed=1", "label=[run"],
     "driftfl: error: cannot read the override label=[run: Hydra's override grammar needs a "
     "value with quotes or unmatched brackets quoted; in bash: 'label=\"[run\"' "
     "(https://hydra.cc/docs/advanced/override_grammar/basic)"),
    # Flower's run config cannot carry a single quote, whatever the quoting: said before the
    # data is loaded, not after
    (["label=it's"], "driftfl: error: the override label=it's holds a single quote ('), which "
                     "the run config Flower passes to the ServerApp cannot carry; leave it out"),
    (["a b=1"], "driftfl: error: cannot read the override a b=1: Hydra's override grammar needs "
                "a value with quotes or unmatched brackets quoted "
                "(https://hydra.cc/docs/advanced/override_grammar/basic)"),
])
def test_unknown_keys_and_bad_sweeps_are_refused_before_anything_is_written(args, message,
                                                                             tmp_path):
    out = driftfl("run", *args, "hydra.run.dir=run", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == message
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


# where driftfl looked for a model's yaml: a user's own may be in another checkout
MODEL_SEARCHED = (f" (searched {REPO}/conf/model/*.yaml, of the driftfl in use, {REPO}/driftfl; a "
                  "model of your own: docs/adding-a-model.md)")
DATA = ["dataset.subset=600", "dataset.test_subset=200"]  # where a regression would load data
GRAMMAR = "(https://hydra.cc/docs/advanced/override_grammar/basic)"


@pytest.mark.parametrize("args, message", [
    # --cfg and --help run nothing, but check the overrides as a run does
    (["--cfg", "job", "roundz=3"], "unknown setting roundz; did you mean rounds?"),
    (["--cfg", "all", "model=vgg"], f"unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, resnet18"
                                    f"{MODEL_SEARCHED}"),
    (["--cfg", "hydra", "hydra.run.dirr=x"],
     "unknown setting hydra.run.dirr; did you mean hydra.run.dir?"),
    (["--info", "config", "roundz=3"], "unknown setting roundz; did you mean rounds?"),
    (["--help", "roundz=3"], "unknown setting roundz; did you mean rounds?"),
    # a traceback once Hydra had made the run directory (numpy's seed takes 32 bits)
    (["seed=-1", *DATA], "seed must be in [0, 4294967295], got -1"),
    (["rounds=99999999999999999999", *DATA],
     "rounds must be in [1, 1000000], got 99999999999999999999"),  # was run
    # refused only inside the launched ServerApp, after its files were written
    (["strategy=scaffold", "strategy.objective=ce", *DATA],
     "strategy=scaffold needs objective=scaffold (its server's update assumes its clients train "
     "with it), got strategy.objective=ce; leave strategy.objective out"),
    (["=3"], "the override =3 names no setting; write key=value, e.g. rounds=3"),
    ([""], f"cannot read the override '': an override is key=value, e.g. rounds=3 {GRAMMAR}"),
    (["rounds"], f"cannot read the override rounds: an override is key=value, e.g. rounds=3 "
                 f"{GRAMMAR}"),
    (["dataset="], "dataset= names no dataset; valid: cifar10, cifar100, emnist, fmnist, folder, "
                   "mnist, npz, svhn"),
    # Hydra wrote .hydra into the current directory
    (["hydra.run.dir=", *DATA],
     "hydra.run.dir is empty; name a directory, e.g. hydra.run.dir=outputs/first"),
    (["-m", "seed=0,1", "hydra.sweep.dir=", *DATA],
     "hydra.sweep.dir is empty; name a directory, e.g. hydra.sweep.dir=outputs/first"),
    (["-m", "seed=0,1", "hydra.sweep.subdir=", *DATA],
     "hydra.sweep.subdir is empty, so every job of the sweep would write the same directory; "
     "leave it at its default (the job's number)"),
    # Hydra's argparse prints its usage
    (["rounds=1", "-m", "seed=0,1"],
     "unrecognized arguments: seed=0,1; the flags (-m, --cfg, ...) go before the overrides, "
     "which go together (driftfl run --help)"),
    (["--cfg"], "argument --cfg/-c: expected one argument (driftfl run --help)"),
])
def test_bad_input_is_one_line_before_anything_is_written(args, message, tmp_path):
    """The run and sweep directories default to folders below the current one, so an empty
    current directory means no run directory, no .hydra and no sweep directory."""
    out = driftfl("run", *args, cwd=tmp_path)
    assert (out.returncode, out.stderr, out.stdout) == (2, f"driftfl: error: {message}\n", "")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # a real process: the refusal as a user meets it
def test_a_typo_is_one_line_from_a_real_process_and_nothing_is_written(tmp_path):
    out = real_driftfl("run", "roundz=3", cwd=tmp_path)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == "driftfl: error: unknown setting roundz; did you mean rounds?\n"
    assert not any(tmp_path.iterdir())


def files_under(folder):
    """Every file below ``folder`` with its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("args, message", [
    (["model=vgg"],
     f"driftfl: error: unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, resnet18{MODEL_SEARCHED}"),
    # a sweep is checked for every swept option before any job runs
    (["-m", "model=cnn,vgg"],
     f"driftfl: error: unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, resnet18{MODEL_SEARCHED}"),
])
def test_unknown_option_of_a_config_group_is_one_line(args, message, tmp_path):
    out = driftfl("run", *args, "hydra.run.dir=run", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == message and out.stdout == ""
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, key", [
    (["hydra.run.dir=/proc/x"], "hydra.run.dir"),
    (["-m", "seed=0,1", "hydra.sweep.dir=/proc/x"], "hydra.sweep.dir"),
])
def test_unwritable_output_directory_is_one_line(args, key, tmp_path):
    out = driftfl("run", *args, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    kind = key.split(".")[1]
    assert re.fullmatch(rf"driftfl: error: cannot write the {kind} directory /proc/x: [^;\n]+; "
                        rf"choose another with {re.escape(key)}=\.\.\.\n", out.stderr)


def test_cannot_write_says_why_and_leaves_nothing(tmp_path):
    from driftfl.common.paths import cannot_write

    (tmp_path / "file").write_text("")
    assert cannot_write(tmp_path / "file" / "run") == f"{tmp_path / 'file'} is not a directory"
    assert cannot_write(tmp_path / "new" / "run") is None and cannot_write(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_non_finite_numbers_are_refused_before_anything_runs(tmp_path):
    # the other settings and NaN: test_config.test_bad_settings_are_refused_with_a_clear_message
    out = driftfl("run", "lr=inf", "rounds=1", "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == "driftfl: error: lr must be a finite number, got inf\n"
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # a real process: refused inside the Hydra job, after Hydra made the directory
def test_refused_run_leaves_an_existing_run_directory_as_it_was(tmp_path, fmnist_available):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- the earlier run's overrides\n")
    (run / "metrics.json").write_text("{}")
    before = files_under(run)
    # refused inside the Hydra job, by prepare_experiment, after Hydra made the run directory
    out = real_driftfl("run", "dataset.subset=200", "partition.alpha=0.01",
                       "partition.min_size=15", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("driftfl: error: Dirichlet(alpha=0.01) could not give each of "
                                 "10 clients") and out.stderr.count("\n") == 1
    assert files_under(run) == before and sorted(run.rglob("*")) == sorted(
        [run / ".hydra", run / ".hydra" / "overrides.yaml", run / "metrics.json"])


def test_a_federation_flwr_does_not_know_is_refused_listing_the_ones_it_does(tmp_path):
    """superlink=NAME runs on a deployed federation: NAME must be a connection of flwr's
    config.toml; anything else is one line, before anything is written or started."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink.federation]\naddress = "127.0.0.1:9091"\n'
                                      '[superlink.local]\naddress = ":local:"\n')
    out = driftfl("run", "superlink=fedration", "hydra.run.dir=new/run", cwd=tmp_path,
                  env={"FLWR_HOME": str(home)})
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"driftfl: error: superlink=fedration: {home / 'config.toml'} has no "
        "[superlink.fedration] connection (valid: federation, local); add it with driftfl "
        "secure connect fedration --address HOST:PORT --root-certificates ca.crt (or "
        "--insecure; docs/deployment.md)")
    assert not (tmp_path / "new").exists()


def test_a_sweep_to_a_place_that_cannot_be_reached_is_refused_before_anything_is_written(
        tmp_path):
    """A Ray cluster that does not answer, or a federation flwr does not know: one line, and no
    sweep directory (not even Hydra's multirun.yaml), whichever launcher runs the jobs."""
    from driftfl.host import free_port

    port = free_port()  # nothing listens there
    home = tmp_path / "flwr-home"
    home.mkdir()
    for target, message in (
            (f"simulation.ray_address=127.0.0.1:{port}",
             f"driftfl: error: no Ray cluster answers at simulation.ray_address=127.0.0.1:{port} ("),
            ("superlink=nowhere", "driftfl: error: superlink=nowhere: no SuperLink connection "
                                  f"'nowhere': {home / 'config.toml'} does not exist yet")):
        for launcher in ([], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]):
            out = driftfl("run", "-m", "seed=0,1", target, *launcher, "hydra.sweep.dir=sweep",
                          cwd=tmp_path, env={"FLWR_HOME": str(home)})
            assert out.returncode == 2 and out.stderr.startswith(message), out.stderr
            assert out.stderr.count("\n") == 1 and out.stdout == ""
            assert [p.name for p in tmp_path.iterdir()] == ["flwr-home"]


def test_refused_run_leaves_no_empty_run_directory(tmp_path):
    out = driftfl("run", f"dataset.root={tmp_path / 'nothing'}", "hydra.run.dir=new/run",
                  cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith(f"driftfl: error: Fashion-MNIST not found in {tmp_path}/nothing")
    assert not (tmp_path / "new").exists()


def test_an_accepted_run_gets_the_files_hydra_would_have_written(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from driftfl.cli import NO_HYDRA_FILES, _save_hydra_files
    from driftfl.common.composing import conf_dir

    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["rounds=2", NO_HYDRA_FILES], return_hydra_config=True)
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    HydraConfig.instance().set_config(cfg)
    try:
        _save_hydra_files(task, tmp_path, ".hydra")
    finally:
        HydraConfig.instance().cfg = None
    saved = {p.name: OmegaConf.load(p) for p in (tmp_path / ".hydra").iterdir()}
    assert saved["overrides.yaml"] == ["rounds=2"] and saved["config.yaml"].rounds == 2
    assert saved["hydra.yaml"].hydra.output_subdir == ".hydra"
    assert NO_HYDRA_FILES not in saved["hydra.yaml"].hydra.overrides.hydra


def test_launch_refuses_what_it_cannot_pass_on_before_writing(tmp_path):
    from driftfl.common.config import compose
    from driftfl.common.errors import ConfigError
    from driftfl.launch import launch_simulation

    with pytest.raises(ConfigError, match=r"cannot contain single quotes"):
        launch_simulation(compose([]), ["label=\"it's\""], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_flwr_run_gets_a_copy_of_the_app_that_bundles_to_the_same_bytes(tmp_path):
    """`flwr run` reads every file under the folder it gets (the repository's .venv too)
    before filtering them: driftfl hands it a copy holding only what the bundle takes."""
    from flwr.cli.build import build_fab_from_disk

    from driftfl.host import APP_DIR
    from driftfl.launch import app_bundle

    with app_bundle() as copy:
        files = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
        assert build_fab_from_disk(copy) == build_fab_from_disk(APP_DIR)
    assert "pyproject.toml" in files and "driftfl/server/app.py" in files
    assert "conf/config.yaml" in files
    assert all(f == "pyproject.toml" or f.startswith(("driftfl/", "conf/")) for f in files)
    assert not copy.exists()


def test_cfg_job_prints_the_composed_experiment(tmp_path):
    out = driftfl("run", "--cfg", "job", "strategy=fedprox", cwd=tmp_path)
    assert out.returncode == 0 and "objective: prox" in out.stdout


def test_ctrl_c_before_a_run_starts_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C while the data loads or Hydra composes: no KeyboardInterrupt traceback."""
    from driftfl import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run", interrupted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "rounds=3"])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "driftfl: stopped\n"
