"""The one local training loop and the one evaluation routine of the code base.

Methods differ only in what they hand in: which parameters the optimizer moves
(FedRep's head/body phases) and the loss (FedProx's proximal term, SuPerFed's mixing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pflower.datasets import Split

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def device() -> torch.device:
    """CUDA when the process sees a GPU, CPU otherwise."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def batches(data: Split, batch_size: int, generator: torch.Generator | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Minibatches in random order (``generator``) or in order (None)."""
    n = len(data)
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        yield data.x[idx], data.y[idx]


def train(
    model: nn.Module,
    data: Split,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    params: Iterable[nn.Parameter] | None = None,
    loss_fn: LossFn = cross_entropy,
) -> float:
    """SGD over ``data`` for ``epochs``; returns the mean minibatch loss.

    ``params`` limits what the optimizer moves (default: every parameter); ``seed`` fixes the
    minibatch order, so a client's update is reproducible.
    """
    dev = next(model.parameters()).device
    params = list(model.parameters() if params is None else params)
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for x, y in batches(data, batch_size, gen):
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model, x, y)
            loss.backward()
            opt.step()
            total += float(loss.detach())
            count += 1
    return total / max(count, 1)


@dataclass(frozen=True)
class Evaluation:
    loss: float
    accuracy: float
    num_examples: int


@torch.no_grad()
def evaluate(model: nn.Module, data: Split, batch_size: int = 512) -> Evaluation:
    """Mean cross-entropy and top-1 accuracy of ``model`` on ``data``."""
    dev = next(model.parameters()).device
    model.eval()
    loss, correct = 0.0, 0
    for x, y in batches(data, batch_size):
        x, y = x.to(dev), y.to(dev)
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    n = max(len(data), 1)
    return Evaluation(loss / n, correct / n, len(data))
