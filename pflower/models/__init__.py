"""Models and the layer API used by every layer-wise method."""

from __future__ import annotations

import torch
from torch import nn

from pflower.config import Settings
from pflower.methods import declarations
from pflower.models.cnn import CNN
from pflower.models.doublehead import DoubleHead
from pflower.models.layers import Layer, communicable_keys, keys_under, layers, norm_keys
from pflower.models.mixing import MixedModel
from pflower.models.mlp import MLP

__all__ = ["CNN", "DoubleHead", "MLP", "Layer", "MixedModel", "build_model", "communicable_keys", "keys_under", "layers", "norm_keys"]


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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model = MLP(in_channels * height * width, num_classes)
        else:
            model = CNN(in_channels, height, num_classes, batch_norm=name == "cnn-bn")
        wrap = declarations()[settings.method].wrap  # inside: the double head draws its local head
        return wrap(model, settings.params) if wrap else model
