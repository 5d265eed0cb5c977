"""The method declarations are the one list of methods: the classes they name exist and fit, the
README's method table says what they say, and the documentation's key tables are generated from
them (tests/test_docs.py builds the site)."""

import re

import pytest
from conftest import ROOT

from pflower import reference
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


def test_the_generated_key_tables_list_every_methods_keys_with_default_and_description():
    """docs/configuration.md and each method's page show these tables (docs/hooks.py writes them
    into the pages; tests/test_docs.py fails while a committed copy differs from the code)."""
    for name, m in declarations().items():
        table = reference.method_keys(name)
        assert f"<!-- pflower:keys {name} -->" in (ROOT / "docs" / "methods" / f"{name}.md").read_text()
        for key, field in m.params.model_fields.items():
            assert f"| `{name}.{field.alias or key}` | " in table, (name, key)
            assert f"| `{reference.value(field.default)}` | " in table and f" | {field.description} |" in table, (name, key)
    assert "<!-- pflower:config-reference -->" in (ROOT / "docs" / "configuration.md").read_text()
    assert "| `pfedla.hn-lr` |" not in README, "the README keeps no copy of the key tables"


def test_the_docs_show_the_example_serverapp_as_it_is():
    """docs/serverapp.md shows the file as a generated section (current: tests/test_docs.py), and
    the build includes it afresh, so the site cannot drift from it."""
    import importlib.util

    assert "<!-- pflower:include examples/quickstart/server_app.py -->" in (ROOT / "docs" / "serverapp.md").read_text()
    spec = importlib.util.spec_from_file_location("pflower_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    shown = hooks.expand("<!-- pflower:include examples/quickstart/server_app.py -->", "serverapp.md")
    assert shown == "```python\n" + (ROOT / "examples" / "quickstart" / "server_app.py").read_text().rstrip() + "\n```"
