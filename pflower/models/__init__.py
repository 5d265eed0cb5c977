"""Models and the layer API used by every layer-wise method (a run's model: :func:`pflower.build.build_model`).

ResNet-18 (:mod:`pflower.models.resnet`) is not imported here: it imports torchvision (about 2 s),
which only a run of ``model='resnet18'`` pays.
"""

from pflower.models.cnn import CNN
from pflower.models.doublehead import DoubleHead
from pflower.models.layers import Layer, communicable_keys, keys_under, layers, norm_keys
from pflower.models.mixing import MixedModel
from pflower.models.mlp import MLP
from pflower.models.papers import CNN2, LeafCNN, LeNet, TwoCNN

__all__ = [
    "CNN",
    "CNN2",
    "DoubleHead",
    "LeafCNN",
    "LeNet",
    "TwoCNN",
    "MLP",
    "Layer",
    "MixedModel",
    "communicable_keys",
    "keys_under",
    "layers",
    "norm_keys",
]
