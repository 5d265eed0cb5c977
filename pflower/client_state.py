"""A method's client state, declared: every array of its model's state, and who may see it.

A client's state is its model's whole state dict: the ClientApp saves it to disk after every
training and restores it before the next message (:mod:`pflower.client_app.store`), so a
personal head, a local model, SCAFFOLD's c_i or FedEM's π persist as the model does. What a
method declares (:meth:`pflower.client_app.base.ClientMethod.client_state`) is each array's
role, and the runtime and the server act on that declaration, never on array names:

- ``MODEL``: the server sends it, the client trains it and uploads it (FedAvg's whole model);
- ``FROM_SERVER``: the server sets it in its training messages; it never goes back (SCAFFOLD's c);
- ``TO_SERVER``: the client uploads it; the server never sends it (SCAFFOLD's Δc_i);
- ``PRIVATE``: never leaves the client (personal layers, local models, c_i, π, integer counters).

A method that keeps more than its model (FedeRiCo's tables and this round's peer models)
declares those records of ``context.state`` by name too (``records``); they are private.
A restored state whose arrays or records differ from the declaration is refused, naming the
first difference, and a message that carries an array the client does not receive is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import torch
from torch import nn


class Role(StrEnum):
    """Who may see an array of a client's state (see the module docstring)."""

    MODEL = "model"
    FROM_SERVER = "from-server"
    TO_SERVER = "to-server"
    PRIVATE = "private"


@dataclass(frozen=True)
class Entry:
    """One array of a client's state: its role, shape and dtype, and whether it is a parameter
    (trained by gradient; the rest are buffers: BatchNorm's statistics, control variates, π)."""

    role: Role
    shape: tuple[int, ...]
    dtype: torch.dtype
    parameter: bool


@dataclass(frozen=True)
class ClientState:
    """Every array of a method's model state by name, in state-dict order (:meth:`of` builds it),
    and the records it keeps besides (``records``: name, or prefix ending in '-', to what it holds)."""

    entries: Mapping[str, Entry]
    records: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, model: nn.Module, shared: Iterable[str] | None = None, *, from_server: Iterable[str] = (), to_server: Iterable[str] = (),
        records: Mapping[str, str] | None = None,
    ) -> ClientState:  # fmt: skip
        """The state of ``model``: ``shared`` arrays are ``MODEL`` (None: every float array that
        is neither ``from_server`` nor ``to_server``), ``from_server`` and ``to_server`` as named,
        and every other array ``PRIVATE``. A name the model lacks, or an integer array named as
        anything but private, is a ValueError."""
        state = model.state_dict()
        params = {k for k, _ in model.named_parameters()}
        named = {Role.FROM_SERVER: list(from_server), Role.TO_SERVER: list(to_server)}
        others = {k for keys in named.values() for k in keys}
        named[Role.MODEL] = [k for k, v in state.items() if v.is_floating_point() and k not in others] if shared is None else list(shared)
        role: dict[str, Role] = {}
        for r, keys in named.items():
            for k in keys:
                if k not in state:
                    raise ValueError(f"{r.value} array '{k}' is not in the model's state")
                if k in role:
                    raise ValueError(f"array '{k}' is declared both {role[k].value} and {r.value}")
                if not state[k].is_floating_point():
                    raise ValueError(f"array '{k}' ({state[k].dtype}) cannot be {r.value}: only float arrays travel")
                role[k] = r
        return cls({k: Entry(role.get(k, Role.PRIVATE), tuple(v.shape), v.dtype, k in params) for k, v in state.items()}, dict(records or {}))

    def keys(self, *roles: Role) -> list[str]:
        """The arrays of the given roles, in state-dict order."""
        return [k for k, e in self.entries.items() if e.role in roles]

    @cached_property
    def uploaded(self) -> list[str]:
        """What a training reply may carry: ``MODEL`` and ``TO_SERVER`` arrays."""
        return self.keys(Role.MODEL, Role.TO_SERVER)

    @cached_property
    def received(self) -> list[str]:
        """What the server's messages may carry: ``MODEL`` and ``FROM_SERVER`` arrays."""
        return self.keys(Role.MODEL, Role.FROM_SERVER)

    @cached_property
    def private(self) -> list[str]:
        return self.keys(Role.PRIVATE)

    def parameters(self, *roles: Role) -> list[str]:
        """The parameters among the arrays of ``roles``."""
        return [k for k in self.keys(*roles) if self.entries[k].parameter]

    def mismatch(self, state: Mapping[str, torch.Tensor]) -> str:
        """What differs between a state and the declaration ('' if nothing): the first missing,
        unexpected or misshapen array."""
        if missing := [k for k in self.entries if k not in state]:
            return f"it lacks {len(missing)} declared array(s), first '{missing[0]}'"
        if extra := [k for k in state if k not in self.entries]:
            return f"it holds {len(extra)} undeclared array(s), first '{extra[0]}'"
        for k, e in self.entries.items():
            if tuple(state[k].shape) != e.shape:
                return f"its '{k}' has shape {list(state[k].shape)} where the declaration has {list(e.shape)}"
        return ""

    def undeclared(self, names: Iterable[str]) -> list[str]:
        """The record ``names`` of a saved state that are not declared in ``records``."""
        return [n for n in names if not any(n == r or (r.endswith("-") and n.startswith(r)) for r in self.records)]

    def unreceivable(self, keys: Iterable[str]) -> list[str]:
        """The ``keys`` of a message that the client does not receive (private or upload-only)."""
        return [k for k in keys if k in self.entries and self.entries[k].role not in (Role.MODEL, Role.FROM_SERVER)]
