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


def test_a_new_methods_declaration_alone_updates_every_generated_place(tmp_path, monkeypatch):
    """A throwaway method declared in a module of its own (a folder added to the registry's
    package path, as a new file in pflower/methods/ would be): the README's table and method
    count, docs/index.md's count, the methods index's table and the guide's table of client state
    all gain it when the pages are
    regenerated (one command: docs/hooks.py --write), and the README's length check does not count
    the table's new row. Nothing else needs an edit for these places."""
    import importlib.util
    import sys

    import pflower.methods

    (tmp_path / "throwaway.py").write_text(
        "from pflower.methods.declaration import Method\n"
        "METHOD = Method(name='throwaway', summary='a method declared for this test only', "
        "client='pflower.client_app.base:ClientMethod', strategy='pflower.strategies.fedavg:FedAvg', averages=True)\n"
    )
    spec = importlib.util.spec_from_file_location("pflower_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    monkeypatch.setattr(pflower.methods, "__path__", [*pflower.methods.__path__, str(tmp_path)])
    declarations.cache_clear()
    try:
        assert "throwaway" in declarations() and len(declarations()) == 23
        readme = hooks.regenerate(README, hooks.README)
        assert "| `throwaway` | a method declared for this test only | `pflower/client_app/base.py` | `pflower/strategies/fedavg.py` |" in readme
        assert "<!-- pflower:method-count -->23<!-- /pflower:method-count --> methods" in readme
        index = hooks.regenerate((ROOT / "docs" / "index.md").read_text(), "index.md")
        assert "<!-- pflower:method-count -->23<!-- /pflower:method-count --> methods" in index
        methods = hooks.regenerate((ROOT / "docs" / "methods" / "index.md").read_text(), "methods/index.md")
        assert "| [`throwaway`](throwaway.md) | a method declared for this test only |" in methods
        guide = hooks.regenerate((ROOT / "docs" / "adding-a-method.md").read_text(), "adding-a-method.md")
        assert "| [`throwaway`](methods/throwaway.md) | 8 arrays, 22,602 numbers (`body.*`, `head.*`) | none | none | none |" in guide  # its client state
        table = re.search(r"<!-- pflower:method-files -->.*?<!-- /pflower:method-files -->", readme, re.S)[0]
        assert len(readme.replace(table, "").splitlines()) == len(
            README.replace(re.search(r"<!-- pflower:method-files -->.*?<!-- /pflower:method-files -->", README, re.S)[0], "").splitlines()
        )
    finally:
        sys.modules.pop("pflower.methods.throwaway", None)
        monkeypatch.undo()
        declarations.cache_clear()
    assert "throwaway" not in declarations()
