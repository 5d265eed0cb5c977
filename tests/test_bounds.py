"""Every numeric run-config key is bounded: integers (sizes, counts, epochs) from above, so no
value can ask for more memory or time than a machine has; floats are finite. Generated over
every key of Settings and of every method's params."""

import math

import annotated_types
import pytest
from conftest import run_config

from pflower.config import ConfigError, Settings, load_settings
from pflower.methods import declarations


def _fields():
    """(run-config key, method or None, field) of every int and float key."""
    for name, f in Settings.model_fields.items():
        if f.annotation in (int, float):
            yield (f.alias or name), None, f
    for method, decl in declarations().items():
        for name, f in decl.params.model_fields.items():
            if f.annotation in (int, float):
                yield f"{method}.{f.alias or name}", method, f


FIELDS = list(_fields())
INTS = [(key, method, f) for key, method, f in FIELDS if f.annotation is int]
FLOATS = [(key, method, f) for key, method, f in FIELDS if f.annotation is float]


def _upper(f) -> int | None:
    return next((m.le for m in f.metadata if isinstance(m, annotated_types.Le)), None)


def _cfg(key: str, method: str | None, value) -> dict:
    return {**run_config(), **({"method": method} if method else {}), key: value}


def test_every_integer_key_has_an_upper_bound():
    assert len(INTS) > 20
    assert [key for key, _, f in INTS if _upper(f) is None] == []


@pytest.mark.parametrize("key,method,field", INTS, ids=[k for k, _, _ in INTS])
def test_an_integer_past_its_bound_is_refused_naming_the_key(key, method, field):
    top = _upper(field)
    with pytest.raises(ConfigError, match=f"run config key '{key}' = {top + 1} is not allowed: Input should be less than or equal to {top}"):
        load_settings(_cfg(key, method, top + 1))


@pytest.mark.parametrize("key,method,field", FLOATS, ids=[k for k, _, _ in FLOATS])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_float_key_refuses_infinity_and_nan_naming_the_key(key, method, field, value):
    with pytest.raises(ConfigError, match=f"run config key '{key}' = {value!r} is not allowed: Input should be a finite number"):
        load_settings(_cfg(key, method, value))
