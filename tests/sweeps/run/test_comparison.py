"""A comparison (``arms``) end to end: two arms through Tune, Optuna, Ray Train and MLflow, stopped by SIGINT
in its second arm and resumed; the side-by-side cbs.json, the report, the MLflow tags (no mocks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, invoke_cli, run_cli, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # ~2-3 min idle


def _wait_for(pred, timeout_s: float, proc) -> None:
    t0 = time.monotonic()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"the comparison exited ({proc.returncode}) before the condition held")
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError("timed out")
        time.sleep(0.5)


def test_a_comparison_runs_each_arm_stops_in_one_resumes_and_compares_at_common_targets(
    tmp_path, tiny_spec_dict, ray_head, mlflow_uri
):
    d = dict(tiny_spec_dict, name="tiny-cmp")
    # 2 batch sizes per arm (a comparison at common targets needs no more), one trial at a time (two trial
    # runners starting at once cost ~7 s a sweep on 2 cores): the stop lands after the second arm's first report
    d["search"] = dict(d["search"], batch_sizes_sequences=[4, 8])
    d["resources"] = {"max_concurrent_trials": 1}
    d["arms"] = [
        {"name": "sqrt", "search": {"lr_rules": ["sqrt"]}},
        {"name": "linear", "search": {"lr_rules": ["linear"]}},
    ]
    out, uri = tmp_path / "out", mlflow_uri
    spec = write_spec(tmp_path, d)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "critbatch",
            "run",
            str(spec),
            "-o",
            str(out),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # stop it once the second arm has a trial report: the first arm is finished, the second half-done
        _wait_for(lambda: any((out / "arms" / "linear" / "reports").glob("*.jsonl")), 400, proc)
        proc.send_signal(signal.SIGINT)
        log, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, log
    state = json.loads((out / "comparison.json").read_text())
    assert state["status"] == "STOPPED"
    first = json.loads((out / "arms" / "sqrt" / "sweep.json").read_text())
    assert first["status"] == "SUCCEEDED"
    assert not (out / "cbs.json").exists()  # no comparison from half an arm

    r = run_cli(["resume", str(out), "--no-progress"], timeout_s=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((out / "arms" / "sqrt" / "sweep.json").read_text()) == first  # the finished arm was not rerun
    assert json.loads((out / "comparison.json").read_text())["status"] == "SUCCEEDED"
    cbs = json.loads((out / "cbs.json").read_text())
    ref = json.loads((out / "arms" / "sqrt" / "cbs.json").read_text())
    assert cbs["kind"] == "comparison" and cbs["reference_arm"] == "sqrt"
    assert [a["name"] for a in cbs["arms"]] == ["sqrt", "linear"]
    assert cbs["targets"] == [t["target_loss"] for t in ref["targets"]]  # the second arm at the first arm's targets
    sqrt_row = cbs["arms"][0]["targets"][[t["target_loss"] for t in ref["targets"]].index(ref["target_loss"])]
    assert sqrt_row["b_crit"] == ref["b_crit"] and sqrt_row["status"] == ref["status"]
    for arm in cbs["arms"]:
        assert (arm["sync"], arm["sync_every_steps"], arm["replicas"]) == ("ddp", 1, 1)
        assert arm["status"] == "SUCCEEDED" and arm["sweep_id"].endswith("." + arm["name"])
        for row in arm["targets"]:
            for p in row.get("points") or []:
                assert p["syncs_to_target"] == p["steps_to_target"]  # ddp: one all-reduce per step
    assert len(cbs["summary"]) == 1 and cbs["summary"][0].startswith("linear")
    html = (out / "report.html").read_text()
    assert "arms/linear/report.html" in html and (out / "plots" / "compare_b_crit.png").stat().st_size > 0

    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("tiny-cmp").experiment_id], max_results=1000)
    arms_of = {(x.data.tags.get("critbatch.role"), x.data.tags.get("critbatch.arm")) for x in runs}
    assert arms_of == {("sweep", "sqrt"), ("sweep", "linear"), ("trial", "sqrt"), ("trial", "linear")}
    assert {x.data.tags.get("critbatch.comparison") for x in runs} == {"tiny-cmp"}
    assert {x.data.params.get("lr_rule") for x in runs if x.data.tags.get("critbatch.role") == "trial"} == {
        "sqrt",
        "linear",
    }

    again = invoke_cli(["resume", str(out), "--no-progress", "--address", "127.0.0.1:9"])  # refused before Ray
    assert again.returncode == 2 and "already finished" in again.stdout + again.stderr

    # re-analysed by `critbatch analyze --comparison`: the same comparison, the states untouched
    states = [(out / p).read_text() for p in ("comparison.json", "arms/sqrt/sweep.json", "arms/linear/sweep.json")]
    r = invoke_cli(["analyze", "--comparison", str(out)])  # no Ray: in this process
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == json.loads((out / "cbs.json").read_text()) == cbs
    assert [
        (out / p).read_text() for p in ("comparison.json", "arms/sqrt/sweep.json", "arms/linear/sweep.json")
    ] == states
    for arm in cbs["arms"]:
        for row in arm["targets"]:
            if row.get("s_min") is not None:
                assert row["syncs_min_ci"] == row["s_min_ci"]  # ddp: H = 1
