"""FedProx client: FedAvg's update plus (mu / 2) ||w - w_global||^2."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.datasets.federated import Split


class FedProxClient(ClientMethod):
    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        mu = self.settings.params.mu
        named = dict(model.named_parameters())
        anchors = [(named[k], v) for k, v in received.items() if k in named]

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            prox = sum(((p - g) ** 2).sum() for p, g in anchors)
            return F.cross_entropy(m(x), y) + 0.5 * mu * prox

        return self._train_local(model, data, seed, loss_fn=loss_fn)
