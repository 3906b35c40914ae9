"""Sweeps that share a cluster keep to their own trials.

Two one-trial sweeps start together on the test cluster, whose Ray Tune start second is pinned
(``conftest.pinned_date_env``), so both "start in the same second": a local driver
(``critbatch run --address``) whose trial trains, and a Ray Job through the REST service whose trial
raises. Before the Tune run was named by the sweep id, Ray staged both under
``<session>/artifacts/<second>/tune/`` and each sweep read the other's trials (a failing sweep reported
SUCCEEDED with another's ``target_loss``).

Each sweep must report exactly its own trial: its status, its trial counts, ``cbs.json`` and
``trials.json``, and its MLflow children. One trial each and two sweeps are enough: a sweep that read the
other's staging folder would count that sweep's trial too, or take its status and result; the two ways in
(a local driver, a Ray Job) and the two outcomes are each on one side. (Four sweeps, both outcomes on
each way in, showed nothing more and took 74 s against about 40 on 2 cores.)
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from harness import PINNED_DATE, pinned_date_env, wait_for
from svc_fakes import cluster_spec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789abcdef"  # conftest.TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 300


def spec(name: str, *, failing: bool) -> dict:
    d = cluster_spec(name, cpus_per_worker=0.25)
    if failing:  # every trial raises in its worker: the warmup's first phase is B*1//16 = 0 sequences
        d["batch_warmup"] = {"schedule": [[0, 1], [2048, 16]]}
    return d


def mlflow_trials(uri: str, sweep_id: str) -> tuple[list, list]:
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    exps = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(exps, filter_string=f"tags.`critbatch.sweep_id` = '{sweep_id}'", max_results=1000)
    return (
        [r for r in runs if r.data.tags.get("critbatch.role") == "sweep"],
        [r for r in runs if r.data.tags.get("critbatch.role") == "trial"],
    )


def check_own_trials(sweep_id: str, cbs: dict, trials: list[dict], uri: str, *, failing: bool) -> None:
    """cbs.json, trials.json and the MLflow children name the same one trial, of this sweep."""
    parents, children = mlflow_trials(uri, sweep_id)
    assert len(parents) == 1, parents
    child_ids = sorted(r.data.tags["critbatch.trial_id"] for r in children)
    assert len(child_ids) == 1, child_ids
    assert cbs["sweep_id"] == sweep_id
    assert sorted(t["trial_id"] for t in trials) == child_ids, (sweep_id, trials, child_ids)
    assert sorted(cbs["mlflow"]["child_runs"]) == child_ids
    status = "FAILED" if failing else "COMPLETED"
    assert {k: v for k, v in cbs["trials"].items() if v} == {status: 1}, cbs["trials"]
    assert [t["status"] for t in trials] == [status]
    assert [r.data.tags["critbatch.status"] for r in children] == [status]
    m = parents[0].data.metrics
    assert (m.get("trials_completed", 0), m.get("trials_failed", 0)) == ((0, 1) if failing else (1, 0)), m
    if failing:
        assert "target_loss" not in m and parents[0].data.tags["critbatch.status"] == "FAILED"
    else:
        assert parents[0].data.tags["critbatch.status"] == "SUCCEEDED"


@pytest.fixture(scope="module")
def two_sweeps(cluster_env, ray_gcs_address, mlflow_server, service_url, tmp_path_factory) -> dict:
    """Start the two sweeps at once; wait for both; return what each left."""
    tmp = tmp_path_factory.mktemp("concurrent")
    env = pinned_date_env(dict(cluster_env))
    env.pop("RAY_ADDRESS")
    local = {}
    for name, failing in (("iso-local-ok", False),):
        path = tmp / f"{name}.yaml"
        d = spec(name, failing=failing)
        d["data"]["path"] = str(REPO / d["data"]["path"])
        path.write_text(yaml.safe_dump(d))
        out = tmp / name
        log = open(tmp / f"{name}.log", "w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "critbatch",
                "run",
                str(path),
                "--output",
                str(out),
                "--sweep-id",
                name,
                "--address",
                ray_gcs_address,
                "--tracking-uri",
                mlflow_server,
                "--no-progress",
            ],
            cwd=tmp,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        local[name] = (proc, out, tmp / f"{name}.log", failing)
    rest = {}
    for name, failing in (("iso-rest-fail", True),):
        r = httpx.post(
            f"{service_url}/v1/sweeps",
            headers={**AUTH, "Content-Type": "application/json"},
            content=json.dumps(spec(name, failing=failing)),
            params={"sweep_id": name},
            timeout=120,
        )
        assert r.status_code == 201, r.text
        rest[name] = failing
    deadline = time.monotonic() + TIMEOUT_S  # for both together
    try:
        for name, (proc, _out, log, _f) in local.items():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not finish:\n{log.read_text()[-4000:]}")
        states = {}

        def ended(name):
            states[name] = httpx.get(f"{service_url}/v1/sweeps/{name}", headers=AUTH, timeout=60).json()
            return states[name]["status"] in ("SUCCEEDED", "FAILED", "STOPPED")

        for name in rest:
            try:
                wait_for(
                    functools.partial(ended, name),
                    max(1.0, deadline - time.monotonic()),
                    f"{name} to end",
                    interval_s=1.0,
                )
            except AssertionError as exc:
                pytest.fail(f"{exc}; last status: {states.get(name)}")
    finally:
        for proc, *_ in local.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for name in rest:  # an ended sweep: a no-op; one left running by a failure stops
            httpx.delete(f"{service_url}/v1/sweeps/{name}", headers=AUTH, params={"wait_s": 30}, timeout=90)
    return {"local": local, "rest": rest, "states": states}


def test_the_two_sweeps_started_in_one_second_on_one_cluster(two_sweeps, ray_temp_dir):
    """The premise: Ray staged both sweeps under the same start second, each in its own folder."""
    staged = sorted({p.name for p in ray_temp_dir.glob(f"session_*/artifacts/{PINNED_DATE}/iso-*")})  # + session_latest
    assert staged == ["iso-local-ok", "iso-rest-fail"], staged


def test_a_local_driver_started_beside_another_sweep_reports_its_own_trial(two_sweeps, mlflow_server):
    for name, (proc, out, log, failing) in two_sweeps["local"].items():
        assert proc.returncode == (1 if failing else 0), log.read_text()[-4000:]
        cbs = json.loads((out / "cbs.json").read_text())
        trials = json.loads((out / "trials.json").read_text())
        check_own_trials(name, cbs, trials, mlflow_server, failing=failing)
        assert json.loads((out / "sweep.json").read_text())["status"] == ("FAILED" if failing else "SUCCEEDED")


def test_a_service_sweep_started_beside_another_sweep_reports_its_own_trial(two_sweeps, mlflow_server, service_url):
    from mlflow import MlflowClient

    for name, failing in two_sweeps["rest"].items():
        body = two_sweeps["states"][name]
        assert body["status"] == ("FAILED" if failing else "SUCCEEDED"), body
        assert (body["trials"]["done"], body["trials"]["failed"]) == ((0, 1) if failing else (1, 0)), body
        assert body["trials"]["planned"] == 1
        if not failing:
            assert body["result"]["target_loss"] > 0
        else:
            assert not (body["result"] or {}).get("target_loss")
        c = MlflowClient(mlflow_server)
        with tempfile.TemporaryDirectory() as t:
            cbs = json.loads(Path(c.download_artifacts(body["parent_run_id"], "cbs.json", t)).read_text())
            trials = json.loads(Path(c.download_artifacts(body["parent_run_id"], "trials.json", t)).read_text())
        check_own_trials(name, cbs, trials, mlflow_server, failing=failing)
