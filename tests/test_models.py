"""Models: output shapes for every data shape, and the layer API."""

import pytest
import torch

from pflower.config import load_settings
from pflower.models import build_model, communicable_keys, keys_under, layers, norm_keys


@pytest.mark.parametrize("dataset,shape", [("digits", (1, 8, 8)), ("mnist", (1, 28, 28)), ("cifar10", (3, 32, 32))])
@pytest.mark.parametrize("model", ["auto", "cnn", "cnn-bn", "mlp"])
def test_forward_shapes(dataset, shape, model):
    s = load_settings({"model": model})
    net = build_model(s, shape, 10, seed=0)
    assert net(torch.randn(4, *shape)).shape == (4, 10)


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
    assert set(norm_keys(net)) == {
        f"body.{i}.{n}" for i in (1, 5) for n in ("weight", "bias", "running_mean", "running_var")
    }
    plain = build_model(load_settings({}), (1, 28, 28), 10, seed=0)
    assert norm_keys(plain) == []
