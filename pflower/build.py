"""A run's objects, built from its :class:`~pflower.config.Settings`: the model, the method's
client side and its server strategy.

It sits above the configuration, which sits above the method registry (:mod:`pflower.methods`):
the registry names each method's parts, the configuration validates against it, and this
module builds what both describe. The models know neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from pflower.client_state import Role
from pflower.config import MODEL_MIN_SIZE, ConfigError, Settings, machine_memory, size_text
from pflower.datasets import federated
from pflower.datasets.folder import FolderError
from pflower.datasets.partition import PartitionError
from pflower.datasets.sources import DataError
from pflower.methods import get
from pflower.models import CNN, CNN2, MLP, LeafCNN, LeNet, TwoCNN

if TYPE_CHECKING:
    from pflower.client_app.base import ClientMethod
    from pflower.strategies.loop import PflStrategy


def resolve_model_name(settings: Settings, shape: tuple[int, ...]) -> str:
    """``auto``: a plain CNN for 1-channel images, a CNN with BatchNorm for colour images, the
    LSTM for text (a shape of one dimension, the line's length)."""
    if settings.model != "auto":
        return settings.model
    if len(shape) == 1:
        return "lstm"
    return "cnn" if shape[0] == 1 else "cnn-bn"


def build_model(settings: Settings, shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """A freshly initialized model; the same ``seed`` gives the same weights.

    The method's declaration may wrap it (SuPerFed: :class:`~pflower.models.MixedModel`,
    federated and local copies; the double head: :class:`~pflower.models.DoubleHead`, a second,
    local head).
    """
    name = resolve_model_name(settings, shape)
    if (name == "lstm") != (len(shape) == 1):
        raise ValueError(f"model='{name}' reads {'text' if name == 'lstm' else 'images'}, not inputs of shape {tuple(shape)}")
    in_channels, height, width = shape if len(shape) == 3 else (0, 0, 0)
    if name != "lstm" and min(height, width) < MODEL_MIN_SIZE.get(name, 0):
        raise ValueError(f"model='{name}' needs images of at least {MODEL_MIN_SIZE[name]}x{MODEL_MIN_SIZE[name]}, not {height}x{width}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "lstm":
            from pflower.models import lstm  # the module, so that tests can build a narrower one

            model = lstm.CharLSTM(num_classes)
        elif name == "mlp":
            model = MLP(in_channels * height * width, num_classes)
        elif name in ("lenet", "lenet-bn"):
            model = LeNet(in_channels, height, num_classes, batch_norm=name == "lenet-bn")
        elif name == "twocnn":
            model = TwoCNN(in_channels, height, num_classes)
        elif name == "cnn2":
            model = CNN2(in_channels, height, num_classes)
        elif name == "leaf-cnn":
            model = LeafCNN(in_channels, height, num_classes)
        elif name == "resnet18":
            from pflower.models import resnet  # imports torchvision: only where it is used

            model = resnet.ResNet18(in_channels, num_classes, norm=settings.resnet_norm)
        else:
            model = CNN(in_channels, height, num_classes, batch_norm=name == "cnn-bn")
        wrap = get(settings.method).wrap  # inside: the double head draws its local head
        return wrap(model, settings.params) if wrap else model


def client_method(settings: Settings) -> ClientMethod:
    """The method's client side (its declaration's ``client`` class) for ``settings``."""
    return get(settings.method).client_class()(settings)


def build_strategy(settings: Settings, shape: tuple[int, int, int] | None = None, num_classes: int | None = None) -> PflStrategy:
    """The method's strategy, with the initial model of ``seed`` and the method's declared client state;
    ``shape`` and ``num_classes`` when the nodes bring their own data (else the data set's)."""
    shape, num_classes = (settings.image_shape, settings.num_classes) if shape is None else (shape, num_classes)
    model = build_model(settings, shape, num_classes, settings.seed)
    client = client_method(settings)
    method = get(settings.method)
    state, server = client.client_state(model), method.strategy_class()
    if (one_way := state.keys(Role.FROM_SERVER, Role.TO_SERVER)) and not server.ONE_WAY_ARRAYS:
        raise ValueError(
            f"method '{settings.method}' declares arrays that go one way only ({one_way[:3]}), which its server {server.__name__} "
            "neither sends nor takes apart: give the method a server that handles them (ONE_WAY_ARRAYS, as SCAFFOLD's)"
        )
    strategy = server.from_settings(settings, model, state)
    strategy.gate.schemas.update(method.reply_schemas())
    strategy.evaluation = {"evaluates": client.EVALUATES, "finetune-epochs": client.finetune_epochs}
    return strategy


#: Copies of the model a client holds at once in float32: its weights, their gradients, the
#: state it saves and the arrays it receives.
MODEL_COPIES = 4


def check_data(s: Settings, num_clients: int | None = None) -> None:
    """ConfigError naming ``data-dir`` (or ``partition``) if the data is not what every client
    will need (:func:`pflower.datasets.federated.check_data`);
    nothing for the nodes' own data."""
    if s.node_data:
        return
    try:
        federated.check_data(s, num_clients)
    except PartitionError as err:  # named for its key: the partition, or the key it is about
        raise ConfigError([(err.key, s.to_run_config().get(err.key, s.partition), str(err))]) from None
    except (DataError, FolderError, OSError) as err:
        raise ConfigError([("data-dir", s.data_dir, str(err))]) from None


def check_model(s: Settings) -> None:
    """ConfigError naming ``image-size`` (or ``model``) if the model for this data does not fit
    this machine: built on PyTorch's meta device (no memory), its parameters and buffers counted
    (``model='leaf-cnn' image-size=1024`` asked for a 32 GiB model at the first message). With
    the nodes' own data the shape is theirs, known once they answer: nothing to count here."""
    if s.node_data:
        return
    shape = s.image_shape
    with torch.device("meta"):
        model = build_model(s, shape, s.num_classes, s.seed)
    values = sum(t.numel() for t in [*model.parameters(), *model.buffers()])
    if (need := MODEL_COPIES * 4 * values) > (have := machine_memory()):
        key, value = ("image-size", s.image_size) if s.image_size else ("model", s.model)
        why = (f"model '{resolve_model_name(s, shape)}' on inputs {tuple(shape)} has {values:,} parameters: {size_text(need)} for a client to "
               f"train it, the machine has {size_text(have)}; choose a smaller image-size or model")  # fmt: skip
        raise ConfigError([(key, value, why)])
