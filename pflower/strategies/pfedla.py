"""pFedLA and HeurpFedLA: layer-wise personalized aggregation learned by server-side hypernetworks.

Server state: every client's latest model (rows of ``theta`` [N, P], parameters only: BN
statistics stay on the clients) and one hypernetwork per client (``HyperNetworks``).
Each round (the paper's Algorithm 1, clients in parallel):

1. every sampled client i gets bar_theta_i, layer l = sum_j alpha_i^{l,j} theta_j^l;
2. it trains locally and returns theta_i_new; its update is Delta_i = theta_i_new - bar_theta_i;
3. the server keeps theta_i <- theta_i_new, then the hypernetwork of every replying client
   takes one step (Eq. 10-11) along Delta_i, with the weights' Jacobian at the kept models: the
   weights move toward the clients whose models lie where the update went;
4. every client evaluates its personalized model as the server sends it, from the new
   weights and models (the paper's protocol): what it evaluates is what aggregation made.

HeurpFedLA (``top-k`` > 0): the k layers with the highest self-weight alpha_i^{l,i} are
retained by client i: they are left out of its messages and the client uses its own copy.
The client still uploads every layer (others aggregate them). A retained layer's weights keep
learning: its update (from the client's own layer) takes the same step as a mixed layer's, so
a layer that stops being retained is mixed with current weights, not with those of the round it
was first kept (the paper is silent; frozen, they fell behind and HeurpFedLA lost 3 points to
pFedLA on CIFAR-10). A client whose last
training reply the server did not accept (lost, rejected) may hold retained layers the server
has not seen: its next message carries every layer, so what it starts from is known again.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from logging import INFO

import torch
from flwr.app import ArrayRecord
from flwr.common.logger import log

from pflower.client_state import ClientState
from pflower.config import ConfigError, Settings
from pflower.models import layers
from pflower.records import to_record
from pflower.similarity import alpha_structure
from pflower.strategies.hypernetwork import HyperNetworks, hypernetwork_update, keep_retained, layer_norms, mix
from pflower.strategies.personal import LazyRecords, PersonalModels, chunks
from pflower.strategies.validation import Reply

#: Record alpha of every client in metrics.json up to this many clients (N x layers x N numbers).
ALPHA_RECORD_LIMIT = 100


class PFedLA(PersonalModels):
    """pFedLA, HeurpFedLA with ``top_k`` > 0; see the module docstring. A client that keeps no
    state gets its retained layers (its own copy) in its messages.

    Parameters
    ----------
    hn_lr : float (default: 100.0)
        SGD step of the hypernetworks and embeddings on the norm-scaled loss; 0 freezes the weights.
    head_start : str (default: "sum-1")
        The heads' raw outputs start at 1/N each (``sum-1``) or at 1 each (``sum-n``, the paper's).
    layer_loss : str (default: "norm")
        Each layer's loss divided by the clients' squared norms in it (``norm``) or not (``raw``).
    embedding_dim : int (default: 100)
        Size of each client's embedding.
    hidden_dim : int (default: 100)
        Width of the hypernetworks' 3-layer ReLU MLP.
    key_dim : int (default: 100)
        Heads are Linear(hidden → N) per layer while N ≤ this; beyond it a fixed random projection.
    top_k : int (default: 0)
        HeurpFedLA: layers of highest self-weight each client retains (not sent to it); 0 is pFedLA.
    **kwargs
        :class:`~pflower.strategies.personal.PersonalModels`' parameters (``layers``).
    """

    ROW_KEYS = {
        "alpha": "the weights after the round: alpha[client][layer], a list over clients (up to 100 clients)",
        "alpha-structure": "where the clients said their classes: how the weights follow them (same-classes / disjoint ratio, correlation)",
    }

    def __init__(
        self, *, hn_lr: float = 100.0, head_start: str = "sum-1", layer_loss: str = "norm", embedding_dim: int = 100, hidden_dim: int = 100,
        key_dim: int = 100, top_k: int = 0, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.hn_lr, self.embedding_dim, self.hidden_dim, self.key_dim, self.top_k = hn_lr, embedding_dim, hidden_dim, key_dim, top_k
        if head_start not in ("sum-1", "sum-n") or layer_loss not in ("norm", "raw"):
            raise ValueError(f"head_start={head_start!r} must be 'sum-1' or 'sum-n', layer_loss={layer_loss!r} 'norm' or 'raw'")
        self.head_start, self.layer_loss = head_start, layer_loss
        self.hn: HyperNetworks | None = None
        self.retained_in_training: dict[int, torch.Tensor] = {}  # client -> [L] bool, this round's training message
        self.unsynced: set[int] = set()  # trained, reply not accepted: own layers the server has not seen

    @classmethod
    def from_settings(cls, settings: Settings, model: torch.nn.Module, state: ClientState) -> PFedLA:
        p = settings.params
        strategy = cls(**cls.common_kwargs(settings), hn_lr=p.hn_lr, head_start=p.head_start, layer_loss=p.layer_loss, embedding_dim=p.embedding_dim,
                       hidden_dim=p.hidden_dim, key_dim=p.key_dim, top_k=getattr(p, "top_k", 0), layers=layers(model))  # fmt: skip
        strategy.initial_arrays = to_record(model.state_dict(), state.received)
        if strategy.top_k > len(strategy.layers):
            raise ConfigError([(f"{settings.method}.top-k", strategy.top_k, f"must be <= {len(strategy.layers)} (layers of the model)")])
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        """One model row and one hypernetwork per client, from the initial model."""
        super().prepare(initial_arrays)
        if self.top_k > len(self.layers):
            raise ValueError(f"top_k={self.top_k} must be <= {len(self.layers)} (layers of the model)")
        self.hn = HyperNetworks.create(self.num_clients, len(self.layers), self.embedding_dim, self.hidden_dim, self.key_dim, self.seed, self.head_start)

    def retained_layers(self, alpha: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[S, L] bool: the ``top-k`` layers of highest self-weight alpha[s, l, ids[s]] (alpha [S, L, N])."""
        mask = torch.zeros(alpha.shape[:2], dtype=torch.bool)
        if self.top_k:
            own = alpha[torch.arange(len(ids)), :, ids]  # [S, L]
            mask.scatter_(1, torch.topk(own, self.top_k, dim=1).indices, True)
        return mask

    def personalized(self, ids: Sequence[int], unsynced: Set[int] | None = None) -> tuple[dict[int, ArrayRecord], dict[int, torch.Tensor]]:
        """bar_theta_i of ``ids`` from the current weights and models, as records, and each
        client's retained layers ([L] bool). A client's record leaves out its retained layers,
        unless it keeps no state: then they carry its own model (and its non-layer arrays).
        ``unsynced``: the clients that get every layer (default: those unsynced now)."""
        unsynced = self.unsynced if unsynced is None else unsynced
        records, retained = {}, {}
        with torch.no_grad():
            for part in chunks(ids):
                idx = torch.tensor(part)
                alpha = self.hn.alpha(idx)
                mask = self.retained_layers(alpha, idx)
                mask[[r for r, cid in enumerate(part) if cid in unsynced]] = False
                bar = mix(keep_retained(alpha, idx, mask), self.theta, self.segments)
                for r, cid in enumerate(part):
                    records[cid] = self.record(cid, bar[r], (k for l, layer in enumerate(self.layers) if mask[r, l] for k in layer.keys))
                    retained[cid] = mask[r]
        return records, retained

    def _mask_absent(self) -> None:
        """Give no weight to the models of clients not in the federation (a node that never
        answered: its model is the initial one, and the weights learned to take up to a fifth of
        it); none while the federation names no client (the strategy used on its own)."""
        here = self.federation.node_of
        absent = [c for c in range(self.num_clients) if c not in here] if here else []
        self.hn.absent = torch.isin(torch.arange(self.num_clients), torch.tensor(absent)) if absent else None

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        """Every sampled client's bar_theta_i, from this round's snapshot of ``theta``."""
        self._mask_absent()
        records, self.retained_in_training = self.personalized(ids)
        self.unsynced |= set(ids)  # until their replies are accepted
        return records

    def evaluate_arrays(self, server_round: int, ids: list[int]) -> LazyRecords:
        """The personalized models after this round's update, as they would be sent for training
        now, built a chunk at a time as they are sent: the weights and models stay as they are
        until the next round's replies, and the clients unsynced are those of now."""
        unsynced = frozenset(self.unsynced)
        self._mask_absent()
        return LazyRecords(ids, lambda part: self.personalized(part, unsynced)[0])

    def _retained_mask(self, ids: Sequence[int]) -> torch.Tensor:
        no = torch.zeros(len(self.layers), dtype=torch.bool)
        return torch.stack([self.retained_in_training.get(c, no) for c in ids])

    def sent(self, ids: Sequence[int]) -> torch.Tensor:
        """[len(ids), P]: what clients ``ids`` were sent this round (bar_theta_i from the current
        weights and models, their retained layers their own models)."""
        idx = torch.tensor(list(ids))
        with torch.no_grad():
            return mix(keep_retained(self.hn.alpha(idx), idx, self._retained_mask(ids)), self.theta, self.segments)

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        """What the client trained from: bar_theta_i, with its retained layers its own model."""
        return self.spec.unflatten(self.sent([client_id])[0])

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """The replying clients' updates against what they were sent, their trained models into
        ``theta``, then the hypernetwork steps at the kept models."""
        updates = []
        self._mask_absent()
        for part in chunks(replies) if self.hn_lr > 0 else ():
            ids = [r.client_id for r in part]
            updates.append((ids, self.spec.stack(r.arrays for r in part) - self.sent(ids)))
        self.store(replies)
        if updates:
            norms = layer_norms(self.theta, self.segments) if self.layer_loss == "norm" else torch.ones(len(self.segments), dtype=torch.float64)
            for ids, delta in updates:
                hypernetwork_update(self.hn, torch.tensor(ids), self.theta, delta, self.segments, self.hn_lr, norms=norms)
        self.unsynced -= {r.client_id for r in replies}

    def state_dict(self) -> dict:
        """Client models, hypernetworks with embeddings and keys (plain SGD keeps no optimizer state)."""
        return {**super().state_dict(), "hn": dict(self.hn.params), "hn-keys": self.hn.keys, "unsynced": sorted(self.unsynced)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
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
        classes = self.federation.classes
        if len(classes) == self.num_clients:
            structure = alpha_structure(alpha.numpy(), [classes[i] for i in range(self.num_clients)])
            out["alpha-structure"] = structure
            if server_round == self.num_rounds:
                ratios = ", ".join("-" if r is None else f"{r:.2f}" for r in structure["ratio"])
                corr = ", ".join("-" if c is None else f"{c:.2f}" for c in structure["overlap-correlation"])
                log(INFO, "Weights per layer: same-classes / disjoint-classes ratio %s; correlation with class overlap %s%s", ratios, corr, _dashes(structure))
        return out


def _dashes(structure: dict) -> str:
    """Why the weights line has a '-' where it has one (:func:`alpha_structure`'s None)."""
    why = []
    if (layer := next((k for k, r in enumerate(structure["ratio"]) if r is None), None)) is not None:
        same, disjoint = structure["same"][layer], structure["disjoint"][layer]
        why.append(
            "ratio -: "
            + (
                "no two clients have the same class set"
                if same is None
                else "every two clients share a class"
                if disjoint is None
                else "no weight on clients sharing no class"
            )
        )
    if None in structure["overlap-correlation"]:
        why.append("correlation -: every other client gets the same weight in that layer")
    return f" ({'; '.join(why)})" if why else ""
