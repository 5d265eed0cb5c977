"""Per-FedAvg client: MAML-style local steps on the global model; the client predicts with the
global model after one adaptation step on its own data.

One step takes ``parts`` consecutive batches of ``batch-size`` (2 first-order, 3 Hessian-free;
one batch of the training loop, split): w_tmp = w - alpha grad f(w; D1), then

- ``fo``: w <- w - beta grad f(w_tmp; D2);
- ``hf``: w <- w - beta (I - alpha H(w; D3)) grad f(w_tmp; D2), the Hessian-vector product taken
  exactly by a second backward pass, never forming H (the paper approximates it by finite
  differences of gradients).

beta is the optimizer's step (the loop's ``lr``), alpha the inner and adaptation step.
Evaluation copies the received global model, takes one SGD step of alpha on one batch of the
training split (the same batch for a client in a round), and evaluates the copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pflower.client_app.base import ClientMethod
from pflower.datasets.federated import Split
from pflower.training import evaluate, train


def maml_loss(alpha: float, variant: str):
    """The loss of one Per-FedAvg step for the training loop: its value is f(w_tmp; D2), its
    gradient in w the step's direction (see the module docstring)."""
    parts = 2 if variant == "fo" else 3

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        n = len(y) // parts
        if n == 0:  # a last batch too small to split: a plain step
            return F.cross_entropy(model(x), y)
        params, buffers = dict(model.named_parameters()), dict(model.named_buffers())

        def f(p: Mapping[str, torch.Tensor], lo: int, hi: int) -> torch.Tensor:
            return F.cross_entropy(functional_call(model, {**p, **buffers}, (x[lo:hi],)), y[lo:hi])

        g1 = torch.autograd.grad(f(params, 0, n), list(params.values()))
        tmp = {k: p - alpha * g.detach() for (k, p), g in zip(params.items(), g1)}
        outer = f(tmp, n, 2 * n)
        if variant == "fo":
            return outer  # its gradient in w is grad f(w_tmp; D2): w_tmp is w minus a constant
        v = [g.detach() for g in torch.autograd.grad(outer, list(tmp.values()))]
        g3 = torch.autograd.grad(f(params, 2 * n, 3 * n), list(params.values()), create_graph=True)
        surrogate = sum((p * vi).sum() for p, vi in zip(params.values(), v)) - alpha * sum((g * vi).sum() for g, vi in zip(g3, v))
        return surrogate - surrogate.detach() + outer.detach()

    return loss_fn


class PerFedAvgClient(ClientMethod):
    EVALUATES = "the global model as the server sends it, after one SGD step of perfedavg.alpha on one batch of its training split"

    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        s, p = self.settings, self.settings.params
        parts = 2 if p.variant == "fo" else 3
        return self._train_local(model, data, seed, loss_fn=maml_loss(p.alpha, p.variant), lr=p.beta, batch_size=parts * s.batch_size)

    def evaluate(self, model: nn.Module, train_split: Split, test: Split, trained: bool, config: Mapping[str, Any]) -> dict:
        s = self.settings
        rng = np.random.default_rng([s.seed, int(config.get("server-round", 0)), len(train_split)])
        idx = torch.from_numpy(rng.permutation(len(train_split))[: s.batch_size])
        adapted = copy.deepcopy(model)
        train(adapted, Split(train_split.x[idx], train_split.y[idx]), epochs=1, batch_size=len(idx), lr=s.params.alpha, seed=0)
        return evaluate(adapted, test).metrics()
