"""Models, each split into a feature extractor (``features``) and a linear head (``head``).

Distillation, prototype and contrastive methods need the features and the logits separately, so
every model is a DriftModel: ``forward`` is ``head(features(x))``. A model is a function that
builds one, registered under the name ``model=`` takes with ``@register_model``; the built-ins
below register themselves the way a user's own model in driftfl/models/ does
(docs/adding-a-model.md).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping
from functools import cache

import torch
from torch import nn

from .composing import installation
from .errors import ConfigError
from .model_settings import (  # noqa: F401  (declared there, torch-free; imported from here)
    BUILT_IN_MODELS, MlpSettings, ModelSettings)
from .settings import section

# the package whose every module is imported before a model is looked up: users' own models
USER_MODELS = "driftfl.models"


class DriftModel(nn.Module):
    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.features = features
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# build(shape, num_classes, **its settings beyond name and projection) -> DriftModel
ModelBuilder = Callable[..., DriftModel]

# name -> (its settings, the function that builds it from them)
MODELS: dict[str, tuple[type[ModelSettings], ModelBuilder]] = {}


def register_model(name: str, settings: type[ModelSettings] = ModelSettings
                   ) -> Callable[[ModelBuilder], ModelBuilder]:
    """Register the decorated ``build(shape, num_classes, **settings)`` as ``model=<name>``;
    ``settings`` is the section's schema, whose fields beyond ``name`` and ``projection`` are
    passed to ``build``."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise ConfigError(f"model name {name!r} must be letters, digits and _ (a yaml's name "
                          "in conf/model/)")
    if not (isinstance(settings, type) and issubclass(settings, ModelSettings)):
        raise ConfigError(f"model '{name}': settings must subclass ModelSettings, got {settings!r}")

    def register(build: ModelBuilder) -> ModelBuilder:
        known = MODELS.get(name)
        if known and _origin(known[1]) != _origin(build):  # a module imported again is no clash
            raise ConfigError(f"model '{name}' is registered twice: {_origin(known[1])} and "
                              f"{_origin(build)}; rename one")
        MODELS[name] = (settings, build)
        return build
    return register


def _origin(build: ModelBuilder) -> str:
    return f"{build.__module__}.{build.__qualname__}"


@cache
def _import_user_models() -> None:
    """Import every module of driftfl/models/ once, so that their models register themselves.
    Only modules of the app's own package are imported: no message or setting names one."""
    package = importlib.import_module(USER_MODELS)
    for module in pkgutil.iter_modules(package.__path__, f"{USER_MODELS}."):
        try:
            importlib.import_module(module.name)
        except ConfigError:
            raise
        except Exception as err:  # a user's module: say which, in one line
            raise ConfigError(f"{module.name} cannot be imported: {type(err).__name__}: "
                              f"{err}") from err


def registered_models() -> dict[str, tuple[type[ModelSettings], ModelBuilder]]:
    """Every model by name: the built-ins and those of driftfl/models/."""
    _import_user_models()
    return MODELS


class Projected(nn.Module):
    """A feature extractor followed by MOON's projection head (Li et al. 2021, Sec. 3.2)."""

    def __init__(self, body: nn.Module, feature_dim: int, out_dim: int):
        super().__init__()
        self.body = body
        self.projection = nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.ReLU(),
                                        nn.Linear(feature_dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.body(x))


def with_projection(model: DriftModel, out_dim: int) -> DriftModel:
    """``model`` with the projection head between its features and a new head of input out_dim."""
    model.features = Projected(model.features, model.head.in_features, out_dim)
    model.head = nn.Linear(out_dim, model.head.out_features)
    return model


def _flat_dim(body: nn.Module, shape) -> int:
    with torch.no_grad():
        return int(body(torch.zeros(1, *shape)).shape[1])


@register_model("mlp", settings=MlpSettings)
def mlp(shape, num_classes, hidden=(200, 200)) -> DriftModel:
    layers: list[nn.Module] = [nn.Flatten()]
    width = shape[0] * shape[1] * shape[2]
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    return DriftModel(nn.Sequential(*layers), width, num_classes)


