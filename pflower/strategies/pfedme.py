"""pFedMe's server: FedAvg of the clients' local models, mixed into the global model with beta:
w <- (1 - beta) w + beta mean_i(w_i) (beta = 1 is FedAvg)."""

from __future__ import annotations

from torch import nn

from pflower.client_state import ClientState
from pflower.config import Settings
from pflower.strategies.fedavg import FedAvg
from pflower.strategies.validation import Reply


class PFedMe(FedAvg):
    """pFedMe's server: the average of the clients' local models, mixed into the global one.

    Parameters
    ----------
    beta : float (default: 1.0)
        Server mixing w ← (1 − β)·w + β·mean(w_i); 1 is FedAvg.
    **kwargs
        :class:`~pflower.strategies.fedavg.FedAvg`'s parameters.
    """

    def __init__(self, *, beta: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.beta = beta

    @classmethod
    def from_settings(cls, settings: Settings, model: nn.Module, state: ClientState) -> PFedMe:
        strategy = super().from_settings(settings, model, state)
        strategy.beta = settings.params.beta
        return strategy

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        before = dict(self.global_state)
        super().aggregate(server_round, replies)
        if self.beta != 1.0:
            for k, new in self.global_state.items():
                self.global_state[k] = ((1 - self.beta) * before[k].double() + self.beta * new.double()).to(self.dtypes[k])
            self._records.clear()
