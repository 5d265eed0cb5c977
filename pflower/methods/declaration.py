"""What a method declares about itself: its two sides, its own run-config keys, what it supports.

Declarations import nothing heavier than pydantic (the client and server classes are named as
``"module:Class"`` and imported on use), so the run-config schema can be built from them
anywhere, without torch or Flower.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pflower import reply_metrics


def _kebab(name: str) -> str:
    return name.replace("_", "-")


#: The largest magnitude a float key may have: the clients compute in float32, where a larger
#: value is infinite (lr=1e308 passed the check and every client failed converting it).
FLOAT32_MAX = 3.4028234663852886e38


def within_float32(v: Any) -> Any:
    """``v`` if it is no float or one float32 holds; ValueError otherwise."""
    if isinstance(v, float) and abs(v) > FLOAT32_MAX:
        raise ValueError(f"must be at most {FLOAT32_MAX:.4g} in magnitude: the clients compute in float32, where it is infinite")
    return v


class MethodParams(BaseModel):
    """A method's own run-config keys (``<method>.<key>``), typed and range-checked; none by default."""

    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _within_float32(cls, v: Any) -> Any:
        return within_float32(v)


class HeadParams(MethodParams):
    """The key of the methods that keep one part of the model personal and federate the rest."""

    head: Literal["last", "classifier"] = Field(
        "last",
        description="where the head begins: `last` (the last Linear) or `classifier` (every fully connected layer: the split SuPerFed's code gives FedPer, FedRep and LG-FedAvg)",
    )


def wrap_head(model, params: HeadParams):
    """The model split at ``params.head`` (:func:`pflower.models.heads.with_head`)."""
    from pflower.models.heads import with_head

    return with_head(model, params.head)


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Method:
    """One method of pflower, as ``method='<name>'`` selects it.

    ``client`` and ``strategy`` are ``"module:Class"`` references to its
    :class:`~pflower.client_app.base.ClientMethod` and its server strategy; ``params`` its own
    keys; ``wrap`` turns the base model into the method's model (SuPerFed's two weight sets,
    the double head). ``averages``: the server averages uploads (``aggregation`` applies);
    ``gradual``: ``gradual-interval`` applies; ``no_finetune``: why ``finetune-epochs`` does not
    apply (empty: it does, the evaluated prediction being one network). ``example``: run-config keys of a short
    demonstration of what the method does (end-to-end tests use them). ``train_metrics`` and
    ``evaluation_metrics``: the metrics its replies add to those every client sends
    (:mod:`pflower.reply_metrics`), each key's type and range, checked at the server's boundary.
    """

    name: str
    summary: str
    client: str
    strategy: str
    params: type[MethodParams] = MethodParams
    wrap: Callable[[Any, Any], Any] | None = None
    averages: bool = False
    gradual: bool = False
    no_finetune: str = ""
    example: Mapping[str, Any] = field(default_factory=dict)
    train_metrics: Mapping[str, reply_metrics.Spec] = field(default_factory=dict)
    evaluation_metrics: Mapping[str, reply_metrics.Spec] = field(default_factory=dict)

    def reply_schemas(self) -> dict[str, dict[str, reply_metrics.Spec]]:
        """What its training and evaluation replies may hold, by Flower message type."""
        return {"train": {**reply_metrics.TRAIN, **self.train_metrics}, "evaluate": {**reply_metrics.EVALUATE, **self.evaluation_metrics}}

    def client_class(self) -> type:
        return _load(self.client)

    def strategy_class(self) -> type:
        return _load(self.strategy)

    def files(self) -> tuple[str, str]:
        """The modules of its client side and server side, as paths from the repository root."""
        return tuple(ref.partition(":")[0].replace(".", "/") + ".py" for ref in (self.client, self.strategy))  # type: ignore[return-value]
