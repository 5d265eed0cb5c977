"""Every method of pflower, each declared once in a module of this package (``fedprox.py``, ...).

A declaration (:class:`Method`) names the method's client side and server side, wraps the model
if the method needs it, holds its own run-config keys (under ``<name>.``) and says what it
supports. The run-config schema, the README's method table (tested), the tests' method lists
and the strategy of a run all come from these declarations: adding a method is a client
module (a server module if its server differs), a declaration here, and its tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import TYPE_CHECKING

from pflower.methods.declaration import Method, MethodParams

if TYPE_CHECKING:
    from pflower.client_app.base import ClientMethod
    from pflower.config import Settings
    from pflower.strategies.loop import PflStrategy

__all__ = ["Method", "MethodParams", "build_strategy", "client_method", "declarations", "get"]


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
    return declarations()[name]


def client_method(settings: Settings) -> ClientMethod:
    return get(settings.method).client_class()(settings)


def build_strategy(settings: Settings, shape: tuple[int, int, int] | None = None, num_classes: int | None = None) -> PflStrategy:
    """The method's strategy, with the initial model of ``seed`` and the method's upload keys;
    ``shape`` and ``num_classes`` when the nodes bring their own data (else the data set's)."""
    from pflower.models import build_model

    shape, num_classes = (settings.image_shape, settings.num_classes) if shape is None else (shape, num_classes)
    model = build_model(settings, shape, num_classes, settings.seed)
    client = client_method(settings)
    strategy = get(settings.method).strategy_class().from_settings(settings, model, client.upload_keys(model))
    strategy.evaluation = {"evaluates": client.EVALUATES, "finetune-epochs": client.finetune_epochs}
    return strategy
