"""Server-side strategies (Flower Message-API ``Strategy`` subclasses)."""

from pflower.strategies.base import PflStrategy
from pflower.strategies.fedavg import FedAvg
from pflower.strategies.local import Local

__all__ = ["FedAvg", "Local", "PflStrategy"]
