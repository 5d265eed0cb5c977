"""pFedMe client: a personalized model theta (Moreau envelope) and a local copy w of the global model.

For every minibatch: ``pfedme.k`` steps on theta toward argmin f(theta; batch) + lambda/2
||theta - w||^2 (step ``pfedme.personal-lr``), then w <- w - eta lambda (w - theta) (the optimizer's
step ``pfedme.lr`` on lambda/2 ||w - sg(theta)||^2). theta starts each round at the received global model
(as the official code); w is uploaded, theta is what the client predicts with. Both live in a
:class:`MixedModel` (``fed`` = w, ``local`` = theta).
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


class PFedMeClient(ClientMethod):
    EVALUATES = "its personalized model theta"

    def client_state(self, model: nn.Module) -> ClientState:
        """w (``fed``) is the model; theta (``local``) stay private."""
        return ClientState.of(model, keys_under(model, "fed"))

    def fit(self, model: MixedModel, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        p = self.settings.params
        fed, theta = list(model.fed.parameters()), list(model.local.parameters())
        with torch.no_grad():
            for t, w in zip(theta, fed):
                t.copy_(w)
        personal = AtLambda(model, 1.0)

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for _ in range(p.k):
                inner = F.cross_entropy(personal(x), y)
                grads = torch.autograd.grad(inner, theta)
                with torch.no_grad():
                    for t, g, w in zip(theta, grads, fed):
                        t -= p.personal_lr * (g + p.lam * (t - w))
            pull = 0.5 * p.lam * sum(((w - t.detach()) ** 2).sum() for w, t in zip(fed, theta))
            return pull - pull.detach() + inner.detach()

        model.set_lambda(0.0)
        return self._train_local(model, data, seed, params=fed, loss_fn=loss_fn, lr=p.lr)

    def predictor(self, model: MixedModel, state: RecordDict) -> nn.Module:
        return AtLambda(model, 1.0)

    def finetune(self, model: MixedModel, data: Split, seed: int, epochs: int) -> None:
        """Fine-tuning trains the personalized model, plain cross-entropy."""
        self._train(AtLambda(model, 1.0), data, seed, epochs=epochs, params=list(model.local.parameters()))
