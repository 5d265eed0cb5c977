"""pFedLA and HeurpFedLA: layer-wise personalized aggregation learned by server-side hypernetworks.

Server state: every client's latest model (rows of ``theta`` [N, P], parameters only: BN
statistics stay on the clients) and one hypernetwork per client (``HyperNetworks``).
Each round, from one snapshot of ``theta``:

1. every sampled client i gets bar_theta_i, layer l = sum_j alpha_i^{l,j} theta_j^l;
2. it trains locally and returns theta_i_new;
3. the hypernetworks of the replying clients take one step that moves bar_theta_i toward
   theta_i_new, then theta_i <- theta_i_new.

HeurpFedLA (``top-k`` > 0): the k layers with the highest self-weight alpha_i^{l,i} are
retained by client i: they are left out of its message and the client keeps its own copy.
The client still uploads every layer (others aggregate them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from flwr.serverapp import Grid

from pflower.config import ConfigError, Settings
from pflower.models import Layer, layers
from pflower.records import FlatSpec, to_record
from pflower.strategies.base import PflStrategy
from pflower.strategies.hypernetwork import HyperNetworks, hypernetwork_update, mix
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
        self.top_k = settings.top_k if settings.method == "heurpfedla" else 0
        if self.top_k > len(self.layers):
            raise ConfigError([("top-k", self.top_k, f"must be <= {len(self.layers)} (layers of the model)")])
        self.theta: torch.Tensor | None = None
        self.hn: HyperNetworks | None = None
        self._outgoing: dict[int, ArrayRecord] = {}

    @classmethod
    def from_model(cls, settings: Settings, model: torch.nn.Module, upload_keys: Sequence[str]) -> "PFedLA":
        return cls(settings, model.state_dict(), upload_keys, layers(model))

    def discover(self, grid: Grid, timeout: float) -> None:
        """Learn the client ids, then allocate one model row and one hypernetwork per client."""
        super().discover(grid, timeout)
        s, n = self.settings, self.num_clients
        self.theta = self.initial.repeat(n, 1)
        self.hn = HyperNetworks.create(n, len(self.layers), s.hn_embedding_dim, s.hn_hidden_dim, s.hn_key_dim, s.seed)

    def retained(self, alpha: torch.Tensor, client_id: int) -> set[str]:
        """Keys of the ``top-k`` layers with the highest self-weight (alpha [L, N] of the client)."""
        if self.top_k == 0:
            return set()
        top = torch.topk(alpha[:, client_id], self.top_k).indices.tolist()
        return {k for l in top for k in self.layers[l].keys}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        """Every sampled client's bar_theta_i, from this round's snapshot of ``theta``."""
        ids = self.sample(server_round)
        with torch.no_grad():
            for part in _chunks(ids):
                alpha = self.hn.alpha(torch.tensor(part))
                bar = mix(alpha, self.theta, self.segments)
                for r, cid in enumerate(part):
                    keys = [k for k in self.spec.keys if k not in self.retained(alpha[r], cid)]
                    self._outgoing[cid] = to_record(self.spec.unflatten(bar[r]), keys)
        return self._messages(ids, MessageType.TRAIN, self.train_arrays, server_round, config)

    def train_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        return self._outgoing.pop(client_id)

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        """What the client trained from: bar_theta_i, with its retained layers its own model."""
        with torch.no_grad():
            alpha = self.hn.alpha(torch.tensor([client_id]))
            state = self.spec.unflatten(mix(alpha, self.theta, self.segments)[0])
        own = self.spec.unflatten(self.theta[client_id])
        return {k: own[k] if k in self.retained(alpha[0], client_id) else v for k, v in state.items()}

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Hypernetwork steps against the round's snapshot, then the new client models."""
        for part in _chunks(replies):
            ids = torch.tensor([r.client_id for r in part])
            trained = self.spec.stack(r.arrays for r in part)
            hypernetwork_update(self.hn, ids, self.theta, trained, self.segments, self.settings.hn_lr)
        for part in _chunks(replies):
            self.theta[torch.tensor([r.client_id for r in part])] = self.spec.stack(r.arrays for r in part)

    def state_dict(self) -> dict:
        """Client models, hypernetworks with embeddings and keys (plain SGD keeps no optimizer state)."""
        return {**super().state_dict(), "theta": self.theta, "hn": dict(self.hn.params), "hn-keys": self.hn.keys}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.theta = state["theta"].clone()
        self.hn = HyperNetworks({k: v.clone() for k, v in state["hn"].items()}, state["hn-keys"].clone())

    def round_extras(self, server_round: int) -> dict:
        """The aggregation weights after this round: alpha[client][layer] = list over clients."""
        if self.num_clients > ALPHA_RECORD_LIMIT:
            return {}
        with torch.no_grad():
            alpha = self.hn.alpha(torch.arange(self.num_clients))
        return {"alpha": {str(i): [[round(float(x), 5) for x in row] for row in a] for i, a in enumerate(alpha)}}
