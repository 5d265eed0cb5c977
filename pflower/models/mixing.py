"""SuPerFed's mixed network: a federated and a local weight set on one low-loss line.

:class:`MixedModel` holds two copies of one architecture, ``fed`` (w_f, averaged by the
server) and ``local`` (w_l, never sent), and runs the network at
W(lambda) = (1 - lambda) w_f + lambda w_l: one lambda for all layers (model mixing) or one per
layer (layer mixing). One backward pass reaches both weight sets.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call

from pflower.models.layers import layers

#: The lambdas at which clients evaluate the mixed model: 0 (federated) to 1 (local).
LAMBDA_GRID = tuple(round(0.1 * i, 1) for i in range(11))


class MixedModel(nn.Module):
    def __init__(self, base: nn.Module, mode: str = "model"):
        super().__init__()
        if mode not in ("model", "layer"):
            raise ValueError(f"mixing mode must be 'model' or 'layer', not {mode!r}")
        self.fed = base
        self.local = copy.deepcopy(base)
        self.mode = mode
        self.groups = [layer.keys for layer in layers(base)]
        self.register_buffer("lam", torch.zeros(len(self.groups)), persistent=False)

    @property
    def num_layers(self) -> int:
        return len(self.groups)

    def set_lambda(self, value: float | Sequence[float] | torch.Tensor) -> None:
        """One lambda for every layer, or one per layer."""
        self.lam.copy_(torch.as_tensor(value, dtype=self.lam.dtype).expand(self.num_layers))

    def draw_lambda(self, generator: torch.Generator) -> None:
        """lambda ~ U(0, 1): one draw for the model, or one per layer."""
        n = 1 if self.mode == "model" else self.num_layers
        self.set_lambda(torch.rand(n, generator=generator))

    def mixed_parameters(self) -> dict[str, torch.Tensor]:
        fed, loc = dict(self.fed.named_parameters()), dict(self.local.named_parameters())
        return {k: (1 - self.lam[l]) * fed[k] + self.lam[l] * loc[k] for l, keys in enumerate(self.groups) for k in keys}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.fed, {**self.mixed_parameters(), **dict(self.fed.named_buffers())}, (x,))

    def at(self, x: torch.Tensor, lam: float) -> torch.Tensor:
        """The network at one lambda for every layer, without touching the ``lam`` buffer. At 0 and
        1 it is one half with its own buffers (a personal model keeps its BatchNorm statistics);
        in between the weights mix and the federated half's statistics serve (as in :meth:`forward`)."""
        if lam == 0.0:
            return self.fed(x)
        if lam == 1.0:
            return self.local(x)
        fed, loc = dict(self.fed.named_parameters()), dict(self.local.named_parameters())
        mixed = {k: (1 - lam) * fed[k] + lam * loc[k] for k in fed}
        return functional_call(self.fed, {**mixed, **dict(self.fed.named_buffers())}, (x,))


def cosine_squared(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], eps: float = 1e-12) -> torch.Tensor:
    """cos^2 between two weight sets, each taken as one vector over all its tensors."""
    dot = sum((x * y).sum() for x, y in zip(a, b))
    na = torch.sqrt(sum(x.square().sum() for x in a))
    nb = torch.sqrt(sum(y.square().sum() for y in b))
    return (dot / (na * nb + eps)).square()


class AtLambda(nn.Module):
    """A :class:`MixedModel` at one fixed lambda, as a module: the prediction of methods that keep
    a federated and a personal weight set (Ditto and pFedMe: 1, the personal one; APFL: its alpha)."""

    def __init__(self, model: MixedModel, lam: float):
        super().__init__()
        self.model, self.lam = model, float(lam)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.at(x, self.lam)


def with_alpha(model: MixedModel, alpha: float) -> MixedModel:
    """``model`` with a learned mixing weight ``alpha`` (APFL), a parameter kept in its state."""
    model.alpha = nn.Parameter(torch.tensor(float(alpha)))
    return model
