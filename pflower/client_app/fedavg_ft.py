"""FedAvg+ (FedeRiCo's baseline): FedAvg whose clients train the received global model one local
epoch on their training split before every evaluation. It shows what fine-tuning alone buys."""

from __future__ import annotations

from pflower.client_app.base import ClientMethod


class FedAvgFTClient(ClientMethod):
    EVALUATES = "the global model as the server sends it, after 1 local epoch on its training split"

    @property
    def finetune_epochs(self) -> int:
        return 1
