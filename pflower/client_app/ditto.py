"""Ditto client: a global model by FedAvg, and a personal model trained toward it.

Each round the client trains the received global model w (``local-epochs``, or ``local-steps``
steps) and uploads it; then its personal model v takes ``ditto.personal-epochs`` epochs on
CE(v) + lambda/2 ||v - w_t||^2, w_t the global model it received this round. Only w leaves the
client; v is what it predicts with. Both live in a :class:`MixedModel` (``fed`` = w, ``local`` = v).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split
from pflower.models import keys_under
from pflower.models.mixing import AtLambda, MixedModel


class DittoClient(ClientMethod):
    EVALUATES = "its personal model"

    def client_state(self, model: nn.Module) -> ClientState:
        """w (``fed``) is the model; the personal model v (``local``) stay private."""
        return ClientState.of(model, keys_under(model, "fed"))

    def fit(self, model: MixedModel, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        p = self.settings.params
        model.set_lambda(0.0)  # the forward pass is w
        loss = self._train_local(model, data, seed, params=list(model.fed.parameters()))
        anchors = [(v, received[f"fed.{k}"]) for k, v in model.local.named_parameters() if f"fed.{k}" in received]

        def personal_loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            prox = sum(((v - w) ** 2).sum() for v, w in anchors)
            return F.cross_entropy(m(x), y) + 0.5 * p.lam * prox

        self._train(AtLambda(model, 1.0), data, seed + 1, epochs=p.personal_epochs, params=list(model.local.parameters()), loss_fn=personal_loss)
        return loss

    def finetune(self, model: MixedModel, data: Split, seed: int, epochs: int) -> None:
        """Fine-tuning trains the personal model (what Ditto predicts with), plain cross-entropy."""
        self._train(AtLambda(model, 1.0), data, seed, epochs=epochs, params=list(model.local.parameters()))

    def predictor(self, model: MixedModel, state: RecordDict) -> nn.Module:
        return AtLambda(model, 1.0)
