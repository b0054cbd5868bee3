"""Models, each split into a feature extractor (``features``) and a linear head (``head``).

Distillation, prototype and contrastive methods need the features and the logits separately, so
every model exposes both; ``forward`` is simply ``head(features(x))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated

import torch
from pydantic import Field
from torch import nn

from .errors import ConfigError
from .settings import Settings, section


class ModelSettings(Settings):
    """The ``model`` section; most models take nothing more than their name."""

    name: str
    # MOON's projection head, for any model: 0 none; n > 0: Linear(d, d) - ReLU - Linear(d, n)
    # after the features, so that ``features`` returns the projection and the head classifies it
    projection: int = Field(0, ge=0)


class MlpSettings(ModelSettings):
    hidden: list[Annotated[int, Field(ge=1)]] = [200, 200]  # widths of the hidden layers


class DriftModel(nn.Module):
    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.features = features
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


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


def mlp(shape, num_classes, hidden=(200, 200)) -> DriftModel:
    layers: list[nn.Module] = [nn.Flatten()]
    width = shape[0] * shape[1] * shape[2]
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    return DriftModel(nn.Sequential(*layers), width, num_classes)


def cnn(shape, num_classes) -> DriftModel:
    """The CNN of McMahan et al. (FedAvg): two 5x5 conv layers (32, 64), max-pooling, fc 512."""
    conv = nn.Sequential(
        nn.Conv2d(shape[0], 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    body = nn.Sequential(conv, nn.Linear(_flat_dim(conv, shape), 512), nn.ReLU())
    return DriftModel(body, 512, num_classes)


def lenet5(shape, num_classes) -> DriftModel:
    """LeNet-5 as in the FedAvg/FedSSD experiments: conv 6, conv 16, fc 120, fc 84."""
    conv = nn.Sequential(
        nn.Conv2d(shape[0], 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    body = nn.Sequential(conv, nn.Linear(_flat_dim(conv, shape), 120), nn.ReLU(),
                         nn.Linear(120, 84), nn.ReLU())
    return DriftModel(body, 84, num_classes)


def resnet18(shape, num_classes) -> DriftModel:
    """torchvision ResNet-18 for small images: 3x3 stride-1 stem and no max-pool."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(shape[0], 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    feature_dim = net.fc.in_features
    net.fc = nn.Identity()
    return DriftModel(net, feature_dim, num_classes)


# name -> (its settings, the function that builds it from them)
MODELS: dict[str, tuple[type[ModelSettings], Callable[..., DriftModel]]] = {
    "mlp": (MlpSettings, mlp), "cnn": (ModelSettings, cnn), "lenet5": (ModelSettings, lenet5),
    "resnet18": (ModelSettings, resnet18)}


def model_settings(spec: Mapping | ModelSettings) -> ModelSettings:
    return section("model", spec, {name: entry[0] for name, entry in MODELS.items()})


def build_model(spec: Mapping | ModelSettings, shape, num_classes: int) -> DriftModel:
    """The model a ``model`` section names, for images of ``shape`` (C, H, W)."""
    spec = model_settings(spec)
    try:
        model = MODELS[spec.name][1](tuple(shape), num_classes,
                                    **spec.model_dump(exclude={"name", "projection"}))
    except RuntimeError as err:  # e.g. images too small for the conv stack
        raise ConfigError(f"model '{spec.name}' cannot take images of shape "
                          f"{tuple(shape)}: {err}") from None
    return with_projection(model, spec.projection) if spec.projection else model
