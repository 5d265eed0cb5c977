"""Server-side strategies: Flower Message-API ``Strategy`` subclasses built with keyword arguments.

- :mod:`~pflower.strategies.federation`: identity, sampling, one phase of messages;
- :mod:`~pflower.strategies.gate`: every reply's validation, bounds and counts;
- :mod:`~pflower.strategies.loop`: the run loop (``start``), evaluation, records, checkpoints,
  and :class:`TrainRounds` (train, aggregate, evaluate);
- one module per server that differs: FedAvg (and its personalized variants), Local, pFedLA
  (and HeurpFedLA), SuPerFed, FedeRiCo's relay, Clustered FL, FedEM, FedFomo, pFedHN, pFedMe,
  SCAFFOLD; every one exported here, its parameters in its docstring.
"""

from pflower.strategies.cfl import ClusteredFL
from pflower.strategies.fedavg import FedAvg
from pflower.strategies.fedem import FedEM
from pflower.strategies.federico import FedericoRelay
from pflower.strategies.fedfomo import FedFomo
from pflower.strategies.local import Local
from pflower.strategies.loop import PflStrategy, RoundFailedError, TrainRounds
from pflower.strategies.personal import PersonalModels
from pflower.strategies.pfedhn import PFedHN
from pflower.strategies.pfedla import PFedLA
from pflower.strategies.pfedme import PFedMe
from pflower.strategies.scaffold import Scaffold
from pflower.strategies.superfed import SuperFed

__all__ = [
    "ClusteredFL",
    "FedAvg",
    "FedEM",
    "FedFomo",
    "FedericoRelay",
    "Local",
    "PFedHN",
    "PFedLA",
    "PFedMe",
    "PersonalModels",
    "PflStrategy",
    "RoundFailedError",
    "Scaffold",
    "SuperFed",
    "TrainRounds",
]
