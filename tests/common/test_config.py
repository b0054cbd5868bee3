"""Composing experiments, and bad input refused with one clear message before any work."""

from __future__ import annotations

import pytest

from driftfl.common.composing import experiment_only, parse_overrides
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.server.experiment import prepare_experiment


def test_defaults_are_the_main_job():
    cfg = compose([])
    assert (cfg.strategy.name, cfg.dataset.name, cfg.partition.name, cfg.model.name) == (
        "fedavg", "fmnist", "dirichlet", "cnn")
    assert cfg.partition.alpha == 0.5 and cfg.num_clients == 10 and cfg.fraction == 1.0
    assert "hydra" not in cfg


def test_overrides_compose_groups_and_values():
    cfg = compose(["strategy=fedprox", "strategy.mu=0.001", "partition=pathological",
                   "partition.classes_per_client=3", "model=mlp", "num_clients=20",
                   "fraction=0.25", "dataset.subset=1000"])
    assert cfg.strategy.mu == 0.001 and cfg.strategy.objective == "prox"
    assert cfg.partition.classes_per_client == 3 and cfg.model.hidden == [200, 200]
    assert cfg.dataset.subset == 1000


def test_overrides_parse_as_json_list_or_shell_words():
    assert parse_overrides('["a=1", "b=x y"]') == ["a=1", "b=x y"]
    assert parse_overrides("a=1 'b=x y'") == ["a=1", "b=x y"]
    assert parse_overrides("") == []


@pytest.mark.parametrize("group", ["strategy", "aggregation", "selection", "dataset",
                                   "partition", "model", "experiment"])
def test_unknown_group_option_is_one_line_with_the_valid_ones(group):
    from conftest import REPO

    valid = sorted(path.stem for path in (REPO / "conf" / group).glob("*.yaml"))
    plus = "+" if group == "experiment" else ""  # experiment is no default: it is added
    with pytest.raises(ConfigError) as refused:
        compose([f"{plus}{group}=foo"])
    # a model may be the user's own: where its yaml was looked for (docs/adding-a-model.md)
    where = (f" (searched {REPO}/conf/model/*.yaml, of the driftfl in use, {REPO}/driftfl; a "
             "model of your own: docs/adding-a-model.md)" if group == "model" else "")
    assert str(refused.value) == f"unknown {group} 'foo'; valid: {', '.join(valid)}{where}"


def test_a_group_outside_the_defaults_is_added_with_plus():
    with pytest.raises(ConfigError, match=r"^experiment is not in the defaults; add it with "
                                          r"\+experiment=fedcsd_m1$"):
        compose(["experiment=fedcsd_m1"])


@pytest.mark.parametrize("override, message", [
    ("roundz=3", "unknown setting roundz; did you mean rounds?"),
    ("partition.alpah=0.1", "unknown setting partition.alpah; did you mean partition.alpha?"),
])
def test_unknown_key_is_refused_with_the_nearest_valid_name(override, message):
    with pytest.raises(ConfigError, match=message):
        compose([override])


@pytest.mark.parametrize("overrides, message", [
    (["strategy=fedavg", "strategy.mu=0.1"],
     "strategy.mu is not a setting of strategy=fedavg; methods that have it: fedcsd, fedproto, "
     "fedprox, moon"),
    (["model.hidden=[8]"], "model.hidden is not a setting of model=cnn; models that have it: mlp"),
    (["privacy.clip=1"], "privacy.clip is not a setting of privacy=none; privacy options that "
                         "have it: central, distributed"),
    # no method has it: the chosen one's nearest key, as for any typo
    (["strategy=fedprox", "strategy.muu=0.1"],
     "unknown setting strategy.muu; did you mean strategy.mu?"),
])
def test_a_setting_of_another_option_names_the_options_that_have_it(overrides, message):
    with pytest.raises(ConfigError) as refused:
        compose(overrides)
    assert str(refused.value) == message


def test_the_options_that_have_a_setting_are_read_from_their_yaml():
    from driftfl.common.composing import group_options, options_with

    assert options_with("strategy", ["ipc"]) == ["dcfl"]
    assert options_with("strategy", ["name"]) == group_options("strategy")
    assert options_with("rounds", ["x"]) == []  # no config group


@pytest.mark.parametrize("override, message", [
    ("roundz=3", "unknown setting roundz; did you mean rounds?"),
    ("strategy.mu=0.1", "strategy.mu is not a setting of strategy=fedavg; methods that have it"),
])
def test_a_mistyped_setting_is_refused_before_torch_or_flower_is_imported(override, message):
    """What makes the refusal take a fraction of a second rather than several (the imports of
    torch and Flower; benchmarks/typo_refusal.py measures it)."""
    import subprocess
    import sys

    probe = ("import sys; from driftfl.cli import refusal; print(refusal(sys.argv[1:])); "
             "print(sorted({'torch', 'flwr', 'ray'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", probe, override], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].startswith(message) and out[1] == "[]"


