"""The run-configuration reference, rendered from the code as Markdown for the documentation site.

Every row comes from a pydantic field: the shared keys from :class:`pflower.config.Settings`, each
method's own keys from its declaration's ``params`` (:mod:`pflower.methods`). A row gives the key,
its type, its default, what is allowed (the field's ``Literal`` values or its ``ge``/``gt``/``le``/
``lt`` bounds) and the field's ``description``. ``docs/hooks.py`` writes these tables into the
pages, after ``<!-- pflower:config-reference -->`` or ``<!-- pflower:keys NAME -->`` (``python
docs/hooks.py --write``; tests/test_docs.py fails while a committed copy differs from the code).
Imports nothing heavier than pydantic.
"""

from __future__ import annotations

import ast
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pflower.config import Settings
from pflower.methods import declarations

#: Fields of :class:`Settings` that are not run-config keys.
NOT_KEYS = {"params"}

_TYPE_NAMES = {str: "string", int: "integer", float: "float", bool: "boolean"}
_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))


def value(v: Any) -> str:
    """A value as it is written after ``-c`` (TOML: strings in single quotes)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"'{v}'"
    return repr(v)


def _choices(annotation: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return None


def type_name(annotation: Any) -> str:
    choices = _choices(annotation)
    if choices is not None:
        return _TYPE_NAMES.get(type(choices[0]), type(choices[0]).__name__)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds(field: FieldInfo) -> str:
    """``0 ≤ value < 1``, ``value > 0``, ... from the field's constraints ('' when unbounded)."""
    found = {}
    for constraint in field.metadata:
        for attr, _ in _BOUNDS:
            if getattr(constraint, attr, None) is not None:
                found[attr] = getattr(constraint, attr)
    low = next(((op, found[a]) for a, op in _BOUNDS[:2] if a in found), None)
    high = next(((op, found[a]) for a, op in _BOUNDS[2:] if a in found), None)
    if low and high:
        return f"{low[1]!r} {'<' if low[0] == '>' else '≤'} value {high[0]} {high[1]!r}"
    if low or high:
        op, bound = low or high
        return f"value {op} {bound!r}"
    return ""


def allowed(key: str, field: FieldInfo) -> str:
    """What a field accepts: its choices, its bounds, or (``method``) the declared methods."""
    if key == "method":
        return ", ".join(f"`{value(n)}`" for n in declarations())
    choices = _choices(field.annotation)
    if choices is not None:
        return ", ".join(f"`{value(c)}`" for c in choices)
    return bounds(field)


def applies_to(key: str) -> str:
    """For the shared keys that only some methods take: which, from the declarations."""
    methods = declarations()
    names = {
        "aggregation": [n for n, m in methods.items() if m.averages],
        "gradual-interval": [n for n, m in methods.items() if m.gradual],
        "finetune-epochs": [n for n, m in methods.items() if not m.no_finetune],
    }.get(key)
    return f"; applies to {', '.join(f'`{n}`' for n in names)}" if names else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(key, type, default, allowed, description) for every run-config key of ``model``."""
    out = []
    for name, field in model.model_fields.items():
        if model is Settings and name in NOT_KEYS:
            continue
        key = field.alias or name
        description = (field.description or "") + (applies_to(key) if model is Settings else "")
        out.append((prefix + key, type_name(field.annotation), value(field.default), allowed(key, field), description))
    return out


def table(model: type[BaseModel], prefix: str = "") -> str:
    """The Markdown table of ``model``'s keys (a sentence when it has none)."""
    body = rows(model, prefix)
    if not body:
        return "This method has no keys of its own: the shared keys are all it takes."
    lines = ["| key | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {t} | `{d}` | {_cell(a)} | {_cell(text)} |" for k, t, d, a, text in body]
    return "\n".join(lines)


def method_keys(name: str) -> str:
    """The key table of one method (``<name>.<key>``)."""
    return table(declarations()[name].params, f"{name}.")


def method_code(name: str) -> str:
    """Where a method's code lives (its declaration's files)."""
    m = declarations()[name]
    client, server = m.files()
    declaration = f"pflower/methods/{name.replace('-', '_')}.py"
    return "\n".join(
        [
            f"- declaration: `{declaration}` (`method='{name}'`)",
            f"- client side: `{client}` (`{m.client.partition(':')[2]}`)",
            f"- server side: `{server}` (`{m.strategy.partition(':')[2]}`)",
        ]
    )


@cache
def _client_classes() -> dict[str, tuple[str | None, list[str]]]:
    """Every class of ``pflower/client_app/``: its own ``EVALUATES`` (None: inherited) and its
    bases' names, read from the source (importing the classes would import torch)."""
    found = {}
    for path in sorted((Path(__file__).parent / "client_app").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                own = None
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "EVALUATES" for t in stmt.targets):
                        own = ast.literal_eval(stmt.value)
                found[node.name] = (own, [b.id for b in node.bases if isinstance(b, ast.Name)])
    return found


