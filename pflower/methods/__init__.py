"""Every method of pflower, each declared once in a module of this package (``fedprox.py``, ...).

A declaration (:class:`Method`) names the method's client side and server side, wraps the model
if the method needs it, holds its own run-config keys (under ``<name>.``) and says what it
supports. The run-config schema (:mod:`pflower.config`), the README's method table (tested),
the tests' method lists and a run's model, client and strategy (:mod:`pflower.build`) all come
from these declarations: adding a method is a client module (a server module if its server
differs), a declaration here, and its tests. The registry imports neither the configuration
nor what it names, so the configuration can build its schema from it.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from pflower.methods.declaration import Method, MethodParams

__all__ = ["Method", "MethodParams", "declarations", "get"]


@cache
def declarations() -> dict[str, Method]:
    """Every declared method by name, in name order."""
    found: dict[str, Method] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name != "declaration":
            method = importlib.import_module(f"{__name__}.{info.name}").METHOD
            found[method.name] = method
    return dict(sorted(found.items()))


def get(name: str) -> Method:
    """The declaration of method ``name``."""
    return declarations()[name]
