"""FedEM's server: FedAvg per component, component k averaged with the weights n_t π_tk.

n_t π_tk = Σ_i q_tik is how many of client t's samples component k explains (the client's
E-step, :mod:`pflower.client_app.fedem`), so each component's average is the one of the
weighted-likelihood M-step over all clients' samples. The client reports its π in the training
reply (``fedem-pi``, required, of length K). A component that no replying client uses (every
weight 0) keeps its value. With ``aggregation`` 'median' or 'trimmed-mean' the averages are
unweighted, as FedAvg's. π is never averaged: each client keeps its own; each round's row of
metrics.json records the π the clients reported (``fedem-pi``).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, MessageType

from pflower import reply_metrics
from pflower.methods.fedem import PI_METRIC
from pflower.models.mixture import COMPONENTS
from pflower.records import FlatSpec
from pflower.strategies.fedavg import FedAvg, weighted_average
from pflower.strategies.validation import Reply


def component_of(key: str) -> int:
    """k of a key ``components.<k>.<rest>``."""
    return int(key[len(COMPONENTS) :].partition(".")[0])


def component_weights(replies: list[Reply], components: int) -> torch.Tensor:
    """[K, clients] float64: n_t π_tk, from each reply's sample count and reported π."""
    n = torch.tensor([r.num_examples for r in replies], dtype=torch.float64)
    pi = torch.tensor([r.metrics[PI_METRIC] for r in replies], dtype=torch.float64).reshape(len(replies), components)
    return (n[:, None] * pi).T


class FedEM(FedAvg):
    """:class:`FedAvg` whose mean weighs each component by the clients' n_t π_tk.

    Parameters
    ----------
    **kwargs
        :class:`~pflower.strategies.fedavg.FedAvg`'s parameters."""

    ROW_KEYS = {PI_METRIC: "each trained client's mixture weights π over the components"}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.components = 0
        self.component_specs: list[FlatSpec] = []
        self.pi: dict[int, list[float]] = {}  # the round's replies' π, by client (metrics.json)

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        keys = [k for k in self.global_state if k.startswith(COMPONENTS)]
        self.components = 1 + max(component_of(k) for k in keys)
        self.component_specs = [FlatSpec.of(self.global_state, [k for k in keys if component_of(k) == c]) for c in range(self.components)]
        train = dict(self.gate.schemas[MessageType.TRAIN])
        train[PI_METRIC] = reply_metrics.Numbers(reply_metrics.UNIT, length=self.components)
        train["num-examples"] = reply_metrics.Count("train", requires=(PI_METRIC,))  # every training reply brings π
        self.gate.schemas[MessageType.TRAIN] = train

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        self.pi = {r.client_id: list(r.metrics[PI_METRIC]) for r in replies}
        if self.aggregation != "mean":
            return super().aggregate(server_round, replies)
        weights = component_weights(replies, self.components)
        for spec, w in zip(self.component_specs, weights):
            if not w.sum() > 0:
                continue
            flat = weighted_average(spec.stack((r.arrays for r in replies), torch.float64), w)
            for k, v in spec.unflatten(flat).items():
                self.global_state[k] = v.to(self.dtypes[k])
        self._records.clear()

    def round_extras(self, server_round: int) -> dict:
        """``fedem-pi``: the π each client that trained this round reported (after its M-step)."""
        return {**super().round_extras(server_round), PI_METRIC: {str(c): [round(float(p), 6) for p in pi] for c, pi in sorted(self.pi.items())}}
