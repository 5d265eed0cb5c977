"""Local training: the server only schedules rounds; no model goes either way."""

from __future__ import annotations

from flwr.app import ArrayRecord

from pflower.strategies.loop import TrainRounds
from pflower.strategies.validation import Reply


class Local(TrainRounds):
    """Local training: each sampled client trains its own model; nothing is averaged.

    Parameters
    ----------
    **kwargs
        :class:`~pflower.strategies.loop.TrainRounds`' parameters.
    """

    STATEFUL_CLIENTS = True

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        return {cid: ArrayRecord() for cid in ids}

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Nothing to aggregate: every client keeps its own model."""
