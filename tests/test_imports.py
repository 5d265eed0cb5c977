"""Every module of the package imports on its own (no import cycle that only works after some
other pflower module was imported first).

One fresh interpreter loads the third-party packages pflower uses (torch, Flower, pydantic with
its model machinery: about 3 s, paid once) and never pflower; for each pflower module it forks a child that imports that
module alone, so no other pflower module is loaded before it.
"""

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from conftest import ROOT

PROBE = r"""
import os, sys, importlib, pathlib
import numpy, torch, torchvision, pydantic, flwr.app, flwr.clientapp, flwr.serverapp, flwr.serverapp.strategy
pydantic.create_model("Warm", x=(int, 0))  # pydantic loads its model machinery and plugins at the first model, not at its import
# pflower's bytecode in a folder of the test's (never the checkout's), written by the first child
# that compiles a module and read by the next ones, even where PYTHONDONTWRITEBYTECODE is set
sys.pycache_prefix, sys.dont_write_bytecode = sys.argv[1], False
files = sorted(pathlib.Path("pflower").rglob("*.py"))  # from the tree: walking packages would import them
modules = [".".join(f.with_suffix("").parts).removesuffix(".__init__") for f in files]
assert "pflower" not in sys.modules
failed = []
for name in modules:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException as err:
            print(f"{name}: {type(err).__name__}: {err}", flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)
print(len(modules), "modules;", "failed:", failed)
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_alone(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "bytecode")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert int(out.stdout.split()[-4]) > 60


# ------------------------------------------------------------------------ the module graph
def module_files(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root / 'pflower'``: dotted name -> file (a package is its ``__init__``)."""
    return {".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f for f in sorted((root / "pflower").rglob("*.py"))}


def imported_names(tree: ast.Module, package: str, modules: Iterable[str]) -> set[str]:
    """What the code imports, at any depth (functions, methods, ``try``, ``if TYPE_CHECKING:``: a
    cycle a type checker or a reader follows is a cycle too), as dotted names. ``from a import b``
    is ``a.b`` where that is one of ``modules``, else ``a``; relative imports are resolved against
    ``package``."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each pflower module -> the pflower modules that importing it runs.

    Importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first, so they count too, except the
    importer's own packages (they run before it does, whatever it imports).
    """
    files = module_files(root)
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for target in imported_names(ast.parse(path.read_text(), str(path)), package, files):
            parts = target.split(".")
            for prefix in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                if prefix in files and prefix != name and (prefix == target or not name.startswith(prefix + ".")):
                    edges.add(prefix)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path whose last node is its first, or None."""
    done: set[str] = set()
    for start in sorted(graph):
        path, on_path, todo = [], set(), [(start, iter(sorted(graph[start])))]
        if start in done:
            continue
        path.append(start)
        on_path.add(start)
        while todo:
            node, children = todo[-1]
            child = next(children, None)
            if child is None:
                todo.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return path[path.index(child) :] + [child]
            elif child not in done:
                path.append(child)
                on_path.add(child)
                todo.append((child, iter(sorted(graph[child]))))
    return None


def test_the_graph_sees_imports_in_functions_type_checking_blocks_relative_ones_and_the_packages_they_run(tmp_path):
    files = {
        "pflower/__init__.py": "",
        "pflower/low.py": "def f():\n    from pflower.high.leaf import g\n",
        "pflower/high/__init__.py": "from . import leaf\n",
        "pflower/high/leaf.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pflower import low\nfrom ..other import x\n",
        "pflower/other.py": "import torch\nimport pflower.low\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    graph = import_graph(tmp_path)
    assert graph == {
        "pflower": set(),
        "pflower.low": {"pflower.high", "pflower.high.leaf"},  # in a function; the package runs first
        "pflower.high": {"pflower.high.leaf"},
        "pflower.high.leaf": {"pflower.low", "pflower.other"},  # TYPE_CHECKING counts; its own package is no edge
        "pflower.other": {"pflower.low"},
    }
    assert find_cycle(graph) == ["pflower.high", "pflower.high.leaf", "pflower.low", "pflower.high"]
    assert find_cycle({**graph, "pflower.high.leaf": {"pflower.other"}}) == [
        "pflower.high",
        "pflower.high.leaf",
        "pflower.other",
        "pflower.low",
        "pflower.high",
    ]
    assert find_cycle({**graph, "pflower.low": set()}) is None


def test_no_import_cycle_among_pflowers_modules_counting_imports_in_functions():
    """The layers read bottom up: registry (pflower.methods), configuration, models and data, the
    build of a run's objects (pflower.build), the apps, the tools; nothing imports upwards, not
    even inside a function or for a type annotation."""
    graph = import_graph()
    assert len(graph) > 60 and "pflower.config" in graph["pflower.build"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# ------------------------------------------------------------------------ the app bundle (FAB)
#: The tools that start Flower (pflower-bench, pflower-check, pflower-deploy, pflower-sim and its
#: Ray head, their process helpers), the one that fetches data (pflower-data) and the docs'
#: configuration reference: no node runs them, so the FAB leaves them out.
TOOLING = (
    "pflower.bench",
    "pflower.check",
    "pflower.deploy",
    "pflower.fetch",
    "pflower.launcher",
    "pflower.method_records",
    "pflower.processes",
    "pflower.ray_head",
    "pflower.reference",
)


def app_modules(root: Path = ROOT) -> set[str]:
    """The modules the ServerApp and ClientApp can run: their components' modules, all they
    import (at any depth), the declarations the method registry loads by name and the client
    and server modules those name, and every package on the way."""
    import tomllib

    from pflower.methods import declarations

    graph = import_graph(root)
    components = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    by_name = {m for m in graph if m.rpartition(".")[0] == "pflower.methods"}
    by_name |= {ref.partition(":")[0] for method in declarations().values() for ref in (method.client, method.strategy)}
    seen: set[str] = set()
    todo = [ref.partition(":")[0] for ref in components.values()]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            parts = module.split(".")
            todo += [*graph[module], *(".".join(parts[:i]) for i in range(1, len(parts)))]
            if module == "pflower.methods":
                todo += by_name
    return seen


def test_the_fab_holds_what_the_apps_import_and_none_of_the_tooling(tmp_path):
    """The bundle ``flwr run`` sends (built by Flower from the app pflower-sim stages) has every
    module the apps can reach, and no tool: a node never needs them."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    from pflower.launcher import stage_app

    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(stage_app(ROOT, tmp_path / "app")))) as fab:
        files = [Path(n) for n in fab.namelist() if n.startswith("pflower/") and n.endswith(".py")]
    bundled = {".".join(f.with_suffix("").parts).removesuffix(".__init__") for f in files}
    needed = app_modules()
    assert {"pflower.server_app.app", "pflower.client_app.fedprox", "pflower.strategies.pfedla", "pflower.build"} <= needed
    assert not needed - bundled, f"the apps import modules the FAB lacks: {sorted(needed - bundled)}"
    tools = {m for m in bundled if any(m == t or m.startswith(t + ".") for t in TOOLING)}
    assert not tools, f"tooling in the FAB: {sorted(tools)}"
    assert not needed & set(TOOLING), "an app imports a tool"
