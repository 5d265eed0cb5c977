"""Local training: the server only schedules rounds; no model goes either way."""

from __future__ import annotations

from flwr.app import ArrayRecord

from pflower.strategies.base import PflStrategy
from pflower.strategies.validation import Reply


class Local(PflStrategy):
    def train_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        return ArrayRecord()

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Nothing to aggregate: every client keeps its own model."""
