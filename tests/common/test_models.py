"""Every model splits into features and a linear head, for any image shape it can take; a
user's own model registers itself from driftfl/models/ and is held to the same contract."""

from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from driftfl.common import models
from driftfl.common.errors import ConfigError
from driftfl.common.models import MODELS, build_model
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_forward_is_head_of_features(name, shape):
    model = build_model({"name": name}, shape, 7).eval()
    x = torch.randn(2, *shape)
    features = model.features(x)
    assert features.ndim == 2 and features.shape[1] == model.head.in_features
    assert torch.allclose(model(x), model.head(features))
    assert model(x).shape == (2, 7)


def test_fedavg_cnn_and_lenet5_sizes():
    cnn = build_model({"name": "cnn"}, (1, 28, 28), 10)
    assert sum(p.numel() for p in cnn.parameters()) == 1_663_370  # McMahan et al.'s CNN
    lenet = build_model({"name": "lenet5"}, (3, 32, 32), 10)
    assert lenet.features[1].in_features == 16 * 5 * 5  # 6/16/120/84 on CIFAR


@pytest.mark.parametrize("shape, width", [((1, 28, 28), 128 * 3 * 3), ((3, 32, 32), 128 * 4 * 4)])
def test_convnet_is_the_condensation_papers_and_normalises_each_image_alone(shape, width):
    """Zhao & Bilen's ConvNet: three conv(128)-pool blocks; instance norm, so an image's
    features are the same whatever else is in the batch (unlike BatchNorm)."""
    net = build_model({"name": "convnet"}, shape, 10).eval()
    assert net.head.in_features == width
    assert sum(isinstance(m, torch.nn.GroupNorm) for m in net.modules()) == 3
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        alone, together = net.features(x[:1]), net.features(x)[:1]
        others = net.features(torch.cat([x[:1], 5 * x[1:] + 3]))[:1]
    assert torch.allclose(alone, together, atol=1e-5) and torch.allclose(alone, others, atol=1e-5)


def test_mlp_hidden_sizes_come_from_config():
    mlp = build_model({"name": "mlp", "hidden": [64]}, (1, 8, 8), 3)
    assert mlp.head.in_features == 64


def test_resnet18_keeps_small_images_at_full_resolution():
    net = build_model({"name": "resnet18"}, (3, 32, 32), 10)
    assert net.features.conv1.stride == (1, 1)
    assert isinstance(net.features.maxpool, torch.nn.Identity)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())


def test_unknown_model_lists_the_valid_ones_and_where_driftfl_looked():
    """A module added to another checkout than the driftfl in use is not found: the message
    names the folder searched and the installation."""
    import driftfl

    package = Path(driftfl.__file__).resolve().parent
    with pytest.raises(ConfigError) as refused:
        build_model({"name": "vgg"}, (1, 28, 28), 10)
    assert str(refused.value) == (
        f"unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, resnet18 (the built-ins and those the "
        f"modules in {package / 'models'} register, of the driftfl in use, {package}; a model "
        "of your own: docs/adding-a-model.md)")


def test_images_too_small_for_the_model_are_a_config_error():
    with pytest.raises(ConfigError, match="cannot take images of shape"):
        build_model({"name": "lenet5"}, (1, 8, 8), 10)


# --- the registry: a user's own model in driftfl/models/ ---------------------------------------

@pytest.fixture
def user_models(monkeypatch, tmp_path):
    """A folder read as part of driftfl/models/ during the test; the registry as it was after."""
    import driftfl.models

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(models, "_checked", set())
    monkeypatch.setattr(driftfl.models, "__path__", [*driftfl.models.__path__, str(tmp_path)])
    models._import_user_models.cache_clear()
    yield tmp_path
    models._import_user_models.cache_clear()
    for name, module in list(sys.modules.items()):
        if str(tmp_path) in str(getattr(module, "__file__", "")):
            del sys.modules[name]


def add_model_module(folder, module: str, source: str) -> None:
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    importlib.invalidate_caches()


def tiny_model(builds: str, name: str = "tiny") -> str:
    """A user's module registering ``name``, whose function returns ``builds``."""
    return f"""
        import torch
        from torch import nn
        from driftfl.common.models import DriftModel, register_model

        class Shortcut(DriftModel):
            def forward(self, x):
                return self.head(self.features(x)) + 1

        @register_model("{name}")
        def tiny(shape, num_classes):
            return {builds}
        """


