"""Models, each split into a feature extractor (``features``) and a linear head (``head``).

Distillation, prototype and contrastive methods need the features and the logits separately, so
every model exposes both; ``forward`` is simply ``head(features(x))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from .errors import ConfigError, lookup


class DriftModel(nn.Module):
    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.features = features
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


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


MODELS: dict[str, Callable[..., DriftModel]] = {
    "mlp": mlp, "cnn": cnn, "lenet5": lenet5, "resnet18": resnet18}


def build_model(spec: Mapping, shape, num_classes: int) -> DriftModel:
    """The model a ``model`` config section names, for images of ``shape`` (C, H, W)."""
    factory = lookup("model", spec["name"], MODELS)
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    try:
        return factory(tuple(shape), num_classes, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model '{spec['name']}' got unexpected settings {sorted(kwargs)}: {err}")
    except RuntimeError as err:  # e.g. images too small for the conv stack
        raise ConfigError(f"model '{spec['name']}' cannot take images of shape {tuple(shape)}: {err}")
