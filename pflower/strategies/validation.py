"""The one reply validator: a reply that fails any check never touches server state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, Message

from pflower.records import from_record


@dataclass(frozen=True)
class ArraySpec:
    """The expected shape and dtype of one uploaded array."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor) -> ArraySpec:
        return cls(tuple(t.shape), t.dtype)


@dataclass(frozen=True)
class Reply:
    """A validated reply: who sent it, its metrics, and its arrays (maybe none)."""

    client_id: int
    num_examples: int
    metrics: dict
    arrays: dict[str, torch.Tensor]


class Rejected(Exception):
    """Why a reply was rejected; ``reason`` is the counter key in metrics.json."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def check_reply(msg: Message, expected_client: int | None, spec: Mapping[str, ArraySpec] | None) -> Reply:
    """Validate one reply; raise :class:`Rejected` naming the first problem.

    ``expected_client``: the client of the node it came from (None for an identity reply, which
    must say its ``client-id``; other replies may omit it, and must match if they say it).
    ``spec`` is None for replies that carry no arrays (evaluation), else the exact set of
    arrays expected with their shapes and dtypes.
    """
    if msg.has_error():
        raise Rejected("client-error", f"client error: {msg.error.reason}")
    content = msg.content
    if len(content.metric_records) != 1:
        raise Rejected("malformed", f"expected one MetricRecord, got {len(content.metric_records)}")
    metrics = dict(next(iter(content.metric_records.values())))
    cid = metrics.get("client-id", expected_client)  # optional once the node's client is known
    if not isinstance(cid, int) or (expected_client is not None and cid != expected_client):
        raise Rejected("client-id", f"client-id {cid!r} does not match the node's client {expected_client}")
    n = metrics.get("num-examples")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise Rejected("num-examples", f"num-examples {n!r} is not a positive integer")
    arrays: dict[str, torch.Tensor] = {}
    if spec is not None:
        records = list(content.array_records.values())
        if len(records) != 1:
            raise Rejected("malformed", f"expected one ArrayRecord, got {len(records)}")
        arrays = check_arrays(records[0], spec)
    for k, v in metrics.items():
        if isinstance(v, float) and not np.isfinite(v):
            raise Rejected("non-finite", f"metric '{k}' is {v}")
    return Reply(cid, n, metrics, arrays)


def check_arrays(record: ArrayRecord, spec: Mapping[str, ArraySpec]) -> dict[str, torch.Tensor]:
    """The tensors of ``record`` if it has exactly the arrays of ``spec`` (shapes, dtypes), all finite."""
    keys = set(record.keys())
    if keys != set(spec):
        missing, extra = sorted(set(spec) - keys), sorted(keys - set(spec))
        raise Rejected("keys", f"missing arrays {missing[:3]}, unexpected arrays {extra[:3]}")
    try:
        arrays = from_record(record)
    except (ValueError, TypeError) as err:
        raise Rejected("malformed", f"undecodable array: {err}") from None
    for k, t in arrays.items():
        want = spec[k]
        if tuple(t.shape) != want.shape:
            raise Rejected("shape", f"array '{k}' has shape {tuple(t.shape)}, expected {want.shape}")
        if t.dtype != want.dtype:
            raise Rejected("dtype", f"array '{k}' has dtype {t.dtype}, expected {want.dtype}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise Rejected("non-finite", f"array '{k}' holds NaN or Inf")
    return arrays
