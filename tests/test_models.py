"""Models: output shapes for every data shape, and the layer API."""

import copy

import pytest
import torch

from pflower.build import build_model
from pflower.config import load_settings
from pflower.models import Layer, communicable_keys, keys_under, layers, norm_keys


@pytest.mark.parametrize("dataset,shape", [("digits", (1, 8, 8)), ("mnist", (1, 28, 28)), ("cifar10", (3, 32, 32))])
@pytest.mark.parametrize("model", ["auto", "cnn", "cnn-bn", "mlp"])
def test_forward_shapes(dataset, shape, model):
    s = load_settings({"model": model})
    net = build_model(s, shape, 10, seed=0)
    assert net(torch.randn(4, *shape)).shape == (4, 10)


def _settings(model):
    """Settings naming ``model`` (checked against the builder's shape, not the default data set's)."""
    return load_settings({}).model_copy(update={"model": model})


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
@pytest.mark.parametrize("model", ["lenet", "lenet-bn", "twocnn", "cnn2"])
def test_the_papers_models_on_their_data_sets(model, shape):
    net = build_model(_settings(model), shape, 10, seed=0)
    assert net(torch.randn(4, *shape)).shape == (4, 10)


def test_the_papers_models_layers_and_sizes():
    """Each paper's layers in its order, with the widths the papers give (CIFAR-10 shapes)."""
    shapes = lambda net: [(l.name, tuple(dict(net.named_parameters())[l.keys[0]].shape)) for l in layers(net)]  # noqa: E731
    lenet = build_model(_settings("lenet-bn"), (3, 32, 32), 10, seed=0)
    assert shapes(lenet) == [("body.0", (16, 3, 5, 5)), ("body.1", (16,)), ("body.4", (32, 16, 5, 5)), ("body.5", (32,)),
                             ("body.9", (120, 800)), ("body.11", (84, 120)), ("head", (10, 84))]  # fmt: skip
    two = build_model(_settings("twocnn"), (3, 32, 32), 10, seed=0)
    assert shapes(two) == [("body.0", (32, 3, 5, 5)), ("body.3", (64, 32, 5, 5)), ("body.7", (512, 4096)), ("head", (10, 512))]
    cnn2 = build_model(_settings("cnn2"), (3, 32, 32), 10, seed=0)
    assert shapes(cnn2) == [("body.0", (128, 3, 3, 3)), ("body.3", (128, 128, 3, 3)), ("body.6", (128, 128, 3, 3)), ("head", (10, 2048))]


def test_a_model_too_big_for_the_images_is_refused_by_name():
    from pflower.config import ConfigError

    with pytest.raises(ConfigError, match="run config key 'model' = 'lenet' is not allowed: needs images of at least 16x16 \\(digits's are 8x8\\)"):
        load_settings({"model": "lenet", "dataset": "digits"})
    with pytest.raises(ValueError, match="model='cnn2' needs images of at least 8x8, not 4x4"):
        build_model(load_settings({"model": "cnn2"}), (1, 4, 4), 10, seed=0)


def test_same_seed_same_weights():
    s = load_settings({})
    a, b, c = (build_model(s, (1, 28, 28), 10, seed) for seed in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.head.weight, c.head.weight)


def test_layers_are_parameter_groups_in_depth_order():
    s = load_settings({"model": "cnn-bn"})
    net = build_model(s, (3, 32, 32), 10, seed=0)
    ls = layers(net)
    assert [l.name for l in ls] == ["body.0", "body.1", "body.4", "body.5", "body.9", "head"]
    assert ls[0].keys == ("body.0.weight", "body.0.bias")
    assert ls[-1].keys == ("head.weight", "head.bias")
    params = {k for l in ls for k in l.keys}
    assert params == {k for k, _ in net.named_parameters()}


def test_key_sets():
    s = load_settings({"model": "cnn-bn"})
    net = build_model(s, (1, 28, 28), 10, seed=0)
    comm = communicable_keys(net)
    assert not any(k.endswith("num_batches_tracked") for k in comm)
    assert "body.1.running_mean" in comm
    assert keys_under(net, "head") == ["head.weight", "head.bias"]
    assert set(norm_keys(net)) == {f"body.{i}.{n}" for i in (1, 5) for n in ("weight", "bias", "running_mean", "running_var")}
    plain = build_model(load_settings({}), (1, 28, 28), 10, seed=0)
    assert norm_keys(plain) == []


def test_a_classifier_head_is_every_fully_connected_layer_with_the_same_weights():
    """fedper/fedrep/lgfedavg .head='classifier' (SuPerFed's code's split): the same network,
    the body its convolutions, the head its whole fully connected stack; 'mlp' is refused."""
    from pflower.config import ConfigError
    from pflower.models.heads import with_head

    settings = load_settings({"method": "fedper", "model": "twocnn", "fedper.head": "classifier"})
    model = build_model(settings, settings.image_shape, settings.num_classes, 0)
    base = build_model(load_settings({"method": "fedper", "model": "twocnn"}), settings.image_shape, settings.num_classes, 0)
    assert [l.name for l in layers(model)] == ["body.0", "body.3", "head.0", "head.2"]
    assert not any(isinstance(m, torch.nn.Linear) for m in model.body.modules())
    assert [tuple(model.head[i].weight.shape) for i in (0, 2)] == [(512, 256), (10, 512)]
    assert [torch.equal(a, b) for a, b in zip(model.parameters(), base.parameters())] == [True] * 8
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(model(x), base(x)) and with_head(base, "last") is base
    with pytest.raises(ConfigError, match="'fedrep.head' = 'classifier' .* model 'mlp'"):
        load_settings({"method": "fedrep", "model": "mlp", "fedrep.head": "classifier"})


