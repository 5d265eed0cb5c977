"""The papers' own CNNs, for reproducing their tables (``model='lenet'``, ``'twocnn'``, ``'cnn2'``,
``'leaf-cnn'``).

Each is a ``body`` (convolutions, flatten, and every fully connected layer but the last) and a
``head`` (the last Linear), like the project's other models, so FedPer, FedRep and the double
head split them the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from pflower.models.cnn import flat_features


class LeNet(nn.Module):
    """pFedHN's CNN, which pFedLA uses (with BatchNorm after each convolution on CIFAR):
    conv 5x5 16 and 32 channels, each ReLU and 2x2 max-pool, then 120, 84 and the classes."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, batch_norm: bool = False):
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 5), *([nn.BatchNorm2d(cout)] if batch_norm else []), nn.ReLU(), nn.MaxPool2d(2)]

        features = nn.Sequential(*block(in_channels, 16), *block(16, 32), nn.Flatten())
        flat = flat_features(features, in_channels, image_size)
        self.body = nn.Sequential(*features, nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.head = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class TwoCNN(nn.Module):
    """The FedAvg paper's CNN, SuPerFed's CIFAR-10 model: conv 5x5 32 and 64 channels ('same'
    padding), each ReLU and 2x2 max-pool, a ``hidden``-unit ReLU layer (512), the classes."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, hidden: int = 512):
        super().__init__()
        features = nn.Sequential(nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())  # fmt: skip
        self.body = nn.Sequential(*features, nn.Linear(flat_features(features, in_channels, image_size), hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class LeafCNN(TwoCNN):
    """LEAF's FEMNIST CNN (``models/femnist/cnn.py``), the double-head paper's FEMNIST model: the
    FedAvg paper's CNN with a 2048-unit fully connected layer (conv 5x5 32 and 64 channels, 'same'
    padding, each ReLU and 2x2 max-pool; 3136 features on 28x28 grayscale, 2048, the classes)."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__(in_channels, image_size, num_classes, hidden=2048)


class CNN2(nn.Module):
    """Shen et al.'s CNN2, FedeRiCo's CIFAR-10 model: three 3x3 convolutions of 128 channels,
    each 2x2 max-pool and ReLU, and one fully connected layer (the head; the body has none)."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__()
        stages: list[nn.Module] = []
        for cin in (in_channels, 128, 128):
            stages += [nn.Conv2d(cin, 128, 3, padding=1), nn.MaxPool2d(2), nn.ReLU()]
        self.body = nn.Sequential(*stages, nn.Flatten())
        self.head = nn.Linear(flat_features(self.body, in_channels, image_size), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
