"""pFedHN's server: one hypernetwork generates every client's whole model from the client's
embedding (:class:`~pflower.strategies.hypernetwork.ModelGenerator`).

Each round a sampled client gets its generated model, trains it and returns it; the replying
clients' trained models take the hypernetwork (and their embeddings) one step toward them
(grad_outputs = generated - trained; the gradient gathered in chunks of clients, all against the
round's starting hypernetwork). Clients evaluate the model the
hypernetwork generates for them after the round. The server keeps no client model.
"""

from __future__ import annotations

import os

import torch
from flwr.app import ArrayRecord

from pflower.client_state import ClientState
from pflower.config import Settings
from pflower.models import layers
from pflower.records import to_record
from pflower.strategies.hypernetwork import ModelGenerator, generator_update
from pflower.strategies.personal import LazyRecords, PersonalModels, chunks
from pflower.strategies.validation import Reply


def physical_memory() -> int:
    """Bytes of RAM on this machine (the hypernetwork lives in the ServerApp's process)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class PFedHN(PersonalModels):
    """pFedHN's server: one hypernetwork generates every client's model from its embedding.

    Parameters
    ----------
    embedding_dim : int (default: 0)
        Size of each client's embedding; 0: 1 + N/4 (the official code's).
    hidden_dim : int (default: 100)
        Width of the hypernetwork's MLP.
    n_hidden : int (default: 3)
        Hidden layers of the MLP after its first.
    hn_lr : float (default: 0.01)
        SGD step of the hypernetwork and embeddings.
    momentum : float (default: 0.9)
        SGD momentum of the hypernetwork.
    weight_decay : float (default: 0.001)
        Weight decay of the hypernetwork.
    **kwargs
        :class:`~pflower.strategies.personal.PersonalModels`' parameters."""

    KEEPS_MODELS = False

    def __init__(
        self, *, embedding_dim: int = 0, hidden_dim: int = 100, n_hidden: int = 3, hn_lr: float = 0.01, momentum: float = 0.9,
        weight_decay: float = 1e-3, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.embedding_dim, self.hidden_dim, self.n_hidden = embedding_dim, hidden_dim, n_hidden
        self.hn_lr, self.momentum, self.weight_decay = hn_lr, momentum, weight_decay
        self.generator: ModelGenerator | None = None

    @classmethod
    def from_settings(cls, settings: Settings, model: torch.nn.Module, state: ClientState) -> PFedHN:
        p = settings.params
        strategy = cls(**cls.common_kwargs(settings), embedding_dim=p.embedding_dim, hidden_dim=p.hidden_dim, n_hidden=p.n_hidden,
                       hn_lr=p.hn_lr, momentum=p.momentum, weight_decay=p.weight_decay, layers=layers(model))  # fmt: skip
        strategy.initial_arrays = to_record(model.state_dict(), state.received)
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        need, have = 3 * 4 * self.hidden_dim * self.spec.size, physical_memory()  # head weights, velocity, gradient (float32)
        if need > have:
            raise ValueError(
                f"pFedHN's hypernetwork ends in Linear(pfedhn.hidden-dim={self.hidden_dim} -> the model's {self.spec.size:,} parameters): "
                f"with its momentum and gradient about {need / 2**30:.1f} GiB, more than this machine's {have / 2**30:.1f} GiB; "
                "lower pfedhn.hidden-dim or run a smaller model"
            )
        e = self.embedding_dim or 1 + self.num_clients // 4
        self.generator = ModelGenerator.create(self.num_clients, self.spec.size, e, self.hidden_dim, self.n_hidden, self.seed)

    def generated(self, ids: list[int]) -> dict[int, ArrayRecord]:
        out = {}
        with torch.no_grad():
            for part in chunks(ids):
                flat = self.generator.generate(torch.tensor(part))
                out.update({cid: self.record(cid, flat[r]) for r, cid in enumerate(part)})
        return out

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        return self.generated(ids)

    def evaluate_arrays(self, server_round: int, ids: list[int]) -> LazyRecords:
        """The generated models, built a chunk at a time as they are sent (the hypernetwork
        stays as it is until the next round's replies)."""
        return LazyRecords(ids, self.generated)

    def update_reference(self, client_id: int) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return self.spec.unflatten(self.generator.generate(torch.tensor([client_id]))[0])

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """One step of the hypernetwork for the round, its gradient gathered chunk by chunk."""
        parts = [(torch.tensor([r.client_id for r in part]), self.spec.stack(r.arrays for r in part)) for part in chunks(replies)]
        generator_update(self.generator, parts, self.hn_lr, self.momentum, self.weight_decay)
        self.store(replies)

    def global_arrays(self) -> ArrayRecord:
        """The mean of every client's generated model (what ``evaluate_fn`` evaluates)."""
        if self.generator is None:
            return ArrayRecord()
        with torch.no_grad():
            total = sum(self.generator.generate(torch.tensor(part)).sum(0) for part in chunks(list(range(self.num_clients))))
        return to_record({**self.initial_extras, **self.spec.unflatten(total / self.num_clients)})

    def state_dict(self) -> dict:
        return {**super().state_dict(), "generator": dict(self.generator.params), "velocity": dict(self.generator.velocity)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.generator = ModelGenerator({k: v.clone() for k, v in state["generator"].items()}, {k: v.clone() for k, v in state["velocity"].items()})
