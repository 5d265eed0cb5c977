"""Every console script's ``--help`` is plain text: no reST markup from the docstrings it is
made of, and no name broken at its hyphen across lines."""

import importlib
import re
import tomllib

import pytest
from conftest import ROOT

from pflower.help_text import plain

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_plain_drops_literals_roles_and_links():
    text = "Run ``flwr-clientapp`` (:func:`pflower.build.check_data`, :mod:`~pflower.check`) as `Flower <https://flower.ai>`_ does."
    assert plain(text) == "Run flwr-clientapp (pflower.build.check_data, pflower.check) as Flower does."


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_is_plain_text(script, capsys):
    module, _, func = SCRIPTS[script].partition(":")
    with pytest.raises(SystemExit) as done:
        getattr(importlib.import_module(module), func)(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith(f"usage: {script}")
    assert not re.search(r"``|:(func|mod|class|meth|data|attr):`", out), out
    assert not re.search(r"[a-z]-\n\s*[a-z]", out), out  # a hyphenated name wrapped at its hyphen
