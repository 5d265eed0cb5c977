"""FedAvg over the keys a method uploads (FedAvg, FedProx, FedPer, FedRep, FedBN).

Personalized baselines differ only on the client: what they keep local never reaches the
server, so the server averages exactly the uploaded keys. ``aggregation`` picks the average:
the sample-weighted mean, or (robust to a few wild clients, unweighted like Flower's
FedMedian and FedTrimmedAvg) the coordinate-wise median or trimmed mean. With
``gradual-interval`` only the layers released so far are sent and averaged
(:mod:`pflower.sharing`); the others keep their initial value on the server.
"""

from __future__ import annotations

from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.logger import log
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg
from flwr.serverapp import Grid
from torch import nn

from pflower.client_state import ClientState
from pflower.config import Settings
from pflower.records import FlatSpec, from_record, to_record
from pflower.sharing import GradualSharing
from pflower.strategies.loop import TrainRounds
from pflower.strategies.validation import ArraySpec, Reply


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


class FedAvg(TrainRounds):
    """Sample-weighted average of the uploaded (and released) arrays, one matrix product per round.

    Built with keyword arguments like Flower's ``FedAvg``. The global model is the
    ``initial_arrays`` given to :meth:`start`, averaged each round.

    Parameters
    ----------
    aggregation : str (default: "mean")
        ``mean`` (sample-weighted), ``median`` or ``trimmed-mean`` (coordinate-wise, unweighted).
    trim_fraction : float or None (default: None, which is 0.2)
        ``trimmed-mean``: share cut at each end, in [0, 0.5); refused with another ``aggregation``.
    sharing : GradualSharing or None (default: None)
        Gradual sharing's schedule (the double head); None shares every array every round.
    **kwargs
        :class:`~pflower.strategies.loop.TrainRounds`' and :class:`~pflower.strategies.loop.PflStrategy`'s parameters.
    """

    ROW_KEYS = {"phase": "with gradual sharing (`gradual-interval`): the round's phase, how many layers are shared"}

    def __init__(self, *, aggregation: str = "mean", trim_fraction: float | None = None, sharing: GradualSharing | None = None, **kwargs):
        super().__init__(**kwargs)
        if aggregation not in ("mean", "median", "trimmed-mean"):
            raise ValueError(f"aggregation={aggregation!r} must be 'mean', 'median' or 'trimmed-mean'")
        if trim_fraction is not None and aggregation != "trimmed-mean":
            raise ValueError(f"trim_fraction={trim_fraction} applies to aggregation='trimmed-mean' only (aggregation={aggregation!r})")
        if trim_fraction is not None and not 0 <= trim_fraction < 0.5:
            raise ValueError(f"trim_fraction={trim_fraction} must be in [0, 0.5)")
        self.aggregation = aggregation
        self.trim_fraction = 0.2 if trim_fraction is None else trim_fraction
        self.sharing = sharing
        self.dtypes: dict[str, torch.dtype] = {}
        self.global_state: dict[str, torch.Tensor] = {}
        self._specs: dict[int, FlatSpec] = {}  # units shared -> flat layout of their keys
        self._records: dict[int, ArrayRecord] = {}  # units shared -> their current global arrays

    @classmethod
    def from_settings(cls, settings: Settings, model: nn.Module, state: ClientState) -> FedAvg:
        s = settings
        sharing = GradualSharing.of(model, state.uploaded, s.gradual_interval)
        trim = {"trim_fraction": s.trim_fraction} if s.aggregation == "trimmed-mean" else {}
        strategy = cls(**cls.common_kwargs(s), aggregation=s.aggregation, sharing=sharing, **trim)
        strategy.initial_arrays = to_record(model.state_dict(), state.received)
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        state = from_record(initial_arrays)
        self.sharing = self.sharing or GradualSharing((tuple(state),), 0)
        self.dtypes = {k: v.dtype for k, v in state.items()}
        self.global_state = state
        self._records.clear()

    def _record(self, units: int) -> ArrayRecord:
        if units not in self._records:
            self._records[units] = to_record({k: self.global_state[k] for k in self.sharing.keys_of(units)})
        return self._records[units]

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        record = self._record(self.sharing.sent_phase(server_round))
        return {cid: record for cid in ids}

    def evaluate_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        record = self._record(self.sharing.phase(server_round))
        return {cid: record for cid in ids}

    def global_arrays(self) -> ArrayRecord:
        return self._record(len(self.sharing.units)) if self.sharing else ArrayRecord()

    def upload_spec_for(self, server_round: int) -> dict[str, ArraySpec]:
        return {k: self.upload_spec[k] for k in self.sharing.keys(server_round)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "global": dict(self.global_state)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.global_state = {k: state["global"][k].to(self.dtypes[k]) for k in self.dtypes}
        self._records.clear()

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        return self.global_state

    def round_extras(self, server_round: int) -> dict:
        """With gradual sharing: the round's phase (how many layers it shared)."""
        return {"phase": self.sharing.phase(server_round)} if self.sharing.interval else {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        if self.sharing.interval:
            p = self.sharing.phase(server_round)
            log(
                INFO,
                "Gradual sharing, round %d: phase %d of %d, sharing layers up to '%s'",
                server_round,
                p,
                len(self.sharing.units),
                self.sharing.layer_name(p - 1),
            )
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        units = self.sharing.phase(server_round)
        if units not in self._specs:
            self._specs[units] = FlatSpec.of(self.global_state, self.sharing.keys_of(units))
        spec = self._specs[units]
        stacked = spec.stack((r.arrays for r in replies), torch.float64)
        if self.aggregation == "mean":
            weights = torch.tensor([r.num_examples for r in replies], dtype=torch.float64)
            flat = weighted_average(stacked, weights)
        else:
            flat = robust_average(stacked, self.aggregation, self.trim_fraction)
        for k, v in spec.unflatten(flat).items():
            self.global_state[k] = v.to(self.dtypes[k])
        self._records.clear()
