"""What servers that keep or make a model per client share (pFedLA, pFedHN, FedFomo): the
model's layers as segments of one flat vector, the clients' models as rows of one tensor
(``theta`` [N, P]), work in chunks of clients, and records for every kind of client.

A layer is a module's parameters (from the model, or found from the ``initial_arrays`` keys);
arrays that belong to no layer (BatchNorm statistics) stay with the clients. A client that
keeps no state (a ClientApp without a ``query`` handler) is sent them instead, as it last
uploaded them, with every layer (pFedLA, pFedHN; FedFomo needs clients that keep their model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import torch
from flwr.app import ArrayRecord

from pflower.models import Layer
from pflower.models.layers import layers_of_state
from pflower.records import FlatSpec, from_record, to_record
from pflower.strategies.loop import TrainRounds
from pflower.strategies.validation import Reply

#: Clients per vectorized step: building or stepping models takes a few models per chunk, not per client.
CHUNK = 16


def chunks(items: Sequence) -> list[Sequence]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]


class LazyRecords(Mapping[int, ArrayRecord]):
    """The records of clients ``ids``, built when asked for, a chunk at a time: ``build(part)``
    gives the records of one chunk of :func:`chunks` (the chunks an eager build of ``ids`` makes,
    so the records are the same), and only the last chunk built is kept. An evaluation of N
    clients sent through a message window then holds a chunk of models, not N of them.
    ``build`` must read server state that stays as it is until the records are sent."""

    def __init__(self, ids: Sequence[int], build: Callable[[Sequence[int]], Mapping[int, ArrayRecord]]):
        self.ids = list(ids)
        self._size = CHUNK
        self._chunk_of = {cid: i // self._size for i, cid in enumerate(self.ids)}
        self._build = build
        self._built: tuple[int, Mapping[int, ArrayRecord]] = (-1, {})
        self.builds = 0  # chunks built so far

    def __getitem__(self, cid: int) -> ArrayRecord:
        k = self._chunk_of[cid]
        if self._built[0] != k:
            self._built = (k, {})  # the previous chunk goes before the next is built
            self._built = (k, self._build(self.ids[k * self._size : (k + 1) * self._size]))
            self.builds += 1
        return self._built[1][cid]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


class PersonalModels(TrainRounds):
    """The shared part of the servers that keep a model per client.

    ``KEEPS_MODELS``: whether the server stores every client's latest model in ``theta``.

    Parameters
    ----------
    layers : list or None (default: None)
        The model's layers (their array names); None: found from the initial arrays.
    **kwargs
        :class:`~pflower.strategies.loop.TrainRounds`' parameters.
    """

    KEEPS_MODELS = True

    def __init__(self, *, layers: Sequence[Layer] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.layers = list(layers) if layers is not None else None
        self.theta: torch.Tensor | None = None
        self.extras: dict[int, dict[str, torch.Tensor]] = {}  # stateless clients' non-layer arrays

    @property
    def num_clients(self) -> int:
        return self.federation.num_clients

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        state = from_record(initial_arrays)
        self.layers = self.layers or layers_of_state(state)
        self.spec = FlatSpec.of(state, [k for l in self.layers for k in l.keys])
        self.segments = [(self.spec.slice(l.keys[0]).start, self.spec.slice(l.keys[-1]).stop) for l in self.layers]
        self.extra_keys = [k for k in state if k not in self.spec.keys]
        self.initial_extras = {k: state[k] for k in self.extra_keys}
        self.initial = self.spec.flatten(state)
        if self.KEEPS_MODELS:
            self.theta = self.initial.repeat(self.num_clients, 1)

    def record(self, client_id: int, flat: torch.Tensor, leave_out: Iterable[str] = ()) -> ArrayRecord:
        """A client's record of the flat model ``flat``: without the keys ``leave_out``, or for a
        stateless client everything it loads (every layer and its non-layer arrays)."""
        state = self.spec.unflatten(flat)
        if client_id in self.federation.stateless:
            return to_record({**state, **self.extras.get(client_id, self.initial_extras)})
        skip = set(leave_out)
        return to_record(state, [k for k in self.spec.keys if k not in skip])

    def store(self, replies: list[Reply]) -> None:
        """The replying clients' models into ``theta`` (and stateless clients' non-layer arrays)."""
        if self.KEEPS_MODELS:
            for part in chunks(replies):
                self.theta[torch.tensor([r.client_id for r in part])] = self.spec.stack(r.arrays for r in part)
        for r in replies:
            if r.client_id in self.federation.stateless and self.extra_keys:
                self.extras[r.client_id] = {k: r.arrays[k] for k in self.extra_keys}

    def global_arrays(self) -> ArrayRecord:
        """The clients' models averaged by their samples (what ``evaluate_fn`` evaluates)."""
        if self.theta is None:
            return ArrayRecord()
        n = torch.tensor([float(self.federation.num_examples.get(c, 1)) for c in range(self.num_clients)])
        return to_record({**self.initial_extras, **self.spec.unflatten((n / n.sum()) @ self.theta)})

    def state_dict(self) -> dict:
        return {**super().state_dict(), "theta": self.theta, "extras": {str(c): e for c, e in self.extras.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.theta = None if state["theta"] is None else state["theta"].clone()
        self.extras = {int(c): e for c, e in state["extras"].items()}
