"""The double-head model: a shared base, a global head and a local head of the same structure.

Any of the project's models (a ``body`` and a ``head``) becomes one: ``body`` and ``head`` (the
global head) are federated, ``local_head`` (its own initialization) stays on the client.
The prediction is the argmax over the concatenation of both heads' softmax outputs, the class
being that index modulo the number of classes; :func:`combine` gives scores with exactly that
argmax, so the one evaluation routine of the code base scores a double-head model unchanged.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from pflower.models.heads import split_classifier


def combine(global_logits: torch.Tensor, local_logits: torch.Tensor) -> torch.Tensor:
    """Per-class log of max(softmax_global, softmax_local) [batch, classes].

    Its argmax is the class of the largest entry of the two softmax outputs side by side; as
    logits (renormalized by a softmax) it gives the loss, top-5 and calibration of evaluation.
    """
    return torch.maximum(F.log_softmax(global_logits, 1), F.log_softmax(local_logits, 1))


def predict(global_logits: torch.Tensor, local_logits: torch.Tensor) -> torch.Tensor:
    """The rule as stated: argmax over [softmax_global, softmax_local], modulo the classes."""
    both = torch.cat([global_logits.softmax(1), local_logits.softmax(1)], 1)
    return both.argmax(1) % global_logits.shape[1]


class DoubleHead(nn.Module):
    """``body`` -> (``head``, ``local_head``); the local head starts from a fresh initialization.

    ``heads='last'``: the heads are the model's last Linear; ``'classifier'``: every fully
    connected layer (:func:`split_classifier`), the base being the convolutional part.
    """

    def __init__(self, base: nn.Module, heads: str = "last"):
        super().__init__()
        if heads == "classifier":
            self.body, self.head = split_classifier(base)
        else:
            self.body, self.head = base.body, base.head
        self.local_head = copy.deepcopy(self.head)
        for module in self.local_head.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(global logits, local logits) of one shared forward pass through the base."""
        z = self.body(x)
        return self.head(z), self.local_head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return combine(*self.heads(x))
