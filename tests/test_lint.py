"""Ruff's lint and format checks over the repository, as configured in pyproject.toml."""

import subprocess
import sys

from conftest import ROOT


def test_ruff_check_passes():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    out = subprocess.run([sys.executable, "-m", "ruff", "format", "--no-cache", "--check", "."], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