def evaluates(name: str) -> str:
    """What a client of method ``name`` evaluates: its ClientMethod's ``EVALUATES`` (as metrics.json records it)."""
    classes = _client_classes()
    todo = [declarations()[name].client.partition(":")[2]]
    while todo:
        own, bases = classes[todo.pop(0)]
        if own is not None:
            return own
        todo += [b for b in bases if b in classes]
    raise LookupError(f"method {name!r}: its client class says nothing about what it evaluates")


def evaluation_table(link: str = "{name}.md") -> str:
    """What each method's clients evaluate, from the ClientMethod classes."""
    lines = ["| method | what a client evaluates |", "| --- | --- |"]
    lines += [f"| [`{n}`]({link.format(name=n)}) | {_cell(evaluates(n))} |" for n in declarations()]
    return "\n".join(lines)


def methods_table(link: str = "{name}.md") -> str:
    """Every declared method: its name (linked with ``link``), its summary and its client and server modules."""
    lines = ["| method | what it does | client side | server side |", "| --- | --- | --- | --- |"]
    for name, m in declarations().items():
        client, server = m.files()
        lines.append(f"| [`{name}`]({link.format(name=name)}) | {_cell(m.summary)} | `{client}` | `{server}` |")
    return "\n".join(lines)


def method_files_table() -> str:
    """Every declared method with its summary and its client, server and declaration files (the
    README's table: a new method's row comes from its declaration)."""
    lines = ["| method | what it does | client side | server side | declaration |", "| --- | --- | --- | --- | --- |"]
    for name, m in declarations().items():
        client, server = m.files()
        lines.append(f"| `{name}` | {_cell(m.summary)} | `{client}` | `{server}` | `pflower/methods/{name.replace('-', '_')}.py` |")
    return "\n".join(lines)


def row_keys_table(link: str = "methods/{name}.md") -> str:
    """The keys each method's strategy adds to metrics.json's rows, from the strategies' declared
    ``ROW_KEYS`` (beside those every strategy's rows may hold)."""
    from pflower.strategies.loop import PflStrategy

    shared = PflStrategy.row_keys()
    lines = ["| key | methods | what it holds |", "| --- | --- | --- |"]
    by_key: dict[str, tuple[list[str], str]] = {}
    for name, m in declarations().items():
        for key, holds in m.strategy_class().row_keys().items():
            if key not in shared:
                by_key.setdefault(key, ([], holds))[0].append(name)
    for key, (names, holds) in sorted(by_key.items()):
        lines.append(f"| `{key}` | {', '.join(f'[`{n}`]({link.format(name=n)})' for n in names)} | {_cell(holds)} |")
    return "\n".join(lines)


def _groups(state, keys: list[str]) -> str:
    """``keys`` as their modules (``local.*``, ``pi``), two levels deep where one level holds arrays of other roles."""
    out: list[str] = []
    for k in keys:
        parts = k.split(".")
        depth = 1 if len({e.role for j, e in state.entries.items() if j.split(".")[0] == parts[0]}) == 1 else 2
        name = ".".join(parts[:depth]) + (".*" if len(parts) > depth else "")
        if name not in out:
            out.append(name)
    return ", ".join(f"`{n}`" for n in out)


def client_state_table(link: str = "methods/{name}.md") -> str:
    """Each method's declared client state (:mod:`pflower.client_state`) with the run config's
    default model: what the server sends and the client uploads, what goes one way only, what
    stays on the client (arrays, and records besides the model). FedBN keeps nothing with the
    default model, which has no normalization layers."""
    from pflower.build import build_model, client_method
    from pflower.client_state import Role
    from pflower.config import load_settings

    lines = ["| method | the model: sent, trained, uploaded | from the server only | to the server only | private: kept on the client |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for name in declarations():
        s = load_settings({"method": name})
        model = build_model(s, s.image_shape, s.num_classes, s.seed)
        state = client_method(s).client_state(model)

        def cell(role: Role, state=state) -> str:
            keys = state.keys(role)
            if not keys:
                return "none"
            numbers = sum(int(np.prod(state.entries[k].shape)) for k in keys)
            return f"{len(keys)} array{'s' if len(keys) > 1 else ''}, {numbers:,} numbers ({_groups(state, keys)})"

        private = cell(Role.PRIVATE)
        if state.records:
            private += "; records " + ", ".join(f"`{r}{'*' if r.endswith('-') else ''}` ({_cell(what)})" for r, what in state.records.items())
        lines.append(f"| [`{name}`]({link.format(name=name)}) | {cell(Role.MODEL)} | {cell(Role.FROM_SERVER)} | {cell(Role.TO_SERVER)} | {private} |")
    return "\n".join(lines)


def method_count() -> str:
    """How many methods are declared."""
    return str(len(declarations()))


def config_reference(method_link: str = "methods/{name}.md") -> str:
    """The whole reference: the shared keys, then every method's own keys under its name."""
    parts = ["## Shared keys", "", table(Settings), "", "## Each method's own keys", ""]
    for name in declarations():
        parts += [f"### {name}", "", f"[The `{name}` page]({method_link.format(name=name)}).", "", method_keys(name), ""]
    return "\n".join(parts)
