"""FedFomo's server: every client's latest model, and an affinity matrix P (P[i, j]: the sum of
the weights client i gave client j's model; the identity at the start).

Each round every sampled client gets ``m`` other clients' models (those that have trained): per
slot, with probability ``epsilon`` a random one, otherwise the one of highest affinity left
(seeded by seed, round and client). Its reply brings its trained model and the weights it
computed; the server keeps the model and adds the weights to P. Clients evaluate their own model.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord

from pflower.client_state import ClientState
from pflower.config import Settings
from pflower.methods.fedfomo import IDS, WEIGHTS, peer_model
from pflower.models import layers
from pflower.records import to_record
from pflower.strategies.personal import PersonalModels
from pflower.strategies.validation import Rejected, Reply


class FedFomo(PersonalModels):
    """FedFomo's server: each sampled client gets ``m`` other clients' models, chosen by affinity.

    Parameters
    ----------
    m : int (default: 5)
        Other clients' models the server sends each sampled client.
    epsilon : float (default: 0.3)
        Per model slot, the probability of a random client instead of the highest affinity.
    **kwargs
        :class:`~pflower.strategies.personal.PersonalModels`' parameters."""

    STATEFUL_CLIENTS = True  # its clients weigh the models they get against their own

    ROW_KEYS = {"fomo-weights": "each trained client's weights on the models it was sent, by their owners"}

    def __init__(self, *, m: int = 5, epsilon: float = 0.3, **kwargs):
        super().__init__(**kwargs)
        self.m, self.epsilon = m, epsilon
        self.affinity: torch.Tensor | None = None
        self.trained: set[int] = set()
        self.weights: dict[int, dict[int, float]] = {}  # this round's: client -> {peer: weight}
        self.sent: dict[int, list[int]] = {}  # this round's: client -> the peers whose models it got

    @classmethod
    def from_settings(cls, settings: Settings, model: torch.nn.Module, state: ClientState) -> FedFomo:
        p = settings.params
        strategy = cls(**cls.common_kwargs(settings), m=p.m, epsilon=p.epsilon, layers=layers(model))
        strategy.initial_arrays = to_record(model.state_dict(), state.received)
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        self.affinity = torch.eye(self.num_clients, dtype=torch.float64)

    def choose(self, client_id: int, server_round: int) -> list[int]:
        """The other clients whose models ``client_id`` gets this round (see the module docstring)."""
        left = sorted(self.trained - {client_id})
        rng = np.random.default_rng([self.seed, server_round, client_id])
        chosen = []
        while left and len(chosen) < self.m:
            if rng.random() < self.epsilon:
                pick = left[int(rng.integers(len(left)))]
            else:
                pick = max(left, key=lambda j: (float(self.affinity[client_id, j]), -j))
            chosen.append(pick)
            left.remove(pick)
        return sorted(chosen)

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        return {cid: ArrayRecord() for cid in ids}  # a client trains from its own model

    def train_extras(self, server_round: int, ids: list[int]) -> dict[int, dict]:
        chosen = self.sent = {cid: self.choose(cid, server_round) for cid in ids}
        records = {j: to_record(self.spec.unflatten(self.theta[j])) for j in sorted({j for c in chosen.values() for j in c})}
        return {cid: {peer_model(j): records[j] for j in peers} for cid, peers in chosen.items()}

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        """Its model before the round (the weighted move is part of its update)."""
        return self.spec.unflatten(self.theta[client_id])

    def check_reply(self, reply: Reply) -> None:
        """Its weights are of the peers it was sent this round (their types and lengths: its declaration)."""
        if sorted(reply.metrics.get(IDS, [])) != self.sent.get(reply.client_id, []):
            raise Rejected("malformed", f"'{IDS}' must be the peers it was sent this round")

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        self.store(replies)
        self.weights = {}
        for r in replies:
            ids, weights = r.metrics.get(IDS, []), r.metrics.get(WEIGHTS, [])
            if ids:
                self.affinity[r.client_id, torch.tensor(ids)] += torch.tensor(weights, dtype=torch.float64)
            self.weights[r.client_id] = dict(zip(ids, weights))
            self.trained.add(r.client_id)

    def round_extras(self, server_round: int) -> dict:
        """``fomo-weights``: the weights each trained client gave the models it got this round."""
        return {"fomo-weights": {str(i): {str(j): round(float(w), 6) for j, w in ws.items()} for i, ws in sorted(self.weights.items())}}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "affinity": self.affinity, "trained": sorted(self.trained)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.affinity = state["affinity"].clone()
        self.trained = set(state["trained"])