@pytest.mark.parametrize("overrides, message", [
    # Hydra: a dozen lines, or a ValueError's traceback
    (["dataset="], "dataset= names no dataset; valid: cifar10, cifar100, emnist, fmnist, folder, "
                   "mnist, npz, svhn"),
    (["model=3"], "model=3 names no model; valid: cnn, convnet, lenet5, mlp, resnet18"),
    (["strategy=null"], "strategy=null names no strategy; valid: dcfl, fedavg, "),
    (["=3"], "the override =3 names no setting; write key=value, e.g. rounds=3"),
    # Hydra's advice is a defaults-list line
    (["+dataset=mnist"],
     "dataset is in the defaults already; choose another one without +: dataset=mnist"),
    # a section's name mistyped: the section, not its key, is what was meant
    (["partitoin.alpha=1"], "unknown setting partitoin; did you mean partition?"),
    (["rounds=${nowhere}"], "rounds: Interpolation key 'nowhere' not found"),
])
def test_overrides_hydra_cannot_use_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        compose(overrides)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


@pytest.mark.parametrize("override, message", [
    ("hydra.run.dirr=x", "unknown setting hydra.run.dirr; did you mean hydra.run.dir?"),
    ("hydra.runn.dir=x", "unknown setting hydra.runn; did you mean hydra.run?"),
    ("hydra.run.dir=${oops}", "hydra.run.dir: Interpolation key 'oops' not found"),
    ("hydra.run.dir=null", "Error merging override hydra.run.dir=null: field 'hydra.run.dir' is "
                           "not Optional"),
])
def test_hydra_settings_hydra_cannot_use_are_one_line(override, message):
    from driftfl.common.composing import hydra_section

    with pytest.raises(ConfigError) as refused:
        hydra_section([override])
    assert str(refused.value) == message


def test_required_settings_must_be_given():
    with pytest.raises(ConfigError, match=r"missing required setting\(s\): dataset.root"):
        compose(["dataset=folder"])