def test_a_model_in_the_user_folder_is_found_by_name_and_trains(user_models):
    add_model_module(user_models, "tiny", tiny_model(
        "DriftModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU()), 16, num_classes)"))
    model = build_model({"name": "tiny"}, (1, 8, 8), 3)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    stats = train_locally(model, x, y, TrainSettings(1, 4, 0.1, 0.0, 0.0), CrossEntropy(),
                          torch.Generator().manual_seed(0))
    assert stats.steps == 1 and all(not torch.equal(a, b)
                                    for a, b in zip(before, model.parameters()))
    folders = f"[^ ]+, {re.escape(str(user_models))}"  # driftfl/models/, then the test's
    with pytest.raises(ConfigError, match=f"unknown model 'vgg'; valid: cnn, convnet, lenet5, mlp, "
                                          f"resnet18, tiny \\(the built-ins and those the "
                                          f"modules in {folders} register"):
        build_model({"name": "vgg"}, (1, 8, 8), 3)


@pytest.mark.parametrize("builds, refusal", [
    ("nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))",
     "model 'tiny' must build DriftModel(features, feature_dim, num_classes), whose forward is "
     "head(features(x)); got Sequential"),
    ("Shortcut(nn.Flatten(), 64, num_classes)",
     "model 'tiny' must build DriftModel(features, feature_dim, num_classes), whose forward is "
     "head(features(x)); got Shortcut"),
    ("DriftModel(nn.Identity(), 64, num_classes)",
     "model 'tiny': its features of 2 images (1, 8, 8) have shape (2, 1, 8, 8), expected (2, 64); "
     "flatten them (nn.Flatten()) and pass their width as feature_dim"),
    ("DriftModel(nn.Flatten(), 64, 10)",
     "model 'tiny': its head must be nn.Linear(feature_dim, 3), "
     "got Linear(in_features=64, out_features=10, bias=True)"),
])
def test_a_model_that_breaks_the_contract_is_refused_in_one_line(user_models, builds, refusal):
    add_model_module(user_models, "tiny", tiny_model(builds))
    with pytest.raises(ConfigError) as refused:
        build_model({"name": "tiny"}, (1, 8, 8), 3)
    assert str(refused.value) == refusal


def test_a_name_is_registered_once(user_models):
    builds = "DriftModel(nn.Flatten(), 64, num_classes)"
    add_model_module(user_models, "first", tiny_model(builds))
    add_model_module(user_models, "second", tiny_model(builds))
    with pytest.raises(ConfigError, match=r"^model 'tiny' is registered twice: "
                                          r"driftfl.models.first.tiny and "
                                          r"driftfl.models.second.tiny; rename one$"):
        build_model({"name": "tiny"}, (1, 8, 8), 3)
    with pytest.raises(ConfigError, match="model 'cnn' is registered twice"):
        models.register_model("cnn")(lambda shape, num_classes: None)


def test_a_user_module_that_cannot_be_imported_is_named_in_one_line(user_models):
    add_model_module(user_models, "broken", "import no_such_package\n")
    with pytest.raises(ConfigError, match=r"^driftfl.models.broken cannot be imported: "
                                          r"ModuleNotFoundError: No module named "
                                          r"'no_such_package'$"):
        build_model({"name": "cnn"}, (1, 28, 28), 10)


def test_a_registration_needs_a_plain_name_and_a_settings_schema():
    with pytest.raises(ConfigError, match="model name 'my-net' must be letters, digits and _"):
        models.register_model("my-net")
    with pytest.raises(ConfigError, match="model 'mynet': settings must subclass ModelSettings"):
        models.register_model("mynet", settings=dict)


def test_a_model_name_never_makes_a_node_import_a_module(user_models, tmp_path_factory,
                                                          monkeypatch):
    """Only the modules of driftfl/models/ are imported; a name that is a module elsewhere
    (here one that would record being imported) is an unknown model."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "sneaky.py").write_text("import os\nos.environ['SNEAKY_IMPORTED'] = '1'\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.delenv("SNEAKY_IMPORTED", raising=False)
    for name in ("sneaky", "driftfl.models.sneaky"):
        with pytest.raises(ConfigError, match=f"unknown model '{name}'; valid: "):
            build_model({"name": name}, (1, 28, 28), 10)
    assert "SNEAKY_IMPORTED" not in os.environ and "sneaky" not in sys.modules
