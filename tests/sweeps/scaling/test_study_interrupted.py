"""`critbatch scale SPEC --budgets-tokens ...` for real, on the suite's Ray head: stopped by Ctrl-C (SIGINT to its
process group, as a terminal sends it) while its first member's first trial is held mid-way, then the same command
again finishes the study: every member an ordinary finished sweep folder, `scale.json` and its plot, and one MLflow study run with
the members' sweep runs nested under it."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.conftest import run_cli, write_spec
from tests.sweeps.run.test_faults import wait_for
from tests.sweeps.run.test_interrupts import hold_env, start, tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BUDGETS = "8192,16384"


def _study_spec(tiny_spec_dict: dict) -> dict:
    d = dict(tiny_spec_dict, name="tiny-study")
    d["search"] = dict(d["search"], batch_sizes_sequences=[4, 8, 16, 32], trials_per_batch_size=1)
    d["resources"] = {"max_concurrent_trials": 1}
    return d


def test_a_stopped_study_finishes_when_run_again(tmp_path, tiny_spec_dict, ray_head, mlflow_uri):
    spec = write_spec(tmp_path, _study_spec(tiny_spec_dict))
    out, log, hold = tmp_path / "study", tmp_path / "run.log", tmp_path / "hold"
    args = [
        "scale",
        str(spec),
        "--budgets-tokens",
        BUDGETS,
        "--predict-tokens",
        "1e6",
        "--output",
        str(out),
        "--tracking-uri",
        mlflow_uri,
        "--address",
        ray_head.gcs_address,
    ]
    proc = start(args, log, env=hold_env(hold))
    reports = out / "members" / "tokens-8192" / "reports"
    try:
        wait_for(
            lambda: reports.is_dir() and any(reports.glob("*.jsonl")),
            300,
            "the first member's first report",
            diagnose=lambda: tail(log),
        )
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=300)
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 130, tail(log)
    study = json.loads((out / "study.json").read_text())
    assert study["status"] == "STOPPED" and study["exit_code"] == 130
    assert not (out / "members" / "tokens-16384").exists() and not (out / "scale.json").exists()

    r = run_cli(args, timeout_s=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    study = json.loads((out / "study.json").read_text())
    assert study["status"] == "SUCCEEDED" and [m["budget_tokens"] for m in study["members"]] == [8192, 16384]
    for m in study["members"]:
        assert json.loads((out / m["folder"] / "sweep.json").read_text())["status"] == "SUCCEEDED"
    first, second = study["members"]
    assert second["start_lr"] == (first["best_lr_at_base"] or first["start_lr"])
    scale = json.loads((out / "scale.json").read_text())
    assert (out / "scale.png").is_file() and len(scale["members"]) == 2 and "gamma" in scale
    assert "extrapolated" in r.stderr

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.get_run(scale["mlflow"]["study_run_id"])
    assert run.data.tags["critbatch.role"] == "study" and "gamma" in run.data.metrics
    for m in study["members"]:
        parent = json.loads((out / m["folder"] / "cbs.json").read_text())["mlflow"]["parent_run_id"]
        assert client.get_run(parent).data.tags["mlflow.parentRunId"] == run.info.run_id
