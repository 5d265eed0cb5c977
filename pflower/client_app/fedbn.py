"""FedBN client: normalization layers (affine parameters and running statistics) stay personal.

With a model without normalization layers (``model='cnn'``) this is FedAvg; use
``model='cnn-bn'`` on 1-channel data.
"""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.models import communicable_keys, norm_keys


class FedBNClient(ClientMethod):
    EVALUATES = "the global model as the server sends it, with its own normalization layers"

    def client_state(self, model: nn.Module) -> ClientState:
        """Everything but the normalization layers is the model; they stay private."""
        local = set(norm_keys(model))
        return ClientState.of(model, [k for k in communicable_keys(model) if k not in local])
