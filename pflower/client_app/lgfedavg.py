"""LG-FedAvg client: the representation (the body) stays personal, the classifier head is
federated; the opposite split of FedPer."""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.models import keys_under


class LGFedAvgClient(ClientMethod):
    EVALUATES = "its own body with the global head as the server sends it"

    def client_state(self, model: nn.Module) -> ClientState:
        """The head is the model; the body stays private."""
        return ClientState.of(model, keys_under(model, "head"))
