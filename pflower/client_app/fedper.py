"""FedPer client: the classifier head stays personal; the body is federated."""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.models import communicable_keys, keys_under


class FedPerClient(ClientMethod):
    EVALUATES = "the global body as the server sends it, with its own head"

    def client_state(self, model: nn.Module) -> ClientState:
        """The body is the model; the head stays private."""
        head = set(keys_under(model, "head"))
        return ClientState.of(model, [k for k in communicable_keys(model) if k not in head])
