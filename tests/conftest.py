"""Shared fixtures: the repo root, tiny specs, and a working directory at the repo root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "specs" / "tiny.yaml"


@pytest.fixture
def repo_root(monkeypatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture
def tiny_spec_dict() -> dict:
    d = yaml.safe_load(TINY.read_text())
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    return d


def write_spec(tmp_path: Path, d: dict, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return p


os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run_cli(args: list[str], *, timeout_s: float, cwd: Path = ROOT, env: dict | None = None):
    """Run ``python -m sweeps.cli ARGS`` in its own process group; returns the CompletedProcess.

    On timeout the whole group (the CLI and the Ray processes it started) is killed and the test
    fails with the tail of what the CLI printed, so a hang in CI says where it hung.
    """
    import signal
    import subprocess
    import sys

    env = dict(os.environ if env is None else env, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        pytest.fail(f"critbatch {' '.join(args[:2])} did not finish in {timeout_s:g} s.\n"
                    f"--- stdout (tail) ---\n{out[-4000:]}\n--- stderr (tail) ---\n{err[-8000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
