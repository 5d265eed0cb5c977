"""pFedLA and HeurpFedLA: layer-wise personalized aggregation learned by server-side hypernetworks.

Server state: every client's latest model (rows of ``theta`` [N, P], parameters only: BN
statistics stay on the clients) and one hypernetwork per client (``HyperNetworks``).
Each round, from one snapshot of ``theta``:

1. every sampled client i gets bar_theta_i, layer l = sum_j alpha_i^{l,j} theta_j^l;
2. it trains locally and returns theta_i_new;
3. the hypernetworks of the replying clients take one step that moves bar_theta_i toward
   theta_i_new, then theta_i <- theta_i_new;
4. every client evaluates its personalized model as the server sends it, from the new
   weights and models (the paper's protocol): what it evaluates is what aggregation made.

HeurpFedLA (``top-k`` > 0): the k layers with the highest self-weight alpha_i^{l,i} are
retained by client i: they are left out of its messages and the client uses its own copy.
The client still uploads every layer (others aggregate them). A retained layer is not a
function of the weights, so it gives the hypernetwork step no gradient. A client whose last
training reply the server did not accept (lost, rejected) may hold retained layers the server
has not seen: its next message carries every layer, so what it starts from is known again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflower.config import ConfigError, Settings
from pflower.models import Layer, layers
from pflower.records import FlatSpec, to_record
from pflower.similarity import alpha_structure
from pflower.strategies.base import PflStrategy
from pflower.strategies.hypernetwork import HyperNetworks, hypernetwork_update, keep_retained, layer_spread, mix
from pflower.strategies.validation import Reply

#: Record alpha of every client in metrics.json up to this many clients (N x layers x N numbers).
ALPHA_RECORD_LIMIT = 100
#: Clients per vectorized step: a round's extra memory is a few models per chunk, not per client.
CHUNK = 16


def _chunks(items: Sequence) -> list[Sequence]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]


class PFedLA(PflStrategy):
    def __init__(self, settings: Settings, template: Mapping[str, torch.Tensor], upload_keys: Sequence[str], layers: Sequence[Layer]):
        super().__init__(settings, template, upload_keys)
        self.layers = list(layers)
        self.spec = FlatSpec.of(template, [k for l in self.layers for k in l.keys])
        self.segments = [(self.spec.slice(l.keys[0]).start, self.spec.slice(l.keys[-1]).stop) for l in self.layers]
        self.initial = self.spec.flatten(template)
        self.top_k = getattr(settings.params, "top_k", 0)  # HeurpFedLA's
        if self.top_k > len(self.layers):
            raise ConfigError([(f"{settings.method}.top-k", self.top_k, f"must be <= {len(self.layers)} (layers of the model)")])
        self.theta: torch.Tensor | None = None
        self.hn: HyperNetworks | None = None
        self._outgoing: dict[int, ArrayRecord] = {}
        self.retained_in_training: dict[int, torch.Tensor] = {}  # client -> [L] bool, this round's training message
        self.unsynced: set[int] = set()  # trained, reply not accepted: own layers the server has not seen

    @classmethod
    def from_model(cls, settings: Settings, model: torch.nn.Module, upload_keys: Sequence[str]) -> "PFedLA":
        return cls(settings, model.state_dict(), upload_keys, layers(model))

    def discover(self, grid: Grid, timeout: float) -> None:
        """Learn the client ids, then allocate one model row and one hypernetwork per client."""
        super().discover(grid, timeout)
        s, n = self.settings, self.num_clients
        self.theta = self.initial.repeat(n, 1)
        p = s.params
        self.hn = HyperNetworks.create(n, len(self.layers), p.embedding_dim, p.hidden_dim, p.key_dim, s.seed)

    def retained_layers(self, alpha: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[S, L] bool: the ``top-k`` layers of highest self-weight alpha[s, l, ids[s]] (alpha [S, L, N])."""
        mask = torch.zeros(alpha.shape[:2], dtype=torch.bool)
        if self.top_k:
            own = alpha[torch.arange(len(ids)), :, ids]  # [S, L]
            mask.scatter_(1, torch.topk(own, self.top_k, dim=1).indices, True)
        return mask

    def _prepare(self, ids: list[int]) -> dict[int, torch.Tensor]:
        """bar_theta_i of ``ids`` from the current weights and models, as messages in ``_outgoing``
        without their retained layers; returns each client's retained layers."""
        retained = {}
        with torch.no_grad():
            for part in _chunks(ids):
                idx = torch.tensor(part)
                alpha = self.hn.alpha(idx)
                mask = self.retained_layers(alpha, idx)
                mask[[r for r, cid in enumerate(part) if cid in self.unsynced]] = False
                bar = mix(alpha, self.theta, self.segments)
                for r, cid in enumerate(part):
                    keep = {k for l, layer in enumerate(self.layers) if mask[r, l] for k in layer.keys}
                    self._outgoing[cid] = to_record(self.spec.unflatten(bar[r]), [k for k in self.spec.keys if k not in keep])
                    retained[cid] = mask[r]
        return retained

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        """Every sampled client's bar_theta_i, from this round's snapshot of ``theta``."""
        ids = self.sample(server_round)
        self.retained_in_training = self._prepare(ids)
        self.unsynced |= set(ids)  # until their replies are accepted
        return self._messages(ids, MessageType.TRAIN, self._pop, server_round, config)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        """Every client's personalized model after this round's update, as it would be sent for training."""
        ids = sorted(self.node_of)
        self._prepare(ids)
        return self._messages(ids, MessageType.EVALUATE, self._pop, server_round, config)

    def _pop(self, server_round: int, client_id: int) -> ArrayRecord:
        return self._outgoing.pop(client_id)

    def _retained_mask(self, ids: Sequence[int]) -> torch.Tensor:
        no = torch.zeros(len(self.layers), dtype=torch.bool)
        return torch.stack([self.retained_in_training.get(c, no) for c in ids])

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        """What the client trained from: bar_theta_i, with its retained layers its own model."""
        idx = torch.tensor([client_id])
        with torch.no_grad():
            alpha = keep_retained(self.hn.alpha(idx), idx, self._retained_mask([client_id]))
            return self.spec.unflatten(mix(alpha, self.theta, self.segments)[0])

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Hypernetwork steps against the round's snapshot, then the new client models."""
        if self.settings.params.hn_lr > 0:
            spread = layer_spread(self.theta, self.segments)
            for part in _chunks(replies):
                ids = [r.client_id for r in part]
                trained = self.spec.stack(r.arrays for r in part)
                hypernetwork_update(self.hn, torch.tensor(ids), self.theta, trained, self.segments, self.settings.params.hn_lr,
                                    retained=self._retained_mask(ids), spread=spread)  # fmt: skip
        for part in _chunks(replies):
            self.theta[torch.tensor([r.client_id for r in part])] = self.spec.stack(r.arrays for r in part)
        self.unsynced -= {r.client_id for r in replies}

    def state_dict(self) -> dict:
        """Client models, hypernetworks with embeddings and keys (plain SGD keeps no optimizer state)."""
        return {**super().state_dict(), "theta": self.theta, "hn": dict(self.hn.params), "hn-keys": self.hn.keys,
                "unsynced": sorted(self.unsynced)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.theta = state["theta"].clone()
        self.hn = HyperNetworks({k: v.clone() for k, v in state["hn"].items()}, state["hn-keys"].clone())
        self.unsynced = set(state["unsynced"])

    def round_extras(self, server_round: int) -> dict:
        """The weights after this round (alpha[client][layer] = list over clients) and, where the
        clients said their classes, how the weights follow them (:func:`alpha_structure`)."""
        if self.num_clients > ALPHA_RECORD_LIMIT:
            return {}
        with torch.no_grad():
            alpha = self.hn.alpha(torch.arange(self.num_clients))
        out: dict = {"alpha": {str(i): [[round(float(x), 5) for x in row] for row in a] for i, a in enumerate(alpha)}}
        if len(self.client_classes) == self.num_clients:
            structure = alpha_structure(alpha.numpy(), [self.client_classes[i] for i in range(self.num_clients)])
            out["alpha-structure"] = structure
            if server_round == self.settings.num_server_rounds:
                ratios = ", ".join("-" if r is None else f"{r:.2f}" for r in structure["ratio"])
                corr = ", ".join("-" if c is None else f"{c:.2f}" for c in structure["overlap-correlation"])
                log(INFO, "Weights per layer: same-classes / disjoint-classes ratio %s; correlation with class overlap %s", ratios, corr)
        return out
