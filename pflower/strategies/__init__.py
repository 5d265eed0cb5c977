"""Server-side strategies: Flower Message-API ``Strategy`` subclasses built with keyword arguments.

- :mod:`~pflower.strategies.federation`: identity, sampling, one phase of messages;
- :mod:`~pflower.strategies.gate`: every reply's validation, bounds and counts;
- :mod:`~pflower.strategies.loop`: the run loop (``start``), evaluation, records, checkpoints,
  and :class:`TrainRounds` (train, aggregate, evaluate);
- one module per server that differs: FedAvg (and its personalized variants), Local, pFedLA,
  SuPerFed, FedeRiCo's relay.
"""

from pflower.strategies.fedavg import FedAvg
from pflower.strategies.federico import FedericoRelay
from pflower.strategies.local import Local
from pflower.strategies.loop import PflStrategy, RoundFailedError, TrainRounds
from pflower.strategies.pfedla import PFedLA
from pflower.strategies.superfed import SuperFed

__all__ = ["FedAvg", "FedericoRelay", "Local", "PFedLA", "PflStrategy", "RoundFailedError", "SuperFed", "TrainRounds"]
