"""SCAFFOLD's control variates as buffers of the model they correct.

:func:`with_controls` adds a ``scaffold`` submodule to a model: for each of its parameters ``<k>``
three zero buffers of its shape, ``scaffold.c.<k>`` (the server's c, as last received),
``scaffold.c_i.<k>`` (the client's own c_i) and ``scaffold.delta_c.<k>`` (the client's last
update of it, Δc_i). Being in the state dict, they travel and persist as the model does: the
server's arrays load into them, the client's personal state (saved to disk after every round)
keeps c_i, and the upload takes Δc_i from them. The forward pass never reads them. BatchNorm's
running statistics are buffers, not parameters: they get no control variate.

The arrays both sides exchange: the model's own keys carry x (server to client) and y_i (client
to server); ``C_SERVER + <k>`` carries c (server to client), ``DELTA_C + <k>`` Δc_i (client to
server); ``C_CLIENT + <k>`` never leaves the client.
"""

from __future__ import annotations

import torch
from torch import nn

#: Prefix of every control-variate array in the model's state.
PREFIX = "scaffold."
#: The server's control variate c, the client's c_i, and the client's last update Δc_i.
C_SERVER, C_CLIENT, DELTA_C = f"{PREFIX}c.", f"{PREFIX}c_i.", f"{PREFIX}delta_c."


def _tree(shapes: dict[str, torch.Tensor]) -> nn.Module:
    """A module whose buffers are zeros named and shaped as ``shapes``' keys and values (``body.0.weight``
    becomes the buffer ``weight`` of the submodule ``body.0``)."""
    root = nn.Module()
    for key, like in shapes.items():
        *path, leaf = key.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        module.register_buffer(leaf, torch.zeros_like(like, memory_format=torch.contiguous_format))
    return root


def with_controls(model: nn.Module) -> nn.Module:
    """``model`` with zero control variates c, c_i and Δc_i for each of its parameters (in place)."""
    name = PREFIX.rstrip(".")
    if hasattr(model, name):
        raise ValueError(f"the model already has a submodule '{name}'")
    params = {k: p.detach() for k, p in model.named_parameters()}
    holder = nn.Module()
    for prefix in (C_SERVER, C_CLIENT, DELTA_C):
        holder.add_module(prefix[len(PREFIX) :].rstrip("."), _tree(params))
    model.add_module(name, holder)
    return model


def controls(model: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """The buffers under ``prefix`` (:data:`C_SERVER`, :data:`C_CLIENT` or :data:`DELTA_C`) by parameter key."""
    return {k[len(prefix) :]: v for k, v in model.named_buffers() if k.startswith(prefix)}
