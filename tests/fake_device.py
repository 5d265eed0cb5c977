"""A fake accelerator for machines without one: PyTorch's ``meta`` device, with values.

Moving a tensor to ``meta`` (``.to("meta")``, a factory with ``device="meta"``, a module's
``.to``) gives an :class:`OnDevice`: its ``device`` is ``meta`` and its values live in a CPU
tensor inside it, on which every op runs (so a model trains on it exactly as on the CPU). Like
CUDA, the fake device refuses an op that mixes it with a CPU tensor of one or more dimensions
(copies between the devices and CPU indices are allowed, zero-dimensional CPU tensors count as
scalars; ``.numpy()`` needs ``.cpu()`` first), and its random ops draw from a generator of their
own, not the CPU's: each refusal raises :class:`MixedDevices` naming the line of pflower that
made it, and is also kept in :attr:`FakeDevice.errors` (a ClientApp turns exceptions into error
replies, which a strategy may skip).
"""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

FAKE = torch.device("meta")
PACKAGE = str(Path(__file__).resolve().parents[1] / "pflower")
#: Ops that may take tensors of both devices (as on CUDA): copies, and indices of either device.
CROSS_DEVICE = {"aten::copy_", "aten::_to_copy", "aten::index.Tensor", "aten::index_put_", "aten::_index_put_impl_"}
#: In-place random ops, whose generator argument the fake device fills in.
RANDOM = {"aten::uniform_", "aten::normal_", "aten::bernoulli_", "aten::random_", "aten::exponential_"}


class MixedDevices(RuntimeError):
    """An op mixed the fake device with CPU tensors, as CUDA refuses."""


def caller() -> str:
    """The innermost line of pflower on the stack, e.g. ``pflower/client_app/fedfomo.py:53: own[k] - ...``."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(PACKAGE):
            return f"pflower{frame.filename[len(PACKAGE) :]}:{frame.lineno}: {frame.line}"
    return "outside pflower"


class OnDevice(torch.Tensor):
    """A tensor on the fake device: ``meta`` outside, CPU values (``value``) inside."""

    value: torch.Tensor

    @staticmethod
    def __new__(cls, value: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, value.shape, strides=value.stride(), storage_offset=value.storage_offset(), dtype=value.dtype,
            layout=value.layout, device=FAKE, requires_grad=False,
        )  # fmt: skip

    def __init__(self, value: torch.Tensor):
        self.value = value

    def __repr__(self) -> str:
        return f"OnDevice({self.value!r})"

    def tolist(self):
        return self.value.tolist()

    def numpy(self, *args, **kwargs):
        raise _refuse(TypeError(f"can't convert {FAKE} device type tensor to numpy: use .cpu() first, at {caller()}"))

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


#: The fake device's random generator, and the refusals of the current :class:`FakeDevice`.
_state: dict = {"generator": torch.Generator().manual_seed(20240601), "errors": []}


def _refuse(err: Exception) -> Exception:
    _state["errors"].append(str(err))
    return err


#: What ops take besides tensors and containers of them: leaves with no tensor inside.
_PLAIN = {int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Generator}


def _tensors(x, out: list) -> list:
    """The tensors in an op's arguments or results (``out``, in order): PyTorch's tree flattening
    for what ops take (lists, tuples, dicts) done directly, which was most of the fake device's
    time; any other container goes through ``tree_flatten``."""
    kind = type(x)
    if kind is list or kind is tuple or kind is dict:
        for y in x.values() if kind is dict else x:
            if isinstance(y, torch.Tensor):
                out.append(y)
            elif type(y) not in _PLAIN:
                _tensors(y, out)
    elif isinstance(x, torch.Tensor):
        out.append(x)
    elif kind not in _PLAIN:
        out.extend(t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor))
    return out


def _map(f, x):
    """``tree_map(f, x)`` for the tensors of ``x``, the same containers done directly as in :func:`_tensors`."""
    kind = type(x)
    if kind is list or kind is tuple:
        out = [f(y) if isinstance(y, torch.Tensor) else y if type(y) in _PLAIN else _map(f, y) for y in x]
        return out if kind is list else tuple(out)
    if kind is dict:
        return {k: f(y) if isinstance(y, torch.Tensor) else y if type(y) in _PLAIN else _map(f, y) for k, y in x.items()}
    if isinstance(x, torch.Tensor):
        return f(x)
    if kind in _PLAIN:
        return x
    return tree_map(lambda y: f(y) if isinstance(y, torch.Tensor) else y, x)


def _run(func, args, kwargs, tensors: list | None = None):
    """One op on (or onto) the fake device: refuse a mix as CUDA would, run it on the values, wrap
    what lands on the fake device (``tensors``: those of the arguments, if known)."""
    name = func._schema.name
    tensors = _tensors(kwargs, _tensors(args, [])) if tensors is None else tensors
    fake = any(isinstance(t, OnDevice) for t in tensors)
    if fake and name not in CROSS_DEVICE:
        cpu = [t for t in tensors if not isinstance(t, OnDevice) and t.device.type == "cpu" and t.dim() > 0]
        if cpu:
            shapes = ", ".join(str(tuple(t.shape)) for t in cpu)
            raise _refuse(MixedDevices(f"{name} mixes {FAKE} with CPU tensors of shape {shapes} at {caller()}"))
    target = kwargs.get("device")
    kwargs = dict(kwargs)
    if target is not None:
        kwargs["device"] = torch.device("cpu")
    if fake and name in RANDOM and kwargs.get("generator") is None and not any(
        isinstance(a, torch.Generator) for a in args
    ):  # fmt: skip
        kwargs["generator"] = _state["generator"]
    inner = {id(t): t.value for t in tensors if isinstance(t, OnDevice)}
    owner = {id(t.value): t for t in tensors if isinstance(t, OnDevice)}
    unwrap = lambda x: inner.get(id(x), x)  # noqa: E731
    out = func(*_map(unwrap, args), **_map(unwrap, kwargs))
    on_fake = torch.device(target).type == FAKE.type if target is not None else fake

    def wrap(x):
        if id(x) in owner:  # an in-place op returns the tensor it changed
            return owner[id(x)]
        return OnDevice(x) if on_fake else x

    return _map(wrap, out)


class FakeDevice(TorchDispatchMode):
    """While active, ``meta`` is the fake device: tensors moved there keep their values."""

    def __init__(self):
        super().__init__()
        self.errors: list[str] = []

    def __enter__(self):
        _state["errors"] = self.errors
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._warnings.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = kwargs.get("device")
        tensors = _tensors(kwargs, _tensors(args, []))
        if any(isinstance(t, OnDevice) for t in tensors) or (target is not None and torch.device(target).type == FAKE.type):
            return _run(func, args, kwargs, tensors)
        return func(*args, **kwargs)
