"""The Makefile behind the README's two commands: what `make` prints to a newcomer."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_echoes_no_comment_lines_of_its_recipes():
    """A newcomer's `make install` printed the recipe's comment lines (make echoes a tab-indented
    `# ...` like a command). `make -n` lists what `make install` would echo."""
    r = subprocess.run(["make", "-n", "-B", "install", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    echoed = [line for line in r.stdout.splitlines() if line.lstrip().startswith("#")]
    assert echoed == [], echoed
    assert "torch==2.13.0" in r.stdout  # the recipe itself is there
