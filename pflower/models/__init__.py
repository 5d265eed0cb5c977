"""Models and the layer API used by every layer-wise method."""

from __future__ import annotations

import torch
from torch import nn

from pflower.config import MODEL_MIN_SIZE, Settings
from pflower.methods import declarations
from pflower.models.cnn import CNN
from pflower.models.doublehead import DoubleHead
from pflower.models.layers import Layer, communicable_keys, keys_under, layers, norm_keys
from pflower.models.mixing import MixedModel
from pflower.models.mlp import MLP
from pflower.models.papers import CNN2, LeNet, TwoCNN

__all__ = ["CNN", "CNN2", "DoubleHead", "LeNet", "TwoCNN", "MLP", "Layer", "MixedModel", "build_model", "communicable_keys", "keys_under", "layers", "norm_keys"]


def resolve_model_name(settings: Settings, in_channels: int) -> str:
    """``auto``: a plain CNN for 1-channel images, a CNN with BatchNorm for colour images."""
    if settings.model != "auto":
        return settings.model
    return "cnn" if in_channels == 1 else "cnn-bn"


def build_model(settings: Settings, shape: tuple[int, int, int], num_classes: int, seed: int) -> nn.Module:
    """A freshly initialized model; the same ``seed`` gives the same weights.

    The method's declaration may wrap it (SuPerFed: :class:`MixedModel`, federated and local
    copies; the double head: :class:`DoubleHead`, a second, local head).
    """
    in_channels, height, width = shape
    name = resolve_model_name(settings, in_channels)
    if min(height, width) < MODEL_MIN_SIZE.get(name, 0):
        raise ValueError(f"model='{name}' needs images of at least {MODEL_MIN_SIZE[name]}x{MODEL_MIN_SIZE[name]}, not {height}x{width}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model = MLP(in_channels * height * width, num_classes)
        elif name in ("lenet", "lenet-bn"):
            model = LeNet(in_channels, height, num_classes, batch_norm=name == "lenet-bn")
        elif name == "twocnn":
            model = TwoCNN(in_channels, height, num_classes)
        elif name == "cnn2":
            model = CNN2(in_channels, height, num_classes)
        else:
            model = CNN(in_channels, height, num_classes, batch_norm=name == "cnn-bn")
        wrap = declarations()[settings.method].wrap  # inside: the double head draws its local head
        return wrap(model, settings.params) if wrap else model
