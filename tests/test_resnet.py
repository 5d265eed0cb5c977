"""ResNet-18 at its full width (11 million parameters) on CIFAR-10-shaped data: it trains with
either normalization, and FedBN keeps either's normalization layers local.

Every method trains ResNet-18 in process on CIFAR-10-shaped data, at 1/16 of its width (the same
layers), in tests/test_devices.py; its structure is tests/test_models.py's.
"""

import pytest
import torch
from data_files import write_cifar10

from pflower.build import build_model, client_method
from pflower.config import load_settings
from pflower.datasets.federated import Split
from pflower.models import communicable_keys, norm_keys
from pflower.training import train


def cifar10_settings(tmp_path, **keys):
    """Settings of a run on CIFAR-10's files (a few random images, written here)."""
    write_cifar10(tmp_path / "cifar10")
    return load_settings({"model": "resnet18", "dataset": "torchvision", "torchvision-name": "CIFAR10", "data-dir": str(tmp_path / "cifar10"), **keys})


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_the_full_network_trains_on_cifar10_shaped_images(tmp_path, norm):
    """One SGD step of the one training loop on two 32x32 colour images moves every parameter
    and lowers their loss."""
    settings = cifar10_settings(tmp_path, **{"resnet-norm": norm})
    model = build_model(settings, settings.image_shape, settings.num_classes, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 11_173_962
    data = Split(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.arange(2))
    before = [p.detach().clone() for p in model.parameters()]
    losses = [train(model, data, epochs=1, batch_size=2, lr=0.01, seed=epoch) for epoch in range(2)]
    assert losses[1] < losses[0]
    assert not any(torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize(
    "norm,layer,local",
    [("batch", torch.nn.BatchNorm2d, {"weight", "bias", "running_mean", "running_var"}), ("group", torch.nn.GroupNorm, {"weight", "bias"})],
)
def test_fedbn_keeps_resnet18s_normalization_layers_local(tmp_path, norm, layer, local):
    """``resnet-norm`` gives ResNet-18 20 BatchNorm layers or 20 GroupNorm layers of 2 groups
    (no running statistics); FedBN uploads everything but them: BatchNorm's affine pairs and
    running statistics, or GroupNorm's affine pairs."""
    settings = cifar10_settings(tmp_path, method="fedbn", **{"resnet-norm": norm})
    model = build_model(settings, settings.image_shape, settings.num_classes, seed=0)
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm))]
    assert len(norms) == 20 and all(type(m) is layer for m in norms)
    if norm == "group":
        assert {m.num_groups for m in norms} == {2} and not any("running" in k for k in model.state_dict())
    kept = set(communicable_keys(model)) - set(client_method(settings).client_state(model).uploaded)
    assert kept == set(norm_keys(model)) and len(kept) == 20 * len(local)
    assert {k.rsplit(".", 1)[1] for k in kept} == local
