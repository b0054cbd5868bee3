"""Every model splits into features and a linear head, for any image shape it can take."""

from __future__ import annotations

import pytest
import torch

from driftfl.common.errors import ConfigError
from driftfl.common.models import MODELS, build_model


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


def test_mlp_hidden_sizes_come_from_config():
    mlp = build_model({"name": "mlp", "hidden": [64]}, (1, 8, 8), 3)
    assert mlp.head.in_features == 64


def test_resnet18_keeps_small_images_at_full_resolution():
    net = build_model({"name": "resnet18"}, (3, 32, 32), 10)
    assert net.features.conv1.stride == (1, 1)
    assert isinstance(net.features.maxpool, torch.nn.Identity)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())


def test_unknown_model_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown model 'vgg'; valid: cnn, lenet5, mlp, resnet18"):
        build_model({"name": "vgg"}, (1, 28, 28), 10)


def test_images_too_small_for_the_model_are_a_config_error():
    with pytest.raises(ConfigError, match="cannot take images of shape"):
        build_model({"name": "lenet5"}, (1, 8, 8), 10)
