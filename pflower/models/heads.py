"""Where a model's head begins: at its last Linear (the ``head`` of every model of the project) or
at its first fully connected layer (``classifier``: the whole fully connected stack, the double-head
paper's heads and the personal part SuPerFed's code gives FedPer, FedRep and LG-FedAvg)."""

from __future__ import annotations

import torch
from torch import nn


def split_classifier(base: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(features, classifier): the model's ``body`` up to its first Linear, and every layer from
    there through ``head``."""
    body = list(base.body)
    first = next((i for i, m in enumerate(body) if isinstance(m, nn.Linear)), len(body))
    return nn.Sequential(*body[:first]), nn.Sequential(*body[first:], base.head)


class ClassifierHead(nn.Module):
    """``base`` with the same layers and weights, split anew: ``body`` its convolutional part,
    ``head`` every fully connected layer."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.body, self.head = split_classifier(base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def with_head(model: nn.Module, head: str) -> nn.Module:
    """``model`` as it is (``last``) or as a :class:`ClassifierHead` (``classifier``)."""
    return ClassifierHead(model) if head == "classifier" else model
