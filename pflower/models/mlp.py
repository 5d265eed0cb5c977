"""A multilayer perceptron on flattened images."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Flatten, two hidden ReLU layers (``body``), a linear classifier (``head``)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 200):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
