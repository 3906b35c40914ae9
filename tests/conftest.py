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


def tiny_spec() -> dict:
    """``tests/specs/tiny.yaml`` as a dict, its data path absolute (for fixtures wider than a test)."""
    d = yaml.safe_load(TINY.read_text())
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    return d


@pytest.fixture
def tiny_spec_dict() -> dict:
    return tiny_spec()


def write_spec(tmp_path: Path, d: dict, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return p


os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run_cli(args: list[str], *, timeout_s: float, cwd: Path = ROOT, env: dict | None = None):
    """Run ``python -m critbatch ARGS`` in its own process group; returns the CompletedProcess.

    On timeout the whole group (the CLI and the Ray processes it started) is killed and the test
    fails with the tail of what the CLI printed, so a hang in CI says where it hung.
    """
    import signal
    import subprocess
    import sys

    env = dict(os.environ if env is None else env, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "critbatch", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        pytest.fail(
            f"critbatch {' '.join(args[:2])} did not finish in {timeout_s:g} s.\n"
            f"--- stdout (tail) ---\n{out[-4000:]}\n--- stderr (tail) ---\n{err[-8000:]}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---- the suite's shared backends ---------------------------------------------------------------


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """One Ray head for the suite (``harness.RayHead``): 3 CPUs (two 1-CPU trials and their
    drivers), worker ports 20000-29999, the dashboard (job server) on, Tune's start second pinned
    (``harness.pinned_date_env``). Sweep tests reach it with ``--address ray_head.gcs_address``;
    what a test needs inside trial processes travels in the job's runtime env
    (``sweeps.launch.cluster.trial_env`` forwards ``CRITBATCH_TEST_*``). Started on first use, stopped
    at the end of the session. Tests of Ray's own lifecycle (Ctrl-C, killed heads, two nodes)
    start their own."""
    import shutil
    import tempfile

    from harness import base_env, pinned_date_env, start_ray_head, stop_group

    temp_dir = Path(tempfile.mkdtemp(prefix="cbray", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    # as a local `critbatch run` does (sweeps.launch.cluster.init_ray): one actor process less per trial
    env = dict(pinned_date_env(base_env()), RAY_TRAIN_ENABLE_PREEMPTION_WATCHER="0")
    head = start_ray_head(temp_dir, num_cpus=3, env=env)
    try:
        yield head
    finally:
        stop_group(head.proc, grace_s=0)  # thrown away: no graceful stop (harness.stop_group)
        if os.environ.get("CRITBATCH_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """A migrated, empty MLflow SQLite store made once per session (copy it, never write to it)."""
    from harness import make_mlflow_template

    return make_mlflow_template(tmp_path_factory.mktemp("mlflow-template") / "mlflow.db")


@pytest.fixture
def mlflow_uri(mlflow_template: Path, tmp_path: Path) -> str:
    """A fresh MLflow store for this test, ``sqlite:///<tmp_path>/mlflow.db`` (a copy of the template)."""
    from harness import copy_mlflow_store

    return copy_mlflow_store(mlflow_template, tmp_path / "mlflow.db")


def invoke_cli(args: list[str], env: dict | None = None):
    """``critbatch ARGS`` in this process through typer's CliRunner, for commands that start no Ray
    and no sweep (input refusals, help). Returns a CompletedProcess (returncode, stdout, stderr)."""
    import subprocess

    from typer.testing import CliRunner

    from critbatch.main import app

    r = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    return subprocess.CompletedProcess(["critbatch", *args], r.exit_code, r.stdout, r.stderr)
