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

from pflower.datasets.federated import Split

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def batches(data: Split, batch_size: int, generator: torch.Generator | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Minibatches in random order (``generator``) or in order (None)."""
    n = len(data)
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        yield data.x[idx], data.y[idx]


def steps_of(data: Split, batch_size: int, generator: torch.Generator, epochs: int, steps: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The minibatches of a local training: ``epochs`` passes over ``data``, or with ``steps`` > 0
    exactly that many minibatches, cycling over it (each pass in a new random order)."""
    if steps <= 0:
        for _ in range(epochs):
            yield from batches(data, batch_size, generator)
        return
    if len(data) == 0:
        return
    left = steps
    while left > 0:
        for batch in batches(data, batch_size, generator):
            yield batch
            left -= 1
            if left == 0:
                return


def train(
    model: nn.Module,
    data: Split,
    *,
    epochs: int,
    steps: int = 0,
    batch_size: int,
    lr: float,
    seed: int,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    optimizer: str = "sgd",
    params: Iterable[nn.Parameter] | None = None,
    loss_fn: LossFn = cross_entropy,
) -> float:
    """SGD (or Adam, ``optimizer='adam'``) over ``data`` for ``epochs``, or for exactly ``steps``
    minibatches when ``steps`` > 0 (``local-steps``: cycling over the data, a new order each pass);
    returns the mean minibatch loss.

    ``params`` limits what the optimizer moves (default: every parameter); ``seed`` fixes the
    minibatch order, so a client's update is reproducible.
    """
    dev = next(model.parameters()).device
    params = list(model.parameters() if params is None else params)
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    total, count = 0.0, 0
    for x, y in steps_of(data, batch_size, gen, epochs, steps):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        total += float(loss.detach())
        count += 1
    return total / max(count, 1)


#: Confidence bins of the calibration errors (ECE, MCE), as in SuPerFed's robustness study.
CALIBRATION_BINS = 15


@dataclass(frozen=True)
class Evaluation:
    loss: float
    accuracy: float
    num_examples: int
    top5: float = 0.0
    ece: float = 0.0
    mce: float = 0.0

    def metrics(self) -> dict[str, float | int]:
        """As reply metrics: loss, accuracy, top5-accuracy, ece, mce, num-examples."""
        return {"loss": self.loss, "accuracy": self.accuracy, "top5-accuracy": self.top5, "ece": self.ece,
                "mce": self.mce, "num-examples": self.num_examples}  # fmt: skip


def calibration_errors(confidence: torch.Tensor, correct: torch.Tensor, bins: int = CALIBRATION_BINS) -> tuple[float, float]:
    """Expected and maximum calibration error over equal-width confidence bins."""
    edges = torch.linspace(0, 1, bins + 1)
    which = torch.clamp(torch.bucketize(confidence, edges[1:-1], right=True), 0, bins - 1)
    count = torch.bincount(which, minlength=bins).double()
    conf = torch.bincount(which, weights=confidence.double(), minlength=bins)
    acc = torch.bincount(which, weights=correct.double(), minlength=bins)
    used = count > 0
    gap = (acc[used] / count[used] - conf[used] / count[used]).abs()
    if not used.any():
        return 0.0, 0.0
    return float((gap * count[used]).sum() / count.sum()), float(gap.max())


@torch.no_grad()
def evaluate(model: nn.Module, data: Split, batch_size: int = 512) -> Evaluation:
    """Mean cross-entropy, top-1 and top-5 accuracy, ECE and MCE of ``model`` on ``data``."""
    dev = next(model.parameters()).device
    model.eval()
    loss, correct, top5 = 0.0, [], 0
    confidence = []
    for x, y in batches(data, batch_size):
        x, y = x.to(dev), y.to(dev)
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        prob = logits.softmax(1)
        conf, pred = prob.max(1)
        correct.append((pred == y).cpu())
        confidence.append(conf.cpu())
        k = min(5, logits.shape[1])
        top5 += int((logits.topk(k, 1).indices == y[:, None]).any(1).sum())
    n = max(len(data), 1)
    if not correct:
        return Evaluation(0.0, 0.0, 0)
    hits = torch.cat(correct)
    ece, mce = calibration_errors(torch.cat(confidence), hits)
    return Evaluation(loss / n, float(hits.sum()) / n, len(data), top5 / n, ece, mce)
