"""Models: output shapes for every data shape, and the layer API."""

import pytest
import torch

from pflower.build import build_model
from pflower.config import load_settings
from pflower.models import communicable_keys, keys_under, layers, norm_keys


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
