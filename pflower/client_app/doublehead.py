"""Double-head client: the base and the global head are federated, the local head never leaves.

Both heads learn from every minibatch, each with its own cross-entropy on the shared base's
features; the prediction takes the more confident head per class (:mod:`pflower.models.doublehead`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split
from pflower.models import DoubleHead, communicable_keys, keys_under


def two_heads_loss(model: DoubleHead, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    global_logits, local_logits = model.heads(x)
    return F.cross_entropy(global_logits, y) + F.cross_entropy(local_logits, y)


class DoubleHeadClient(ClientMethod):
    EVALUATES = "the base and global head as the server sends them, with its own local head"

    def client_state(self, model: nn.Module) -> ClientState:
        """The base and the global head are the model; the local head stays private."""
        local = set(keys_under(model, "local_head"))
        return ClientState.of(model, [k for k in communicable_keys(model) if k not in local])

    def fit(self, model: DoubleHead, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        return self._train_local(model, data, seed, loss_fn=two_heads_loss)

    def finetune(self, model: DoubleHead, data: Split, seed: int, epochs: int) -> None:
        self._train(model, data, seed, epochs=epochs, loss_fn=two_heads_loss)