@pytest.mark.parametrize("override, message", [
    ("fraction=0", r"fraction must be in \(0, 1\], got 0"),
    ("fraction=1.5", r"fraction must be in \(0, 1\], got 1.5"),
    ("rounds=0", r"rounds must be in \[1, 1000000\], got 0"),
    # a slip of the keyboard is refused, not run for ever or overflowing an int64
    ("rounds=99999999999999999999", r"rounds must be in \[1, 1000000\], got 99999999999999999999"),
    ("local_epochs=0", r"local_epochs must be in \[1, 1000000\]"),
    ("local_epochs=10000000", r"local_epochs must be in \[1, 1000000\], got 10000000"),
    ("num_clients=10000000", r"num_clients must be in \[1, 1000000\], got 10000000"),
    ("batch_size=10000000", r"batch_size must be in \[1, 1000000\], got 10000000"),
    ("min_clients=10000000", r"min_clients must be in \[1, 1000000\], got 10000000"),
    ("logit_shift_samples=10000000", r"logit_shift_samples must be in \[0, 1000000\]"),
    ("eval_batch_size=10000000", r"eval_batch_size must be in \[1, 1000000\]"),
    ("round_timeout=1e9", r"round_timeout must be in \(0, 2592000\], got 1000000000.0"),
    ("node_wait=1e9", r"node_wait must be in \(0, 2592000\]"),
    ("rejoin_wait=1e9", r"rejoin_wait must be in \[0, 2592000\]"),
    # numpy's global seed takes 32 bits: the ServerApp refused these with a traceback
    ("seed=-1", r"seed must be in \[0, 4294967295\], got -1"),
    ("seed=4294967296", r"seed must be in \[0, 4294967295\], got 4294967296"),
    ("simulation.client_gpus=2", r"simulation.client_gpus must be in \[0, 1\], got 2"),
    ("simulation.client_cpus=2000", r"simulation.client_cpus must be in \[1, 1024\]"),
    # every count of every section is bounded, not only the experiment's own
    ("dataset.subset=99999999999", r"dataset.subset must be in \[1, 1000000\]"),
    ("partition.min_size=99999999999", r"partition.min_size must be in \[0, 1000000\]"),
    ("strategy=dcfl strategy.pretrain_epochs=99999999999",
     r"strategy.pretrain_epochs must be in \[0, 1000000\]"),
    ("strategy=dcfl strategy.condense_iterations=99999999999",
     r"strategy.condense_iterations must be in \[1, 1000000\]"),
    ("strategy=fedssd strategy.aux_per_class=99999999999",
     r"strategy.aux_per_class must be in \[1, 1000000\]"),
    ("aggregation=krum aggregation.num_malicious=99999999999",
     r"aggregation.num_malicious must be in \[0, 1000000\]"),
    ("model=mlp model.hidden=[99999999999]", "model.hidden.0 must be <= 1000000, got 99999999999"),
    ("lr=-0.1", "lr must be > 0"),
    ("momentum=1", r"momentum must be in \[0, 1\)"),
    ("batch_size=2.5", "batch_size must be a whole number"),
    ("device=tpu", "unknown device 'tpu'; valid: cpu, cuda"),
    ("lr=inf", "lr must be a finite number, got inf"),
    ("lr=nan", "lr must be a finite number, got nan"),
    ("momentum=nan", "momentum must be a finite number, got nan"),
    ("weight_decay=-inf", "weight_decay must be a finite number, got -inf"),
    ("strategy=fedprox strategy.mu=inf", "strategy.mu must be a finite number, got inf"),
    ("strategy=fedcsd strategy.tau=nan", "strategy.tau must be a finite number, got nan"),
    ("aggregation=feddisco aggregation.a=inf", "aggregation.a must be a finite number, got inf"),
    ("aggregation=feddisco aggregation.metric=cosine",
     "unknown aggregation.metric 'cosine'; valid: kl, l2"),
    ("strategy=fedproto strategy.prototype_mean=median",
     "unknown strategy.prototype_mean 'median'; valid: plain, weighted"),
    ("seed=1.5", "seed must be a whole number, got 1.5"),
    ("partition.alpha=abc", "partition.alpha must be a number, got 'abc'"),
    ("verbose=maybe", "verbose must be true or false, got 'maybe'"),
    ("+simulation.gpus=1",
     "unknown setting simulation.gpus; valid: simulation.client_cpus, simulation.client_gpus"),
    ("simulation.client_cpus=0", r"simulation.client_cpus must be in \[1, 1024\], got 0"),
    ("partition.alpha=0", "partition.alpha must be > 0, got 0"),
    ("partition=pathological partition.classes_per_client=11",
     r"classes_per_client must be in 1..10, got 11"),
    ("partition=pathological partition.classes_per_client=0",
     r"classes_per_client must be in 1..10, got 0"),
    ("num_clients=200 dataset.subset=100", "num_clients=200 is more than the 100 training"),
    ("dataset.subset=0", r"dataset.subset must be in \[1, 1000000\], got 0"),
    ("strategy.name=fedfoo", "unknown strategy 'fedfoo'; valid: dcfl, fedavg, fedavgm, fedcad, fedcsd"),
    ("strategy.objective=kd", "unknown objective 'kd'; valid: cad, ce, csd, curv, dyn, gkd, lsd, moon, ntd"),
    ("strategy=fedprox strategy.mu=-1", "strategy.mu must be >= 0, got -1"),
    ("strategy=fedavgm strategy.server_momentum=1.0",
     r"strategy.server_momentum must be in \[0, 1\), got 1.0"),
    ("strategy=fedcsd strategy.mask=soft", "unknown strategy.mask 'soft'; valid: adaptive, forcible"),
    ("strategy=fedcsd strategy.prototypes=never", "unknown strategy.prototypes 'never'"),
    ("strategy=fedcsd strategy.tau=0", "strategy.tau must be > 0, got 0"),
    ("strategy=fedcsd strategy.alpha=1", r"strategy.alpha must be in \[0, 1\), got 1"),
    ("strategy=fedcsd strategy.similarity=yes", "strategy.similarity must be true or false"),
    ("strategy=fedcsd +strategy.muu=1", "unknown setting strategy.muu; did you mean strategy.mu?"),
    ("strategy=fedlsd strategy.beta=1.5", r"strategy.beta must be in \[0, 1\], got 1.5"),
    ("strategy=fedgkd strategy.buffer_size=0", r"strategy.buffer_size must be in \[1, 1000000\], got 0"),
    ("strategy=fedgkd strategy.buffer_size=2.5", "strategy.buffer_size must be a whole number"),
    ("strategy.objective=csd", "objective 'csd' needs prototypes, teacher from the server, which "
                               "strategy 'fedavg' does not send"),
    # the ServerApp refused these only once launched: check_experiment refuses them up front
    ("strategy=scaffold strategy.objective=ce",
     "strategy=scaffold needs objective=scaffold .*, got strategy.objective=ce"),
    ("strategy=feddyn strategy.objective=prox",
     "strategy=feddyn needs objective=dyn .*, got strategy.objective=prox"),
    ("strategy=fedssd strategy.aux_per_class=0", r"strategy.aux_per_class must be in \[1, 1000000\], got 0"),
    ("strategy=fedssd strategy.aux_per_class=7000", "wants 7000 samples of class 0, which has only"),
    ("strategy=fedssd strategy.psi=cube", "unknown strategy.psi 'cube'; valid: identity, sqrt"),
    ("strategy=fedssd strategy.distill_loss=l1", "unknown strategy.distill_loss 'l1'"),
    ("strategy=fedcad strategy.gamma_min=0.6",
     r"strategy.gamma_max must be >= gamma_min \(0.6\), got 0.5"),
    ("strategy=fedcad strategy.alpha_source=test", "unknown strategy.alpha_source 'test'"),
    ("model.name=vgg", "unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, resnet18"),
    ("model=mlp model.hidden=[8,0]", "model.hidden.1 must be >= 1, got 0"),
    ("aggregation.name=bulyan", "unknown aggregation 'bulyan'; valid: feddisco, fednova, krum, mean, median, trimmed_mean"),
    ("selection.name=random", "unknown selection 'random'; valid: cka, uniform"),
    ("dataset.name=imagenet", "unknown dataset 'imagenet'; valid: cifar10, cifar100, emnist, fmnist"),
])
def test_bad_settings_are_refused_with_a_clear_message(override, message, fmnist_available):
    with pytest.raises(ConfigError, match=message):
        prepare_experiment(compose(override.split()))


