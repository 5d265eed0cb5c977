"""Named parts of a model, shared by every layer-wise method.

A *layer* is a leaf module that owns parameters (a conv's weight and bias, a BatchNorm's
affine pair), in registration order, i.e. from shallow to deep. Float buffers (BatchNorm
running statistics) belong to no layer; integer buffers (``num_batches_tracked``) are never
communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


@dataclass(frozen=True)
class Layer:
    """One layer: its module name and the state-dict keys of its parameters."""

    name: str
    keys: tuple[str, ...]


def layers(model: nn.Module) -> list[Layer]:
    """The model's layers, shallow to deep."""
    out = []
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        if own:
            out.append(Layer(name, tuple(own)))
    return out


def communicable_keys(model: nn.Module) -> list[str]:
    """State-dict keys that can be sent and averaged: parameters and float buffers."""
    return [k for k, v in model.state_dict().items() if v.is_floating_point()]


def keys_under(model: nn.Module, prefix: str) -> list[str]:
    """Communicable keys of the submodule ``prefix`` (e.g. ``"head"``)."""
    return [k for k in communicable_keys(model) if k.startswith(prefix + ".")]


def norm_keys(model: nn.Module) -> list[str]:
    """Communicable keys of normalization layers (what FedBN keeps local)."""
    names = [n for n, m in model.named_modules() if isinstance(m, NORM_TYPES)]
    return [k for k in communicable_keys(model) if any(k.startswith(n + ".") for n in names)]


#: Buffers that travel in a state dict but belong to no layer (BatchNorm's running statistics).
RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


def layers_of_state(state: dict) -> list[Layer]:
    """The layers of a state dict from its keys alone (for models the server never sees): the
    float tensors grouped by module (the key's prefix), in order, without running statistics.
    For pflower's models this is :func:`layers` (tested)."""
    groups: dict[str, list[str]] = {}
    for key, value in state.items():
        module, _, name = key.rpartition(".")
        if name not in RUNNING_STATS and value.is_floating_point():
            groups.setdefault(module, []).append(key)
    return [Layer(name, tuple(keys)) for name, keys in groups.items()]
