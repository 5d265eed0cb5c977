"""FedEM's model: K components of one architecture and a client's mixture weights π over them.

:class:`Mixture` holds the components as ``components.<k>.<key>`` (component 0 is the model it
wraps, the others drawn afresh) and π as the buffer ``pi`` (K numbers, uniform at first). Its
forward pass is the mixture's prediction, log Σ_k π_k softmax(component_k(x)): log-probabilities,
so the one evaluation routine's cross-entropy, accuracy, top-5 and calibration score the
π-weighted mixture of the components' softmax outputs unchanged.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

#: Prefix of the components' keys in the model's state (what the server averages).
COMPONENTS = "components."
#: The key of the mixture weights π in the model's state (personal: never sent).
PI = "pi"


def mixture_log_probs(logits: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """log Σ_k π_k softmax(logits_k) [batch, classes] from the components' ``logits`` [K, batch,
    classes] and ``pi`` [K]; a component of weight 0 adds nothing (log 0 = −inf in a logsumexp)."""
    return torch.logsumexp(torch.log(pi)[:, None, None] + F.log_softmax(logits, -1), 0)


def redrawn(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every parameter drawn afresh (each layer's ``reset_parameters``,
    from the global random generator)."""
    fresh = copy.deepcopy(model)
    for module in fresh.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return fresh


class Mixture(nn.Module):
    """``components`` K models (the first ``base``, the others :func:`redrawn` from it) and the
    buffer ``pi``, their mixture weights, 1/K each until the client's first E-step."""

    def __init__(self, base: nn.Module, components: int):
        super().__init__()
        if components < 1:
            raise ValueError(f"a mixture needs at least one component, not {components}")
        self.components = nn.ModuleList([base, *(redrawn(base) for _ in range(components - 1))])
        self.register_buffer(PI, torch.full((components,), 1.0 / components))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mixture_log_probs(torch.stack([c(x) for c in self.components]), self.pi)