def test_cuda_is_accepted_only_where_torch_sees_a_gpu(fmnist_available):
    import torch

    cfg = compose(["device=cuda", "dataset.subset=100"])
    if torch.cuda.is_available():
        prepare_experiment(cfg)
    else:
        with pytest.raises(ConfigError, match="device=cuda but PyTorch sees no CUDA GPU"):
            prepare_experiment(cfg)


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(ConfigError, match=r"Fashion-MNIST not found in .*apt-get install -y "
                                          r"dataset-fashion-mnist.*dataset.download=true"):
        prepare_experiment(compose([f"dataset.root={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"CIFAR-10 not found in .*dataset.download=true"):
        prepare_experiment(compose(["dataset=cifar10", f"dataset.root={tmp_path}"]))


def test_folder_without_images_is_refused(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no images found"):
        prepare_experiment(compose(["dataset=folder", f"dataset.root={tmp_path}"]))


def test_impossible_dirichlet_fails_before_training(fmnist_available):
    cfg = compose(["partition.alpha=0.001", "partition.min_size=500", "num_clients=100",
                   "dataset.subset=60000"])
    with pytest.raises(ConfigError, match="could not give each of 100 clients"):
        prepare_experiment(cfg, make_partition=True)


def test_experiment_only_drops_hydra_and_resolves():
    from omegaconf import OmegaConf

    cfg = experiment_only(OmegaConf.create({"a": 1, "b": "${a}", "hydra": {"x": 1}}))
    assert cfg == {"a": 1, "b": 1}


ABLATIONS = {  # paper Table III and IV: (similarity, mask, TMA)
    "fedcsd_base": (False, "off", False), "fedcsd_m1": (True, "adaptive", False),
    "fedcsd_m2": (True, "off", True), "fedcsd_m3": (False, "adaptive", True),
    "fedcsd_forcible": (True, "forcible", True)}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_fedcsd_ablation_rows_are_one_override_away(name, fmnist_available):
    cfg = compose([f"+experiment={name}", "dataset.subset=500"])
    assert (cfg.strategy.similarity, cfg.strategy.mask, cfg.strategy.tma) == ABLATIONS[name]
    assert cfg.label.startswith("fedcsd-") and cfg.strategy.name == "fedcsd"
    prepare_experiment(cfg)


def test_every_ready_experiment_composes_and_passes_the_checks(fmnist_available):
    from conftest import REPO

    for path in sorted((REPO / "conf" / "experiment").glob("*.yaml")):
        cfg = compose([f"+experiment=[fmnist_label_skew,{path.stem}]", "dataset.subset=2000"])
        prepare_experiment(cfg)
    cfg = compose(["+experiment=[fmnist_label_skew,fedssd_kl]"])
    assert cfg.label == "fedssd-KL" and cfg.strategy.distill_loss == "kl"
    assert (cfg.model.name, cfg.rounds, cfg.local_epochs, cfg.lr) == ("lenet5", 20, 5, 0.01)
