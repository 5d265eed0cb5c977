"""Models and the layer API used by every layer-wise method (a run's model: :func:`pflower.build.build_model`)."""

from pflower.models.cnn import CNN
from pflower.models.doublehead import DoubleHead
from pflower.models.layers import Layer, communicable_keys, keys_under, layers, norm_keys
from pflower.models.mixing import MixedModel
from pflower.models.mlp import MLP
from pflower.models.papers import CNN2, LeNet, TwoCNN

__all__ = ["CNN", "CNN2", "DoubleHead", "LeNet", "TwoCNN", "MLP", "Layer", "MixedModel", "communicable_keys", "keys_under", "layers", "norm_keys"]
