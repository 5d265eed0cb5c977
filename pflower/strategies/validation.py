"""The one reply validator: a reply that fails any check never touches server state."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, Message

from pflower import reply_metrics as rm
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


def check_reply(
    msg: Message,
    expected_client: int | None,
    spec: Mapping[str, ArraySpec] | None,
    schema: Mapping[str, rm.Spec] = rm.TRAIN,
    bound: Callable[[str], float | None] = lambda of: None,
    num_clients: int = 0,
) -> Reply:
    """Validate one reply; raise :class:`Rejected` naming the first problem.

    ``expected_client``: the client of the node it came from (None for an identity reply, which
    must say its ``client-id``; other replies may omit it, and must match if they say it).
    ``spec`` is None for replies that carry no arrays (evaluation), else the exact set of
    arrays expected with their shapes and dtypes. ``schema``, ``bound`` and ``num_clients``:
    what its metrics may hold (:func:`check_metrics`).
    """
    if msg.has_error():
        raise Rejected("client-error", f"client error: {msg.error.reason}")
    content = msg.content
    if len(content.metric_records) != 1:
        raise Rejected("malformed", f"expected one MetricRecord, got {len(content.metric_records)}")
    metrics = dict(next(iter(content.metric_records.values())))
    cid = metrics.get("client-id", expected_client)  # optional once the node's client is known
    if type(cid) is not int or (expected_client is not None and cid != expected_client):
        raise Rejected("client-id", f"client-id {_short(cid)} does not match the node's client {expected_client}")
    if "num-examples" not in metrics:
        raise Rejected("num-examples", "num-examples is missing")
    check_metrics(metrics, schema, bound, num_clients)
    arrays: dict[str, torch.Tensor] = {}
    if spec is not None:
        records = list(content.array_records.values())
        if len(records) != 1:
            raise Rejected("malformed", f"expected one ArrayRecord, got {len(records)}")
        arrays = check_arrays(records[0], spec)
    return Reply(cid, metrics["num-examples"], metrics, arrays)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(key: str, default: str) -> str:
    """The counter a problem of ``key`` is rejected under: its own for the two identity keys."""
    return key if key in ("num-examples", "client-id") else default


def _check_number(key: str, value, spec: rm.Number, num_clients: int, where: str = "") -> None:
    if type(value) not in (int, float) or (spec.integer and type(value) is not int):
        raise Rejected(_reason(key, "type"), f"metric '{key}'{where} is {_short(value)}, not {'an integer' if spec.integer else 'a number'}")
    if not math.isfinite(value):
        raise Rejected("non-finite", f"metric '{key}'{where} is {value}")
    hi = min(spec.hi, num_clients - 1) if spec.client and num_clients else spec.hi
    if not spec.lo <= value <= hi:
        raise Rejected(_reason(key, "range"), f"metric '{key}'{where} is {_short(value)}, outside [{spec.lo:g}, {hi:g}]")


def spec_of(key: str, value, schema: Mapping[str, rm.Spec]) -> rm.Spec:
    """The declaration of ``key``: its own, its base key's for ``global-<key>`` (a count there
    has only the absolute bound), or that of an undeclared metric."""
    if key in schema:
        return schema[key]
    base = schema.get(key.removeprefix("global-")) if key.startswith("global-") else None
    if isinstance(base, rm.Count):
        return rm.Number(1, rm.MAX_COUNT, integer=True)
    if base is not None:
        return base
    return rm.Numbers(rm.Number()) if isinstance(value, list) else rm.Number()


def check_metrics(
    metrics: Mapping[str, object], schema: Mapping[str, rm.Spec], bound: Callable[[str], float | None] = lambda of: None, num_clients: int = 0
) -> None:
    """Every key of ``metrics`` as :mod:`pflower.reply_metrics` declares it (type, finite,
    range, list length, the keys it requires); raise :class:`Rejected` naming the key.

    ``bound(of)``: the largest count a client may state of its ``of`` split (None: only the
    absolute bound); ``num_clients``: the federation's size, which client ids stay below.
    """
    if absent := [key for key, spec in schema.items() if isinstance(spec, rm.Number) and spec.needed and key not in metrics]:
        raise Rejected("missing", f"metric '{absent[0]}' is missing: every reply of this kind must have it")
    for key, value in metrics.items():
        spec = spec_of(key, value, schema)
        if isinstance(spec, rm.Count):
            if type(value) is not int or not 1 <= value <= rm.MAX_COUNT:
                raise Rejected(_reason(key, "range"), f"{key} {_short(value)} is not a positive integer up to {rm.MAX_COUNT}")
            if (most := bound(spec.of)) is not None and value > most:
                raise Rejected(_reason(key, "range"), f"{key} {value} exceeds max-examples-factor x the {spec.of} samples the client declared ({most:g})")
        elif isinstance(spec, rm.Numbers):
            if not isinstance(value, list):
                raise Rejected(_reason(key, "type"), f"metric '{key}' is {_short(value)}, not a list")
            want = len(metrics[spec.length]) if isinstance(spec.length, str) and isinstance(metrics.get(spec.length), list) else spec.length
            if isinstance(spec.length, str) and not isinstance(metrics.get(spec.length), list):
                raise Rejected("missing", f"metric '{key}' needs the list '{spec.length}' beside it")
            if len(value) > rm.MAX_LIST or (want is not None and len(value) != want):
                raise Rejected("length", f"metric '{key}' has {len(value)} items, expected {want if want is not None else f'at most {rm.MAX_LIST}'}")
            for i, item in enumerate(value):
                _check_number(key, item, spec.item, num_clients, f"[{i}]")
            if spec.distinct and len(set(value)) != len(value):
                raise Rejected("range", f"metric '{key}' repeats items")
        else:
            _check_number(key, value, spec, num_clients)
        if missing := [k for k in spec.requires if k not in metrics]:
            raise Rejected("missing", f"metric '{key}' needs {missing} beside it")


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
