"""End to end on a real local Ray cluster and a real MLflow server, through the CLI and the REST service.

Four one-trial sweeps are submitted up front so that they overlap on the suite's Ray head:

* ``cli``:  ``critbatch submit`` -> followed with ``critbatch status --wait`` to SUCCEEDED;
* ``rest``: ``POST /v1/sweeps`` -> followed with ``GET /v1/sweeps/{id}`` to SUCCEEDED, then its report;
* ``stop``: a longer sweep, stopped with ``DELETE`` once a trial runs -> STOPPED, no RUNNING MLflow run;
* ``fail``: its one trial raises (a batch warmup that shrinks the batch to 0 sequences) -> FAILED.

One trial each: what is checked here (job plumbing, status, stop, report, failure) needs no second
batch size. Only this module's sweeps are counted: other modules share the cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from harness import wait_for
from svc_fakes import cluster_spec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789abcdef"  # conftest.TOKEN: the live service's token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 300


def tiny(name: str, **over) -> dict:
    return cluster_spec(name, **over)


def critbatch(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "critbatch", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def mlflow_runs(tracking_uri: str, sweep_id: str) -> list:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri)
    exps = [e.experiment_id for e in c.search_experiments()]
    return list(c.search_runs(exps, filter_string=f"tags.`critbatch.sweep_id` = '{sweep_id}'", max_results=1000))


def wait_rest(url: str, sweep_id: str, until, what: str, timeout_s: float = TIMEOUT_S) -> dict:
    """Poll ``GET /v1/sweeps/{id}`` until ``until(body)``; fail naming ``what`` and the last body."""
    last: list[dict] = []

    def poll():
        last[:] = [httpx.get(f"{url}/v1/sweeps/{sweep_id}", headers=AUTH, timeout=60).json()]
        return until(last[0])

    try:
        wait_for(poll, timeout_s, f"{sweep_id}: {what}", interval_s=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {last}") from None
    return last[0]


def listed_ids(env: dict) -> list[str]:
    """Every sweep id ``critbatch list`` shows, all pages (other modules' sweeps included)."""
    ids: list[str] = []
    while True:
        p = critbatch(env, "list", "--json", "--limit", "1000", "--offset", str(len(ids)))
        assert p.returncode == 0, p.stdout + p.stderr
        page = json.loads(p.stdout)
        ids += [s["id"] for s in page["items"]]
        if not page["items"] or len(ids) >= page["total"]:
            return ids


@pytest.fixture(scope="module")
def sweeps(cluster_env, service_url, tmp_path_factory) -> Iterator[dict]:
    """Submit the four sweeps (stop first: it must reach a running trial early); yield their ids;
    at the end stop any still running (a failed test leaves none on the shared cluster)."""
    tmp = tmp_path_factory.mktemp("specs")
    ids: dict[str, str] = {}

    r = httpx.post(
        f"{service_url}/v1/sweeps",
        headers={**AUTH, "Content-Type": "application/yaml"},
        content=yaml.safe_dump(tiny("svc-stop", budget_tokens=1_048_576)),
        timeout=120,
    )
    assert r.status_code == 201, r.text
    ids["stop"] = r.json()["id"]

    fail_spec = tmp / "fail.yaml"
    # the trial raises in its worker: the warmup's first phase is 4*1//16 = 0 sequences
    fail_spec.write_text(yaml.safe_dump(tiny("svc-fail", batch_warmup={"schedule": [[0, 1], [2048, 16]]})))
    p = critbatch(cluster_env, "submit", str(fail_spec), "--sweep-id", "svc-fail-1")
    assert p.returncode == 0, p.stdout + p.stderr
    ids["fail"] = "svc-fail-1"

    cli_spec = tmp / "cli.yaml"
    cli_spec.write_text(yaml.safe_dump(tiny("svc-cli")))
    p = critbatch(cluster_env, "submit", str(cli_spec))
    assert p.returncode == 0, p.stdout + p.stderr
    ids["cli"] = p.stdout.split("submitted sweep ", 1)[1].split()[0]
    # resubmitting the identical spec (right away: the default id hashes the spec) starts no second job
    again = critbatch(cluster_env, "submit", str(cli_spec))
    ids["cli_again"] = again.returncode, again.stdout + again.stderr

    r = httpx.post(
        f"{service_url}/v1/sweeps",
        headers={**AUTH, "Content-Type": "application/json"},
        content=json.dumps(tiny("svc-rest")),
        params={"sweep_id": "svc-rest-1"},
        timeout=120,
    )
    assert r.status_code == 201, r.text
    ids["rest"] = r.json()["id"]
    assert ids["rest"] == "svc-rest-1" and r.json()["status"] == "PENDING"
    dup = httpx.post(
        f"{service_url}/v1/sweeps",
        headers={**AUTH, "Content-Type": "application/json"},
        content=json.dumps(tiny("svc-rest")),
        params={"sweep_id": "svc-rest-1"},
        timeout=120,
    )
    ids["rest_dup"] = dup.status_code, dup.json()
    yield ids
    for key in ("stop", "fail", "cli", "rest"):
        httpx.delete(f"{service_url}/v1/sweeps/{ids[key]}", headers=AUTH, params={"wait_s": 30}, timeout=90)


def test_a_sweep_is_stopped_mid_run_without_orphan_runs(sweeps, service_url, cluster_env):
    sid = sweeps["stop"]
    running = wait_rest(
        service_url,
        sid,
        lambda b: (b.get("trials") or {}).get("running", 0) >= 1 or b["status"] in ("SUCCEEDED", "FAILED", "STOPPED"),
        "a running trial",
    )
    assert running["status"] == "RUNNING" and running["trials"]["running"] >= 1, running
    r = httpx.delete(f"{service_url}/v1/sweeps/{sid}", headers=AUTH, params={"wait_s": 60}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "STOPPED" and body["stop_sent"] is True and body["trials"]["running"] == 0
    runs = mlflow_runs(cluster_env["MLFLOW_TRACKING_URI"], sid)
    assert runs and [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    parent = [r for r in runs if r.data.tags.get("critbatch.role") == "sweep"]
    assert len(parent) == 1 and parent[0].data.tags["critbatch.status"] == "STOPPED"
    assert all(r.data.tags.get("critbatch.status") != "RUNNING" for r in runs)
    # stopping again is harmless
    again = httpx.delete(f"{service_url}/v1/sweeps/{sid}", headers=AUTH, timeout=60).json()
    assert again["status"] == "STOPPED" and again["stop_sent"] is False


def test_cli_sweep_succeeds_and_resubmitting_starts_no_second_job(sweeps, cluster_env):
    sid = sweeps["cli"]
    p = critbatch(cluster_env, "status", sid, "--wait", "--timeout-s", str(TIMEOUT_S), timeout=TIMEOUT_S + 60)
    logs = critbatch(cluster_env, "logs", sid).stdout
    assert p.returncode == 0, p.stdout + p.stderr + logs[-3000:]
    state = json.loads(critbatch(cluster_env, "status", sid, "--json").stdout)
    assert state["status"] == "SUCCEEDED" and state["ray_status"] == "SUCCEEDED"
    assert (state["trials"]["done"], state["trials"]["planned"], state["trials"]["running"]) == (1, 1, 0), state
    assert state["best"]["val_loss"] > 0 and state["best"]["batch_size_sequences"] == 4
    assert "svc-cli" in logs
    followed = critbatch(cluster_env, "logs", sid, "--follow", timeout=120)  # an ended job: streams, then returns
    assert followed.returncode == 0 and f"Running entrypoint for job {sid}" in followed.stdout

    code, out = sweeps["cli_again"]
    assert code == 0 and f"sweep {sid!r} was already submitted (the same spec" in out, out
    # the list holds each of this module's four sweeps once (the cluster's other sweeps aside)
    mine = {sweeps[k] for k in ("stop", "fail", "cli", "rest")}
    assert sorted(i for i in listed_ids(cluster_env) if i in mine) == sorted(mine)


def test_rest_sweep_succeeds_and_serves_its_report(sweeps, service_url, cluster_env):
    sid = sweeps["rest"]
    code, dup = sweeps["rest_dup"]
    assert code == 409 and dup["same_spec"] is True and dup["id"] == sid

    body = wait_rest(service_url, sid, lambda b: b["status"] in ("SUCCEEDED", "FAILED", "STOPPED"), "the end")
    assert body["status"] == "SUCCEEDED", (
        body,
        httpx.get(f"{service_url}/v1/sweeps/{sid}/logs", headers=AUTH).text[-3000:],
    )
    assert body["trials"]["done"] == 1 and body["parent_run_id"]
    rep = httpx.get(f"{service_url}/v1/sweeps/{sid}/report", headers=AUTH, timeout=60)
    assert rep.status_code == 200, rep.text
    report = rep.json()
    assert report["cbs"]["sweep_id"] == sid and "b_crit" in report["cbs"]
    ml = report["mlflow"]
    mlflow_url = cluster_env["MLFLOW_TRACKING_URI"]
    assert ml["parent_run_id"] == body["parent_run_id"] and len(ml["trial_runs"]) == 1
    assert ml["links"]["parent_run"] == f"{mlflow_url}/#/experiments/{ml['experiment_id']}/runs/{ml['parent_run_id']}"
    assert ml["links"]["compare_trials"].startswith(f"{mlflow_url}/#/compare-runs?runs=")
    # the report is the parent run's artifact, as logged by the driver
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory() as t:
        logged = json.loads(
            Path(MlflowClient(mlflow_url).download_artifacts(ml["parent_run_id"], "cbs.json", t)).read_text()
        )
    assert logged == report["cbs"]
    logs = httpx.get(f"{service_url}/v1/sweeps/{sid}/logs", headers=AUTH, params={"tail": 5}, timeout=60)
    assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain")
    page = httpx.get(f"{service_url}/v1/sweeps", headers=AUTH, params={"limit": 100}, timeout=60).json()
    assert sid in [s["id"] for s in page["items"]]


def test_a_sweep_whose_trials_all_raise_ends_failed(sweeps, cluster_env):
    sid = sweeps["fail"]
    p = critbatch(cluster_env, "status", sid, "--wait", "--timeout-s", str(TIMEOUT_S), timeout=TIMEOUT_S + 60)
    assert p.returncode == 1, p.stdout + p.stderr
    state = json.loads(critbatch(cluster_env, "status", sid, "--json").stdout)
    assert state["status"] == "FAILED" and state["reason"], state
    assert state["trials"]["failed"] == 1 == state["trials"]["planned"] and state["trials"]["done"] == 0, state
    runs = mlflow_runs(cluster_env["MLFLOW_TRACKING_URI"], sid)
    assert [r for r in runs if r.info.status == "RUNNING"] == []
    parent = [r for r in runs if r.data.tags.get("critbatch.role") == "sweep"]
    assert len(parent) == 1 and parent[0].data.tags["critbatch.status"] == "FAILED"


def test_a_failed_trial_keeps_its_mlflow_run(sweeps, cluster_env):
    """docs/design.md: one child run per trial, tagged FAILED when it raised (the driver must not delete it)."""
    sid = sweeps["fail"]
    p = critbatch(cluster_env, "status", sid, "--wait", "--timeout-s", str(TIMEOUT_S), timeout=TIMEOUT_S + 60)
    assert p.returncode == 1, p.stdout + p.stderr
    trials = [
        r for r in mlflow_runs(cluster_env["MLFLOW_TRACKING_URI"], sid) if r.data.tags.get("critbatch.role") == "trial"
    ]
    assert [(r.info.status, r.data.tags.get("critbatch.status")) for r in trials] == [("FAILED", "FAILED")], (
        "the failed trial's child run is missing or mis-tagged (sweeps.run.driver prunes child runs whose trial id "
        "collect_records could not read back)"
    )


def test_live_service_refuses_missing_and_wrong_tokens_and_big_bodies(service_url):
    assert httpx.get(f"{service_url}/healthz").status_code == 200
    assert httpx.get(f"{service_url}/v1/sweeps").status_code == 401
    assert (
        httpx.get(f"{service_url}/v1/sweeps", headers={"Authorization": "Bearer wrong-0123456789abc"}).status_code
        == 401
    )
    assert httpx.get(f"{service_url}/openapi.json").status_code == 401
    assert httpx.get(f"{service_url}/openapi.json", headers=AUTH).json()["info"]["title"] == "critbatch"
    big = b"name: x\n" + b"#" * (10 * 1024 * 1024)
    r = httpx.post(
        f"{service_url}/v1/sweeps", headers={**AUTH, "Content-Type": "application/yaml"}, content=big, timeout=60
    )
    assert r.status_code == 413
    assert httpx.get(f"{service_url}/v1/sweeps/no-such-sweep", headers=AUTH).status_code == 404


def test_serve_refuses_to_start_without_a_token(cluster_env):
    env = {k: v for k, v in cluster_env.items() if k != "CRITBATCH_API_TOKEN"}
    p = critbatch(env, "serve", "--host", "127.0.0.1", "--port", "1", timeout=60)
    assert p.returncode == 2 and "without an API token" in p.stderr
    p = critbatch(env, "serve", "--host", "0.0.0.0", "--port", "1", "--local-only", timeout=60)
    assert p.returncode == 2 and "loopback" in p.stderr
