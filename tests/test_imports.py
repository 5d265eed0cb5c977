"""Every module of the package imports on its own (no import cycle that only works after some
other pflower module was imported first).

One fresh interpreter loads the third-party packages pflower uses (torch, Flower, pydantic: about
3 s, paid once) and never pflower; for each pflower module it forks a child that imports that
module alone, so no other pflower module is loaded before it.
"""

import subprocess
import sys

from conftest import ROOT

PROBE = r"""
import os, sys, importlib, pathlib
import numpy, torch, torchvision, pydantic, flwr.app, flwr.clientapp, flwr.serverapp, flwr.serverapp.strategy
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


def test_every_module_imports_alone():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert int(out.stdout.split()[-4]) > 60
