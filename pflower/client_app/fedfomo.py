"""FedFomo client: before training, weigh the models the server sent by what they do for its
held-out data, and move its model toward the useful ones.

For every received model theta_j: w_j = (L(theta_old) - L(theta_j)) / ||theta_j - theta_old||,
L the cross-entropy on ``fedfomo.val-fraction`` of its training split (held out, never trained
on). Negative weights are dropped, the rest normalized, and theta_new = theta_old +
sum_j w_j (theta_j - theta_old); with no positive weight it keeps theta_old. Then local training
on the rest of the training split. Its reply reports every w_j (the server's affinities).
"""

from __future__ import annotations

import torch
from flwr.app import RecordDict
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split, holdout
from pflower.methods.fedfomo import IDS, PEER_PREFIX, WEIGHTS
from pflower.models import layers
from pflower.records import received_state
from pflower.training import evaluate


def fomo_weights(own_loss: float, losses: list[float], distances: list[float]) -> tuple[list[float], torch.Tensor]:
    """(raw weights, normalized positive weights) of the received models."""
    raw = [(own_loss - loss) / (dist + 1e-5) for loss, dist in zip(losses, distances)]
    w = torch.tensor(raw, dtype=torch.float64).clamp_min(0)
    return raw, w / w.sum() if w.sum() > 0 else w


class FedFomoClient(ClientMethod):
    EVALUATES = "its own model"

    def client_state(self, model: nn.Module) -> ClientState:
        """Every layer's parameters are the model; BN statistics stay private."""
        return ClientState.of(model, [k for layer in layers(model) for k in layer.keys])

    def _split(self, data: Split) -> tuple[Split, Split]:
        return holdout(data, self.settings.params.val_fraction, self.settings.split_seed)

    def before_fit(self, model: nn.Module, data: Split, incoming: RecordDict, server_round: int) -> dict:
        names = sorted((n for n in incoming.array_records if n.startswith(PEER_PREFIX)), key=lambda n: int(n.removeprefix(PEER_PREFIX)))
        if not names:
            return {}
        _, validation = self._split(data)
        state = self.client_state(model)
        keys = state.uploaded
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        peers, losses, distances = [], [], []
        for name in names:
            theta = received_state(incoming[name], {k: own[k] for k in state.received})  # another client's model: what this one receives
            model.load_state_dict(theta, strict=False)
            losses.append(evaluate(model, validation).loss)
            distances.append(float(sum((theta[k].double() - own[k].double()).square().sum() for k in keys)) ** 0.5)
            peers.append(theta)
        model.load_state_dict(own)
        raw, w = fomo_weights(evaluate(model, validation).loss, losses, distances)
        if w.sum() > 0:
            moved = {k: own[k] + sum(float(wj) * (p[k] - own[k]) for wj, p in zip(w, peers)) for k in keys}
            model.load_state_dict(moved, strict=False)
        return {IDS: [int(n.removeprefix(PEER_PREFIX)) for n in names], WEIGHTS: [float(x) for x in raw]}

    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        train, _ = self._split(data)
        return self._train_local(model, train, seed)
