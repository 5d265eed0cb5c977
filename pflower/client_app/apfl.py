"""APFL client: a global model w (averaged by the server), a local model v and a learned mixing
weight alpha; the client predicts with the mixture alpha v + (1 - alpha) w.

One minibatch step moves all three with the run's optimizer and learning rate, from one loss
CE(f(x; w)) + CE(f(x; alpha v + (1 - alpha) sg(w))) (sg: no gradient): w by its own loss, v and
alpha by the mixture's, as the paper's updates w <- w - lr grad f(w),
v <- v - lr grad_v f(mix), alpha <- alpha - lr grad_alpha f(mix); alpha is kept in [0, 1].
The models are mixed by parameters, as the paper does (some ports mix logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from torch import nn
from torch.func import functional_call

from pflower.client_app.base import PERSONAL, ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split
from pflower.models import keys_under
from pflower.models.mixing import AtLambda, MixedModel
from pflower.records import from_record


def apfl_loss(model: MixedModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of one APFL step (see the module docstring); alpha is clamped to [0, 1] first."""
    with torch.no_grad():
        model.alpha.clamp_(0.0, 1.0)
    fed, loc = dict(model.fed.named_parameters()), dict(model.local.named_parameters())
    mixed = {k: model.alpha * loc[k] + (1 - model.alpha) * fed[k].detach() for k in fed}
    global_loss = F.cross_entropy(model.fed(x), y)
    mixture_loss = F.cross_entropy(functional_call(model.fed, {**mixed, **dict(model.fed.named_buffers())}, (x,)), y)
    return global_loss + mixture_loss


class APFLClient(ClientMethod):
    EVALUATES = "the mixture alpha v + (1 - alpha) w of its local model and the global model as the server sends it"

    def client_state(self, model: nn.Module) -> ClientState:
        """w (``fed``) is the model; the local model v and alpha stay private."""
        return ClientState.of(model, keys_under(model, "fed"))

    def fit(self, model: MixedModel, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        loss = self._train_local(model, data, seed, loss_fn=apfl_loss)
        with torch.no_grad():
            model.alpha.clamp_(0.0, 1.0)
        return loss

    def predictor(self, model: MixedModel, state: RecordDict) -> nn.Module:
        return AtLambda(model, float(model.alpha.detach()))

    def finetune(self, model: MixedModel, data: Split, seed: int, epochs: int) -> None:
        """Fine-tuning runs APFL's own steps (w, v and alpha) for ``epochs``."""
        self._train(model, data, seed, epochs=epochs, loss_fn=apfl_loss)
        with torch.no_grad():
            model.alpha.clamp_(0.0, 1.0)

    def report(self, state: RecordDict) -> dict:
        """Its alpha, for metrics.json."""
        return {"alpha": float(from_record(state[PERSONAL])["alpha"])} if PERSONAL in state else {}