@register_model("cnn")
def cnn(shape, num_classes) -> DriftModel:
    """The CNN of McMahan et al. (FedAvg): two 5x5 conv layers (32, 64), max-pooling, fc 512."""
    conv = nn.Sequential(
        nn.Conv2d(shape[0], 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    body = nn.Sequential(conv, nn.Linear(_flat_dim(conv, shape), 512), nn.ReLU())
    return DriftModel(body, 512, num_classes)


@register_model("lenet5")
def lenet5(shape, num_classes) -> DriftModel:
    """LeNet-5 as in the FedAvg/FedSSD experiments: conv 6, conv 16, fc 120, fc 84."""
    conv = nn.Sequential(
        nn.Conv2d(shape[0], 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    body = nn.Sequential(conv, nn.Linear(_flat_dim(conv, shape), 120), nn.ReLU(),
                         nn.Linear(120, 84), nn.ReLU())
    return DriftModel(body, 84, num_classes)


@register_model("convnet")
def convnet(shape, num_classes) -> DriftModel:
    """The dataset-condensation papers' ConvNet (Zhao & Bilen: DC, DSA, DM), which their
    condensed sets are trained and scored on: 3 blocks of conv3x3(128) - instance norm - ReLU -
    avg-pool 2, then a linear classifier (28x28 images: 128 x 3 x 3 features). Instance norm
    (GroupNorm with a group per channel) keeps each image's features independent of the batch."""
    layers: list[nn.Module] = []
    channels = shape[0]
    for _ in range(3):
        layers += [nn.Conv2d(channels, 128, 3, padding=1), nn.GroupNorm(128, 128, affine=True),
                   nn.ReLU(), nn.AvgPool2d(2)]
        channels = 128
    body = nn.Sequential(*layers, nn.Flatten())
    return DriftModel(body, _flat_dim(body, shape), num_classes)


@register_model("resnet18")
def resnet18(shape, num_classes) -> DriftModel:
    """torchvision ResNet-18 for small images: 3x3 stride-1 stem and no max-pool."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(shape[0], 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    feature_dim = net.fc.in_features
    net.fc = nn.Identity()
    return DriftModel(net, feature_dim, num_classes)


def model_settings(spec: Mapping | ModelSettings) -> ModelSettings:
    table = {name: entry[0] for name, entry in registered_models().items()}
    if not isinstance(spec, ModelSettings) and spec.get("name") not in table:
        folders = ", ".join(importlib.import_module(USER_MODELS).__path__)
        raise ConfigError(f"unknown model '{spec.get('name')}'; valid: {', '.join(sorted(table))} "
                          f"(the built-ins and those the modules in {folders} register, of the "
                          f"driftfl in use, {installation()}; a model of your own: "
                          "docs/adding-a-model.md)")
    return section("model", spec, table)


def build_model(spec: Mapping | ModelSettings, shape, num_classes: int) -> DriftModel:
    """The model a ``model`` section names, for images of ``shape`` (C, H, W)."""
    spec = model_settings(spec)
    shape = tuple(shape)
    try:
        model = MODELS[spec.name][1](shape, num_classes,
                                    **spec.model_dump(exclude={"name", "projection"}))
        _check_contract(spec, model, shape, num_classes)
    except RuntimeError as err:  # e.g. images too small for the conv stack
        raise ConfigError(f"model '{spec.name}' cannot take images of shape "
                          f"{shape}: {err}") from None
    return with_projection(model, spec.projection) if spec.projection else model


# (settings, shape, classes) already checked in this process: the check costs a forward pass
_checked: set[tuple[str, tuple, int]] = set()


def _check_contract(spec: ModelSettings, model: DriftModel, shape: tuple, num_classes: int):
    """ConfigError in one line when a built model breaks what every method relies on: a
    DriftModel whose ``features`` give (N, d) and whose linear ``head`` maps d to the classes."""
    key = (spec.model_dump_json(), shape, num_classes)
    if key in _checked:
        return
    name = f"model '{spec.name}'"
    if not isinstance(model, DriftModel) or type(model).forward is not DriftModel.forward:
        raise ConfigError(f"{name} must build DriftModel(features, feature_dim, num_classes), "
                          f"whose forward is head(features(x)); got {type(model).__name__}")
    head = model.head
    if not isinstance(head, nn.Linear) or head.out_features != num_classes:
        raise ConfigError(f"{name}: its head must be nn.Linear(feature_dim, {num_classes}), "
                          f"got {head}")
    was_training = model.training
    with torch.no_grad():
        features = model.eval().features(torch.zeros(2, *shape))
    model.train(was_training)
    got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
    if got != (2, head.in_features):
        raise ConfigError(f"{name}: its features of 2 images {shape} have shape {got}, "
                          f"expected (2, {head.in_features}); flatten them (nn.Flatten()) "
                          "and pass their width as feature_dim")
    _checked.add(key)
