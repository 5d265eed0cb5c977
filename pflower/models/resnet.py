"""ResNet-18 as the field uses it on 32x32 images (``model='resnet18'``), built from torchvision's
``BasicBlock``.

The CIFAR form of He et al.'s network: a 3x3 stem convolution (stride 1, no max-pool), four
stages of two ``BasicBlock`` each (64, 128, 256, 512 channels; stages 2 to 4 halve the image with
a strided first block, whose shortcut is a 1x1 convolution and a normalization layer), global
average pooling and one Linear. It takes any number of channels and any image side; a run
needs at least 16x16 (:data:`pflower.config.MODEL_MIN_SIZE`: below it the last stage is 1x1,
where BatchNorm cannot train on a minibatch of one). 28x28 and 32x32 leave 4x4 at the last stage.

Normalization (``resnet-norm``): ``batch`` (BatchNorm, the published network) or ``group``
(GroupNorm with :data:`GROUPS` groups in every layer, as Reddi et al. (2021, *Adaptive Federated
Optimization*) run ResNet-18 in federated learning, after Hsieh et al. (2020, *The Non-IID Data
Quagmire*) found that GroupNorm recovers much of the accuracy BatchNorm loses on skewed labels;
it keeps no running statistics, so nothing depends on the batches a client happened to see).

Like every model of the project it is a ``body`` (stem, stages, pooling, flatten) and a ``head``
(the Linear); the body has no fully connected layer, so a ``classifier`` head is the same Linear.
Its layers (:func:`pflower.models.layers`), pFedLA's and SuPerFed's unit, are its 41 modules with
parameters: each convolution and each normalization layer (shortcuts included) and the head.
Weights start as torchvision's ResNet initializes them: Kaiming normal (fan-out) convolutions,
normalization layers at 1 and 0, PyTorch's default for the Linear.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, conv1x1

#: GroupNorm's groups per layer with ``resnet-norm='group'`` (Reddi et al., 2021).
GROUPS = 2
#: ResNet-18's stages: (channels as a multiple of the first stage's, stride of the first block), two blocks each.
STAGES = ((1, 1), (2, 2), (4, 2), (8, 2))


def norm_layer(norm: str):
    """What makes a normalization layer of ``channels`` channels: BatchNorm, or GroupNorm of :data:`GROUPS` groups."""
    if norm == "batch":
        return nn.BatchNorm2d
    if norm == "group":
        return partial(nn.GroupNorm, GROUPS)
    raise ValueError(f"resnet norm must be 'batch' or 'group', not {norm!r}")


def stage(inplanes: int, planes: int, stride: int, norm) -> nn.Sequential:
    """Two ``BasicBlock``; the first changes the width or the size with a 1x1 shortcut."""
    downsample = None
    if stride != 1 or inplanes != planes:
        downsample = nn.Sequential(conv1x1(inplanes, planes, stride), norm(planes))
    return nn.Sequential(BasicBlock(inplanes, planes, stride, downsample, norm_layer=norm), BasicBlock(planes, planes, norm_layer=norm))


class ResNet18(nn.Module):
    """ResNet-18 for small images (see the module): ``body`` the convolutional network through the
    pooled features, ``head`` the Linear to the classes. ``width``: the stem's and first stage's
    channels, 64 in the published network and in every run (the tests build narrower copies,
    whose layers are the same)."""

    def __init__(self, in_channels: int, num_classes: int, norm: str = "batch", width: int = 64):
        super().__init__()
        make = norm_layer(norm)
        layers: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), make(width), nn.ReLU(inplace=True)]
        inplanes = width
        for multiple, stride in STAGES:
            layers.append(stage(inplanes, multiple * width, stride, make))
            inplanes = multiple * width
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(inplanes, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
