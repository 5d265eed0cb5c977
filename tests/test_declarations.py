"""The method declarations are the one list of methods: the classes they name exist and fit,
and the README's method and key tables say what they say."""

import re

import pytest

from conftest import ROOT
from pflower.client_app.base import ClientMethod
from pflower.methods import declarations
from pflower.strategies.loop import PflStrategy

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(declarations()))
def test_declaration_names_real_classes_and_files(name):
    m = declarations()[name]
    assert issubclass(m.client_class(), ClientMethod) and issubclass(m.strategy_class(), PflStrategy)
    assert all((ROOT / f).is_file() for f in m.files())
    assert (ROOT / "pflower" / "methods" / f"{name.replace('-', '_')}.py").is_file()
    assert m.summary and m.params().model_dump() is not None


def test_readme_method_table_is_the_declarations():
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+?) \| `(\S+)` \| `(\S+)` \| `(\S+)` \|$", README, re.M)
    assert [r[0] for r in rows] == list(declarations())
    for name, summary, client, server, declaration in rows:
        m = declarations()[name]
        assert (summary, (client, server)) == (m.summary, m.files())
        assert declaration == f"pflower/methods/{name.replace('-', '_')}.py"


def test_readme_key_table_lists_every_methods_keys_with_its_default():
    for name, m in declarations().items():
        for key, field in m.params.model_fields.items():
            default = f"`{field.default}`" if isinstance(field.default, str) else repr(field.default)
            assert f"| `{name}.{field.alias or key}` | {default} | {field.description} |" in README, (name, key)


def test_readme_shows_the_example_serverapp_as_it_is():
    assert (ROOT / "examples" / "quickstart" / "server_app.py").read_text() in README
