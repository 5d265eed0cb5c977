"""Every numeric run-config key is bounded: integers (sizes, counts, epochs) from above, so no
value can ask for more memory or time than a machine has; floats are finite. Generated over
every key of Settings and of every method's params."""

import math
import re

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


def test_every_key_with_no_effect_in_the_chosen_setting_is_refused_with_the_reason():
    """Each scoped key, set away from its default where it does nothing (the default run:
    digits, pathological partition, no label noise, mean aggregation, SGD, no MLflow), is refused
    naming what it needs; where it applies, it is accepted."""
    from pflower.config import SCOPED_KEYS

    away = {"torchvision-name": "SVHN", "emnist-split": "digits", "hf-image-column": "img", "hf-label-column": "y", "shards-per-client": 3,
            "client-sizes": "10,20", "natural-id-column": "user", "natural-id-min-samples": 3, "natural-id-fraction": 0.5, "hf-text-column": "x", "mlflow-tracking-uri": "sqlite:///m.db", "mlflow-experiment": "x",
            "dirichlet-alpha": 0.1, "dominant-classes": 3, "dominant-fraction": 0.6, "label-groups": 3, "label-noise-ratio": 0.2,
            "trim-fraction": 0.3, "download": True, "client-classes": "0;1", "resnet-norm": "group"}  # fmt: skip
    where = {"classes-per-client": ({"partition": "iid"}, 3), "momentum": ({"optimizer": "adam"}, 0.5),
             "data-fraction": ({"dataset": "node"}, 0.5), "local-epochs": ({"local-steps": 2}, 3), "simulated-clients": ({"dataset": "node"}, 4)}  # fmt: skip
    applies = {"dirichlet-alpha": {"partition": "dirichlet"}, "dominant-classes": {"partition": "dominant"}, "dominant-fraction": {"partition": "dominant"},
               "label-groups": {"partition": "label-groups"}, "label-noise-ratio": {"label-noise": "symmetric"}, "trim-fraction": {"aggregation": "trimmed-mean", "method": "fedavg"},
               "shards-per-client": {"partition": "shards"}, "client-classes": {"partition": "classes"}, "data-fraction": {}, "local-epochs": {},
               "simulated-clients": {}}  # fmt: skip
    assert {key for key, *_ in SCOPED_KEYS} == set(away) | set(where)
    for key, _, _, needs in SCOPED_KEYS:
        setting, value = where.get(key, ({}, away.get(key)))
        with pytest.raises(ConfigError, match=f"run config key '{key}' = .* is not allowed: only for {re.escape(needs)}"):
            load_settings({**run_config(), **setting, key: value})
        if key in applies:
            load_settings({**run_config(), **applies[key], key: value})
