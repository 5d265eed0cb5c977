"""LG-FedAvg client: the representation (the body) stays personal, the classifier head is
federated; the opposite split of FedPer."""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.models import keys_under


class LGFedAvgClient(ClientMethod):
    EVALUATES = "its own body with the global head as the server sends it"

    def upload_keys(self, model: nn.Module) -> list[str]:
        return keys_under(model, "head")
