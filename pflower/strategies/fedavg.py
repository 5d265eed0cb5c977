"""FedAvg over the keys a method uploads (FedAvg, FedProx, FedPer, FedRep, FedBN).

Personalized baselines differ only on the client: what they keep local never reaches the
server, so the server averages exactly the uploaded keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from flwr.app import ArrayRecord

from pflower.config import Settings
from pflower.records import FlatSpec, to_record
from pflower.strategies.base import PflStrategy
from pflower.strategies.validation import Reply


def weighted_average(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Rows of ``stacked`` [clients, params] averaged with ``weights`` [clients]."""
    w = weights.to(stacked.dtype)
    return (w / w.sum()) @ stacked


class FedAvg(PflStrategy):
    """Sample-weighted average of the uploaded arrays, one matrix product per round."""

    def __init__(self, settings: Settings, template: Mapping[str, torch.Tensor], upload_keys: Sequence[str]):
        super().__init__(settings, template, upload_keys)
        self.spec = FlatSpec.of(template, upload_keys)
        self.dtypes = {k: template[k].dtype for k in upload_keys}
        self.global_state = {k: template[k].detach().clone() for k in upload_keys}
        self._record = to_record(self.global_state)

    def train_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        return self._record

    def evaluate_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        return self._record

    def global_arrays(self) -> ArrayRecord:
        return self._record

    def state_dict(self) -> dict:
        return {**super().state_dict(), "global": dict(self.global_state)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.global_state = {k: state["global"][k].to(self.dtypes[k]) for k in self.dtypes}
        self._record = to_record(self.global_state)

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        stacked = self.spec.stack(r.arrays for r in replies)
        weights = torch.tensor([r.num_examples for r in replies], dtype=torch.float64)
        avg = self.spec.unflatten(weighted_average(stacked.double(), weights))
        self.global_state = {k: v.to(self.dtypes[k]) for k, v in avg.items()}
        self._record = to_record(self.global_state)
