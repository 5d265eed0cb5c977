"""Server-side strategies (Flower Message-API ``Strategy`` subclasses)."""

from pflower.strategies.base import PflStrategy
from pflower.strategies.fedavg import FedAvg
from pflower.strategies.federico import FedericoRelay
from pflower.strategies.local import Local
from pflower.strategies.pfedla import PFedLA
from pflower.strategies.superfed import SuperFed

__all__ = ["FedAvg", "FedericoRelay", "Local", "PFedLA", "PflStrategy", "SuperFed"]
