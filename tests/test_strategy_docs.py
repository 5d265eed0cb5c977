"""Every public strategy is exported from pflower.strategies and documents each parameter it
takes, in a numpydoc ``Parameters`` section as Flower's strategies do."""

import importlib
import inspect
import pkgutil

import pytest

import pflower.strategies as S
from pflower.strategies.loop import PflStrategy

CLASSES = sorted(
    {
        cls
        for info in pkgutil.iter_modules(S.__path__)
        for _, cls in inspect.getmembers(importlib.import_module(f"pflower.strategies.{info.name}"), inspect.isclass)
        if issubclass(cls, PflStrategy) and cls.__module__.startswith("pflower.strategies.")
    },
    key=lambda c: c.__name__,
)


def test_every_strategy_is_exported():
    assert len(CLASSES) >= 14 and {c.__name__ for c in CLASSES} <= set(S.__all__)
    assert all(getattr(S, c.__name__) is c for c in CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_parameter_is_documented(cls):
    doc = inspect.getdoc(cls) or ""
    assert "Parameters\n----------" in doc, f"{cls.__name__} has no Parameters section"
    section = doc.split("Parameters\n----------", 1)[1]
    own = "__init__" in vars(cls)  # one that inherits __init__ names its base's parameters (**kwargs)
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"] if own else []
    assert own or "**kwargs" in section, cls.__name__
    for p in params:
        name = f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name
        assert any(line.startswith(name + (" :" if p.kind is not p.VAR_KEYWORD else "")) or line == name for line in section.splitlines()), (cls.__name__, name)


def test_an_option_that_does_not_apply_is_refused():
    with pytest.raises(ValueError, match="trim_fraction=0.3 applies to aggregation='trimmed-mean' only"):
        S.FedAvg(trim_fraction=0.3)
    with pytest.raises(TypeError):
        S.Local(aggregation="median")  # Local averages nothing
    assert S.FedAvg(aggregation="trimmed-mean", trim_fraction=0.3).trim_fraction == 0.3
