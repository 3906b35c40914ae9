"""The Makefile behind the README's two commands: what `make` prints to a newcomer."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_echoes_no_comment_lines_of_its_recipes():
    """A newcomer's `make install` printed the recipe's comment lines (make echoes a tab-indented
    `# ...` like a command). `make -n` lists what `make install` would echo."""
    r = subprocess.run(
        ["make", "-n", "-B", "install", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    echoed = [line for line in r.stdout.splitlines() if line.lstrip().startswith("#")]
    assert echoed == [], echoed
    assert "torch==2.13.0" in r.stdout  # the recipe itself is there


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_run_passes_address_through_and_make_ui_its_port():
    """``make run ADDRESS=host:port`` sweeps on that Ray cluster (``critbatch run --address``); without ADDRESS
    the command line is the one it always was. ``make ui`` is ``critbatch ui``, ``UI_PORT`` its ``--port``."""

    def dry(*args: str) -> list[str]:
        env = {"PATH": os.environ["PATH"]}  # no ADDRESS or UI_PORT from this environment
        r = subprocess.run(
            ["make", "-n", *args, "VENV=/nonexistent-venv", "OUT=out/x"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        return [line for line in r.stdout.splitlines() if "/nonexistent-venv/bin/critbatch " in line]

    run = "/nonexistent-venv/bin/critbatch run sweeps/examples/shakespeare-char.yaml --output out/x"
    assert dry("run", "ADDRESS=1.2.3.4:6379") == [f"{run} --address 1.2.3.4:6379"]
    assert dry("run") == [run]
    assert dry("ui", "UI_PORT=5001") == ["/nonexistent-venv/bin/critbatch ui --port 5001"]
    assert dry("ui") == ["/nonexistent-venv/bin/critbatch ui"]
