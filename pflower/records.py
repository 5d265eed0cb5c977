"""The one conversion between PyTorch state dicts and Flower records, and byte accounting.

Records are on the CPU; a client computes on its model's device (:mod:`pflower.device`): what it
sends goes through :func:`to_record` (to the CPU), what it receives through :func:`received_state`
(to the device of the state it is checked against).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict

#: Flower's ``Array.stype`` of a NumPy array (its bytes: ``np.save``'s, header and data).
NUMPY = "numpy.ndarray"


@lru_cache(maxsize=1024)
def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes before a C-ordered array of this dtype and shape."""
    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype), allow_pickle=False)
    return buf.getvalue()[: buf.tell() - dtype.itemsize * int(np.prod(shape, dtype=np.int64))]


def _array(a: np.ndarray) -> Array:
    """``Array(a)`` for a C-contiguous array, byte for byte, without ``np.save``'s per-call
    work (its header is built once per dtype and shape); anything else goes through Flower."""
    if a.dtype.hasobject or not a.flags.c_contiguous:
        return Array(a)
    return Array(dtype=str(a.dtype), shape=tuple(int(d) for d in a.shape), stype=NUMPY, data=_npy_header(a.dtype, a.shape) + a.tobytes())


def _ndarray(a: Array) -> np.ndarray:
    """A writable copy of ``a.numpy()``: read straight from its bytes when they hold exactly
    the header ``np.save`` writes for its dtype and shape and then its data, else by Flower
    (``np.load``: which parses the header in Python, a few hundred microseconds per array)."""
    if a.stype == NUMPY:
        try:
            dtype, shape = np.dtype(a.dtype), tuple(a.shape)
        except TypeError:
            dtype = None
        # The declared shape comes from whoever sent the record: only one whose data the bytes
        # hold is ever built (a header of it allocates an array of that shape).
        if dtype is not None and not dtype.hasobject and all(type(d) is int and d >= 0 for d in shape):
            size = dtype.itemsize * math.prod(shape)
            if size < len(a.data):
                head = _npy_header(dtype, shape)
                if len(head) + size == len(a.data) and a.data.startswith(head):
                    return np.frombuffer(a.data, dtype, offset=len(head)).reshape(shape).copy()
    return np.array(a.numpy(), copy=True)


def to_record(state: Mapping[str, torch.Tensor], keys: Iterable[str] | None = None) -> ArrayRecord:
    """An ArrayRecord of ``state`` (all keys, or ``keys`` in that order), copied to CPU."""
    keys = list(state) if keys is None else list(keys)
    return ArrayRecord({k: _array(state[k].detach().cpu().contiguous().numpy()) for k in keys})


def from_record(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The tensors of an ArrayRecord, by key."""
    return {k: torch.from_numpy(_ndarray(a)) for k, a in record.items()}


def check_state(got: dict[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``got`` if its keys are known to ``reference`` and its shapes match; ValueError naming the first problem."""
    unknown = sorted(set(got) - set(reference))
    if unknown:
        raise ValueError(f"message carries arrays this model does not have: {unknown[:5]}")
    for k, v in got.items():
        if v.shape != reference[k].shape:
            raise ValueError(f"array '{k}' has shape {tuple(v.shape)}, the model needs {tuple(reference[k].shape)}")
    return got


def received_state(record: ArrayRecord, reference: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of ``record``, checked against ``reference`` (:func:`check_state`), each on its
    reference's device."""
    got = check_state(from_record(record), reference)
    return {k: v.to(reference[k].device) for k, v in got.items()}


def payload_bytes(content: RecordDict) -> int:
    """Bytes of array payload in a message: what the model costs on the wire."""
    return sum(len(a.data) for rec in content.array_records.values() for a in rec.values())


@dataclass(frozen=True)
class FlatSpec:
    """Where each key's tensor lives in a flat parameter vector."""

    keys: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor], keys: Iterable[str] | None = None) -> FlatSpec:
        keys = tuple(state if keys is None else keys)
        shapes = tuple(state[k].shape for k in keys)
        offsets = tuple(np.cumsum([0] + [int(np.prod(s)) for s in shapes]).tolist())
        return cls(keys, shapes, offsets)

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def slice(self, key: str) -> slice:
        i = self.keys.index(key)
        return slice(self.offsets[i], self.offsets[i + 1])

    def flatten(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One state as one float32 vector: :meth:`stack`'s row."""
        return self.stack([state])[0]

    def stack(self, states: Iterable[Mapping[str, torch.Tensor]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows of flattened states: shape [n, size], each value as :meth:`flatten` has it
        (float32), held as ``dtype``: written into one tensor, never a copy per row."""
        states = list(states)
        out = torch.empty((len(states), self.size), dtype=dtype)
        for row, state in zip(out, states):
            for k, a, b in zip(self.keys, self.offsets[:-1], self.offsets[1:]):
                row[a:b] = state[k].detach().reshape(-1).float()
        return out

    def unflatten(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: vec[a:b].reshape(shape) for k, shape, a, b in zip(self.keys, self.shapes, self.offsets[:-1], self.offsets[1:])}
