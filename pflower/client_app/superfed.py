"""SuPerFed client: a federated and a local model trained together on one low-loss line.

Each minibatch draws lambda ~ U(0, 1) (one, or one per layer) and trains the mixed network
W(lambda) = (1 - lambda) w_f + lambda w_l; the loss adds ``superfed-mu`` x sum over tensors of
||w_f - w_g|| (un-squared, as the official code) and ``superfed-nu`` x cos^2(w_f, w_l). Before
round ``superfed-start`` x rounds, lambda = 0 and w_l is frozen. Only w_f is uploaded; w_l
starts from the client's own seed and stays in its personal state.

Evaluation reports the test accuracy at every lambda of the grid 0, 0.1, ..., 1, and as the
client's accuracy the one at the lambda chosen on held-out training data (10% of the training
split, never trained on): the lowest held-out cross-entropy, the client's own plus the
federation's (the sample-weighted mean of all clients' held-out curves of the previous
evaluation, which the server sends as ``superfed-pooled-val-loss``). A few dozen held-out
images per client cannot tell neighbouring lambdas apart; the federation's curve, from ten
times as many, steadies the choice. A client that never trained uses lambda = 0, the global
model, and reports no held-out curve.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split, holdout
from pflower.methods.superfed import POOLED_KEY
from pflower.models import keys_under
from pflower.models.mixing import LAMBDA_GRID, MixedModel, cosine_squared
from pflower.training import evaluate

#: Share of a client's training split held out to choose its lambda.
VALIDATION_FRACTION = 0.1


def choose_lambda(val_loss: Sequence[float], pooled: Sequence[float] | None = None) -> int:
    """Index of the grid lambda with the lowest held-out loss, own plus pooled (first on ties)."""
    score = np.asarray(val_loss, dtype=np.float64)
    if pooled is not None:
        if len(pooled) != len(score):
            raise ValueError(f"{POOLED_KEY} has {len(pooled)} values; the lambda grid has {len(score)}")
        score = score + np.asarray(pooled, dtype=np.float64)
    return int(np.argmin(score))


class SuperFedClient(ClientMethod):
    EVALUATES = "the mixed model at the lambda chosen on held-out training data (own plus pooled held-out loss)"

    def client_state(self, model: nn.Module) -> ClientState:
        """w (``fed``) is the model; the local weights w_l stay private."""
        return ClientState.of(model, keys_under(model, "fed"))

    def initial_state(self, model: MixedModel, client_id: int) -> dict[str, torch.Tensor]:
        """The common federated init, and local weights from the client's own seed, drawn on the
        CPU (by the CPU's generator, whatever the model's device) and copied in."""
        seed = int(np.random.SeedSequence([self.settings.seed, client_id, 11]).generate_state(1)[0])
        local = copy.deepcopy(model.local).cpu()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in local.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        model.local.load_state_dict(local.state_dict())
        return model.state_dict()

    def _split(self, data: Split) -> tuple[Split, Split]:
        return holdout(data, VALIDATION_FRACTION, self.settings.split_seed)

    def fit(self, model: MixedModel, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        s = self.settings
        train, _ = self._split(data)
        mixing = server_round > s.params.start * s.num_server_rounds
        generator = torch.Generator().manual_seed(seed + 1)
        fed, local = list(model.fed.parameters()), list(model.local.parameters())
        named = dict(model.fed.named_parameters())
        anchors = [(named[k[4:]], v) for k, v in received.items() if k[4:] in named]

        def loss_fn(m: MixedModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if mixing:
                m.draw_lambda(generator)
            loss = F.cross_entropy(m(x), y)
            if s.params.mu > 0 and anchors:
                loss = loss + s.params.mu * sum(torch.linalg.vector_norm(p - g) for p, g in anchors)
            if mixing and s.params.nu > 0:
                loss = loss + s.params.nu * cosine_squared(fed, local)
            return loss

        model.set_lambda(0.0)
        try:
            return self._train_local(model, train, seed, params=fed + local if mixing else fed, loss_fn=loss_fn)
        finally:
            model.set_lambda(0.0)

    def evaluate(self, model: MixedModel, train: Split, test: Split, trained: bool, config: Mapping[str, Any]) -> dict:
        _, validation = self._split(train)
        curve, val_loss = [], []
        for lam in LAMBDA_GRID:
            model.set_lambda(lam)
            curve.append(evaluate(model, test))
            if trained:
                val_loss.append(evaluate(model, validation).loss)
        model.set_lambda(0.0)
        if not trained:
            return {**curve[0].metrics(), "lambda": 0.0, "lambda-accuracy": [c.accuracy for c in curve]}
        best = choose_lambda(val_loss, config.get(POOLED_KEY))
        return {
            **curve[best].metrics(),
            "lambda": LAMBDA_GRID[best],
            "lambda-accuracy": [c.accuracy for c in curve],
            "lambda-val-loss": val_loss,
            "val-examples": len(validation),
        }
