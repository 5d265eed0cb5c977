"""Convolutional networks for 1-channel (28x28, 8x8) and 3-channel (32x32) images."""

from __future__ import annotations

import torch
from torch import nn


def flat_features(features: nn.Module, channels: int, size: int) -> int:
    """Width of ``features``' output for one ``channels`` x ``size`` x ``size`` image."""
    with torch.no_grad():
        return features(torch.zeros(1, channels, size, size)).shape[1]


class CNN(nn.Module):
    """Two conv blocks and two linear layers; ``body`` is shared, ``head`` is the classifier.

    Small images (8x8) use 3x3 'same' convolutions, larger ones 5x5 valid convolutions.
    With ``batch_norm`` every convolution is followed by BatchNorm (FedBN's local layers).
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int, batch_norm: bool = False, width: int = 16):
        super().__init__()
        k, pad = (3, 1) if image_size < 16 else (5, 0)

        def block(cin: int, cout: int) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, padding=pad)]
            if batch_norm:
                layers.append(nn.BatchNorm2d(cout))
            return layers + [nn.ReLU(), nn.MaxPool2d(2)]

        features = nn.Sequential(*block(in_channels, width), *block(width, 2 * width), nn.Flatten())
        self.body = nn.Sequential(*features, nn.Linear(flat_features(features, in_channels, image_size), 128), nn.ReLU())
        self.head = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
