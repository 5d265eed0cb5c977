"""Local training: every client trains alone and sends nothing."""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState


class LocalClient(ClientMethod):
    EVALUATES = "its own model"

    def client_state(self, model: nn.Module) -> ClientState:
        """Everything stays private."""
        return ClientState.of(model, [])
