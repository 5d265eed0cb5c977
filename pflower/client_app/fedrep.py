"""FedRep client: train the personal head with the body frozen (``local-epochs``, or
``local-steps`` steps), then the body with the head frozen (``fedrep.body-epochs``, epochs
either way); only the body is federated."""

from __future__ import annotations

import torch
from torch import nn

from pflower.client_app.fedper import FedPerClient
from pflower.datasets.federated import Split


class FedRepClient(FedPerClient):
    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        head = list(model.head.parameters())
        head_ids = {id(p) for p in head}
        body = [p for p in model.parameters() if id(p) not in head_ids]
        self._train_local(model, data, seed, params=head)
        return self._train(model, data, seed + 1, epochs=self.settings.params.body_epochs, params=body)
