"""pFedLA / HeurpFedLA client: trains what it receives (its personalized model) and uploads every
layer's parameters; BN statistics and, for HeurpFedLA, the retained layers the server did not
send stay in its personal state."""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.models import layers


class PFedLAClient(ClientMethod):
    EVALUATES = "its personalized model as the server sends it (HeurpFedLA: its retained layers its own)"

    def client_state(self, model: nn.Module) -> ClientState:
        """Every layer's parameters are the model; BN statistics stay private."""
        return ClientState.of(model, [k for layer in layers(model) for k in layer.keys])
