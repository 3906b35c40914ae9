"""The submit/status/stop/list commands without a cluster: validation, dry runs, exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from svc_fakes import tiny_spec
from typer.testing import CliRunner

from critbatch.main import app

REPO = Path(__file__).resolve().parents[2]
SPEC = tiny_spec()
DOWN = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture
def run(monkeypatch):
    monkeypatch.chdir(REPO)
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI", "CRITBATCH_JOB_PYTHON"):
        monkeypatch.delenv(k, raising=False)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def write(tmp_path, spec, name="s.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(spec))
    return str(p)


JOB_COMMANDS = ("submit", "status", "logs", "stop", "list", "serve")


def test_commands_are_registered(run):
    """Each job command is a command of ``critbatch`` (click's registry) and answers its own
    ``--help`` with its usage line; an unknown one does not (the check can fail)."""
    import typer

    registered = typer.main.get_command(app).commands
    assert set(JOB_COMMANDS) <= set(registered), sorted(registered)
    for cmd in JOB_COMMANDS:
        r = run(cmd, "--help")
        assert r.exit_code == 0, (cmd, r.output)
        usage = next(ln for ln in r.output.splitlines() if "Usage:" in ln)
        assert re.fullmatch(rf"\s*Usage: \S+ {cmd} \[OPTIONS\].*", usage), (cmd, usage)
    r = run("no-such-command", "--help")
    assert r.exit_code == 2 and "No such command 'no-such-command'" in r.output


def test_invalid_spec_exits_2_with_each_path(run, tmp_path):
    bad = {**SPEC, "search": {**SPEC["search"], "batch_sizes_sequences": [4, 0]}, "nope": 1}
    r = run("submit", write(tmp_path, bad), "--address", DOWN)
    assert r.exit_code == 2
    assert "search.batch_sizes_sequences.1" in r.output and "nope" in r.output


def test_dry_run_shows_the_job_and_submits_nothing(run, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    r = run("submit", write(tmp_path, SPEC), "--address", DOWN, "--dry-run", "--sweep-id", "dry-1")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["sweep_id"] == "dry-1" and out["shipped"] == ["data.path"]
    assert "spec.yaml" in out["files"] and "inputs/data/input.txt" in out["files"]
    assert out["entrypoint"].endswith("--tracking-uri http://mlflow.example:5000")
    assert out["metadata"]["critbatch.tracking_uri"] == "http://mlflow.example:5000"


def test_data_over_the_shipping_limit_exits_2(run, tmp_path):
    r = run("submit", write(tmp_path, SPEC), "--address", DOWN, "--ship-data-max-mb", "0.5", "--dry-run")
    assert r.exit_code == 2 and "data.path" in r.output and "--no-ship-data" in r.output


def test_unreachable_cluster_exits_1(run, tmp_path):
    assert run("submit", write(tmp_path, SPEC), "--address", DOWN).exit_code == 1
    assert run("status", "x", "--address", DOWN).exit_code == 1
    assert run("list", "--address", DOWN).exit_code == 1
    assert run("stop", "x", "--address", DOWN).exit_code == 1


def test_serve_without_a_token_exits_2(run, monkeypatch):
    monkeypatch.delenv("CRITBATCH_API_TOKEN", raising=False)
    r = run("serve", "--port", "1")
    assert r.exit_code == 2 and "without an API token" in r.output
