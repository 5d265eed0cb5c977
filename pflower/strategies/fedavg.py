"""FedAvg over the keys a method uploads (FedAvg, FedProx, FedPer, FedRep, FedBN).

Personalized baselines differ only on the client: what they keep local never reaches the
server, so the server averages exactly the uploaded keys. ``aggregation`` picks the average:
the sample-weighted mean, or (robust to a few wild clients, unweighted like Flower's
FedMedian and FedTrimmedAvg) the coordinate-wise median or trimmed mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from flwr.app import ArrayRecord

from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

from pflower.config import Settings
from pflower.records import FlatSpec, to_record
from pflower.strategies.base import PflStrategy
from pflower.strategies.validation import Reply


def weighted_average(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Rows of ``stacked`` [clients, params] averaged with ``weights`` [clients]."""
    w = weights.to(stacked.dtype)
    return (w / w.sum()) @ stacked


def robust_average(stacked: torch.Tensor, aggregation: str, trim_fraction: float) -> torch.Tensor:
    """Coordinate-wise median or trimmed mean of the rows of ``stacked`` (Flower's implementations)."""
    rows = [([row.numpy()], 1) for row in stacked]
    if aggregation == "median":
        return torch.from_numpy(aggregate_median(rows)[0])
    return torch.from_numpy(aggregate_trimmed_avg(rows, trim_fraction)[0])


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

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        return self.global_state

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        s = self.settings
        stacked = self.spec.stack(r.arrays for r in replies).double()
        if s.aggregation == "mean":
            weights = torch.tensor([r.num_examples for r in replies], dtype=torch.float64)
            flat = weighted_average(stacked, weights)
        else:
            flat = robust_average(stacked, s.aggregation, s.trim_fraction)
        avg = self.spec.unflatten(flat)
        self.global_state = {k: v.to(self.dtypes[k]) for k, v in avg.items()}
        self._record = to_record(self.global_state)