def test_leaf_cnn_is_leafs_femnist_cnn():
    """LEAF's models/femnist/cnn.py: conv 5x5 32 and 64 ('same'), each ReLU and 2x2 max-pool,
    2048 units, the classes; on FEMNIST's 28x28 grayscale with its 62 classes. The FedAvg paper's
    CNN (``twocnn``) is the same network with 512 units."""
    net = build_model(_settings("leaf-cnn"), (1, 28, 28), 62, seed=0)
    shapes = [(l.name, tuple(dict(net.named_parameters())[l.keys[0]].shape)) for l in layers(net)]
    assert shapes == [("body.0", (32, 1, 5, 5)), ("body.3", (64, 32, 5, 5)), ("body.7", (2048, 3136)), ("head", (62, 2048))]
    assert [type(m).__name__ for m in net.body] == ["Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d", "Flatten", "Linear", "ReLU"]
    assert net.body[0].padding == (2, 2) and net(torch.randn(2, 1, 28, 28)).shape == (2, 62)
    assert norm_keys(net) == []


def _resnet(norm: str = "batch", shape=(3, 32, 32), classes: int = 10):
    return build_model(_settings("resnet18").model_copy(update={"resnet_norm": norm}), shape, classes, seed=0)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_resnet18_is_the_cifar_form_of_resnet_18_from_torchvisions_blocks(norm):
    """3x3 stem of stride 1 and no max-pool, four stages of two torchvision BasicBlock (64 to 512
    channels, three strided with a 1x1 shortcut), average pooling, one Linear: 11,173,962
    parameters on CIFAR-10 (the count of the field's CIFAR ResNet-18). Its 41 layers (pFedLA's,
    SuPerFed's) are every convolution, every normalization layer and the head, and a server that
    sees only the state dict finds the same layers."""
    from torchvision.models.resnet import BasicBlock

    from pflower.models.layers import layers_of_state

    net = _resnet(norm)
    assert sum(p.numel() for p in net.parameters()) == 11_173_962
    stem = net.body[0]
    assert (stem.kernel_size, stem.stride, stem.in_channels, stem.out_channels) == ((3, 3), (1, 1), 3, 64)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in net.modules())
    blocks = [m for m in net.modules() if isinstance(m, BasicBlock)]
    assert [b.conv2.out_channels for b in blocks] == [64, 64, 128, 128, 256, 256, 512, 512]
    assert [b.stride for b in blocks] == [1, 1, 2, 1, 2, 1, 2, 1]
    assert [b.downsample is not None for b in blocks] == [False, False, True, False, True, False, True, False]
    assert isinstance(net.head, torch.nn.Linear) and (net.head.in_features, net.head.out_features) == (512, 10)
    assert len(layers(net)) == 41 and layers(net)[-1] == Layer("head", ("head.weight", "head.bias"))
    assert layers_of_state(net.state_dict()) == layers(net)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
@pytest.mark.parametrize("model", ["leaf-cnn", "resnet18"])
def test_the_new_models_take_any_channels_and_sizes(model, shape):
    net = build_model(_settings(model), shape, 10, seed=0)
    assert net(torch.randn(2, *shape)).shape == (2, 10)


def test_resnet18_needs_16x16_and_its_norm_key_only_applies_to_it():
    """Below 16x16 the last stage is 1x1, where BatchNorm cannot train on a minibatch of one."""
    from pflower.config import ConfigError

    with pytest.raises(ConfigError, match="'model' = 'resnet18' is not allowed: needs images of at least 16x16 \\(digits's are 8x8\\)"):
        load_settings({"model": "resnet18"})
    with pytest.raises(ConfigError, match="'resnet-norm' = 'group' is not allowed: only for model 'resnet18'"):
        load_settings({"resnet-norm": "group"})


def test_every_head_split_of_resnet18_is_its_linear():
    """ResNet-18 has one fully connected layer: FedPer's, FedRep's and LG-FedAvg's head and the
    double head's heads are that Linear, ``last`` or ``classifier``; SuPerFed mixes its 41 layers."""
    from pflower.models import DoubleHead, MixedModel
    from pflower.models.heads import with_head

    net = _resnet("group", (1, 16, 16))
    split = with_head(net, "classifier")
    assert [l.name for l in layers(split)][-2:] == ["body.6.1.bn2", "head.0"] and len(layers(split)) == 41
    assert isinstance(split.head[0], torch.nn.Linear)
    x = torch.randn(2, 1, 16, 16)
    assert torch.equal(split(x), net(x))
    for heads in ("last", "classifier"):
        double = DoubleHead(copy.deepcopy(net), heads)
        assert [type(m).__name__ for m in double.local_head.modules() if not isinstance(m, torch.nn.Sequential)] == ["Linear"]
    assert MixedModel(net, "layer").num_layers == 41
