"""MLflow 3's UI over a sweep's store (``sweeps.tracking.ui``, ``critbatch ui``, ``make ui``): the experiment tags
critbatch writes (model training, its saved view of the runs table), the address that opens that table, the
server's command line, and a real ``critbatch ui`` over a real sweep's store, read back through MLflow's REST API
(no browser here)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from sweeps.errors import InvalidInput
from sweeps.tracking import schema
from sweeps.tracking.reader import runs_table_url
from sweeps.tracking.ui import (
    VIEW_METRICS,
    VIEW_NAME,
    VIEW_PARAMS,
    UiConfig,
    experiment_tags,
    mark_experiment,
)

VIEW_TAG = "mlflow.sharedViewState.critbatch"


def _view(tags: dict[str, str]) -> dict:
    """The saved view's envelope, its ``state`` parsed, as MLflow's UI reads it (``name`` a string,
    ``createdAt`` a number, ``state`` a JSON string)."""
    env = json.loads(tags[VIEW_TAG])
    assert isinstance(env["name"], str) and isinstance(env["createdAt"], int) and isinstance(env["state"], str)
    return {**env, "state": json.loads(env["state"])}


# ---- the tags --------------------------------------------------------------------------------------


def test_a_new_experiment_is_model_training_with_a_view_of_the_columns_trials_differ_in():
    tags = experiment_tags(now_ms=1_700_000_000_000)
    assert set(tags) == {"mlflow.experimentKind", VIEW_TAG}
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow 3's "Machine learning" kind
    view = _view(tags)
    assert view["name"] == VIEW_NAME and view["createdAt"] == view["updatedAt"] == 1_700_000_000_000
    assert view["state"] == {
        "selectedColumns": [
            "params.`batch_size_sequences`",
            "params.`lr`",
            "params.`lr_rule`",
            "params.`beta2`",
            "params.`seed`",
            "metrics.`val_loss`",
            "metrics.`target_loss`",
            "metrics.`b_crit`",
        ]
    }
    # the names are the ones the writer logs: trial params and metrics, the parent run's summary
    assert set(VIEW_PARAMS) <= set(schema.TRIAL_PARAMS)
    assert set(VIEW_METRICS) <= set(schema.METRIC_KEYS) | set(schema.SUMMARY_METRICS)


def test_create_experiment_hands_mlflow_the_tags():
    from sweeps.tracking.writer import create_experiment

    class Client:
        tracking_uri = "http://127.0.0.1:5000"

        def create_experiment(self, name, artifact_location=None, tags=None):
            self.got = (name, artifact_location, tags)
            return "3"

    c = Client()
    assert create_experiment(c, "sweep") == "3"
    assert c.got[:2] == ("sweep", None)
    assert c.got[2]["mlflow.experimentKind"] == "custom_model_development" and VIEW_TAG in c.got[2]


def test_marking_sets_only_the_tags_an_experiment_lacks():
    class Client:
        def __init__(self):
            self.set = []

        def set_experiment_tag(self, experiment_id, key, value):
            self.set.append((experiment_id, key))

    class Exp:
        experiment_id = "4"
        tags = {"mlflow.experimentKind": "genai_development"}  # a user's choice, kept

    c = Client()
    assert mark_experiment(c, Exp()) == [VIEW_TAG]
    assert c.set == [("4", VIEW_TAG)]
    Exp.tags = experiment_tags()
    assert mark_experiment(c, Exp()) == [] and len(c.set) == 1


def test_the_runs_table_address_is_on_the_model_training_side():
    assert runs_table_url("http://127.0.0.1:5000/", "7", view=True) == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=critbatch"
    )
    assert runs_table_url("http://h:1", "7", view=False) == (
        "http://h:1/#/experiments/7/runs?workflowType=machine_learning"
    )
    from sweeps.tracking.reader import mlflow_ui_links

    assert mlflow_ui_links("http://ui:5000", "1", None, [])["experiment"] == (
        "http://ui:5000/#/experiments/1/runs?workflowType=machine_learning"
    )


# ---- the server's command line ---------------------------------------------------------------------


def test_the_server_has_one_worker_no_job_runner_and_listens_on_this_machine_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = UiConfig(port=5123)
    assert c.backend_store_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"  # `make run`'s store, absolute
    cmd = c.command()
    assert cmd[1:4] == ["-m", "mlflow", "server"]
    assert cmd[4:] == [
        "--backend-store-uri",
        c.backend_store_uri,
        "--host",
        "127.0.0.1",
        "--port",
        "5123",
        "--workers",
        "1",
    ]
    assert c.env({"A": "1"}) == {"A": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    assert c.url == "http://127.0.0.1:5123"
    assert UiConfig(backend_store_uri="sqlite:////abs/x.db").backend_store_uri == "sqlite:////abs/x.db"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"port": 0}, "port"),
        ({"port": 65536}, "port"),
        ({"port": True}, "port"),
        ({"port": "5000"}, "port"),
        ({"backend_store_uri": ""}, "backend_store_uri"),
        ({"backend_store_uri": "http://127.0.0.1:5000"}, "backend_store_uri"),
    ],
)
def test_bad_settings_are_refused_by_field(kwargs, field):
    with pytest.raises(InvalidInput, match=field):
        UiConfig(**kwargs)


# ---- a real `critbatch ui` over a real sweep's store -------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(720)  # the session's precision sweep if no test ran it before (~40 s idle), MLflow's ~45 s start
def test_critbatch_ui_opens_the_sweeps_runs_table_with_its_parent_and_children(precision_sweep, tmp_path):
    """``critbatch ui`` as ``make ui`` runs it, on a copy of the store a real sweep wrote (the fixture's is read
    only): the sweep created its experiment with both tags, the command prints the runs-table address once
    MLflow answers, and MLflow's REST API finds the experiment (model training, the view's columns on the
    children), the parent run and one child run per trial."""
    import requests

    from tests.harness import base_env, free_port, start_group, stop_group, wait_for

    src = Path(precision_sweep.tracking_uri[len("sqlite:///") :])
    db = tmp_path / "mlflow.db"
    shutil.copyfile(src, db)
    state = precision_sweep.read("sweep.json")
    exp_id, parent_id = state["experiment_id"], state["parent_run_id"]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:  # what the sweep itself wrote
        written = dict(conn.execute("SELECT key, value FROM experiment_tags WHERE experiment_id = ?", (exp_id,)))
    assert written["mlflow.experimentKind"] == "custom_model_development" and VIEW_TAG in written

    port = free_port()  # the OS's ephemeral range: never Ray's 10002-19999
    log = tmp_path / "ui.log"
    proc = start_group(
        ["critbatch", "ui", "--backend-store-uri", f"sqlite:///{db}", "--port", str(port), "--start-timeout-s", "400"],
        log,
        base_env(),
        tmp_path,
    )
    try:

        def printed_url():
            assert proc.poll() is None, log.read_text()[-3000:]
            return re.search(r"^http://127\.0\.0\.1:\d+/#/experiments/\S+$", log.read_text(), flags=re.MULTILINE)

        url = wait_for(printed_url, 420, "critbatch ui's address", interval_s=1.0).group(0)
        base = f"http://127.0.0.1:{port}"
        assert url == f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning&viewStateShareKey=critbatch"
        assert "tags added" not in log.read_text()  # the sweep had set them

        page = requests.get(f"{base}/", timeout=30)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]  # the UI's page

        api = f"{base}/api/2.0/mlflow"
        exp = requests.get(f"{api}/experiments/get", params={"experiment_id": exp_id}, timeout=30).json()["experiment"]
        tags = {t["key"]: t["value"] for t in exp["tags"]}
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        columns = _view(tags)["state"]["selectedColumns"]

        def search(filter_string: str) -> list[dict]:
            r = requests.post(
                f"{api}/runs/search",
                json={"experiment_ids": [exp_id], "filter": filter_string, "max_results": 1000},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            return r.json().get("runs", [])

        parents = search("tags.`critbatch.role` = 'sweep'")
        assert [p["info"]["run_id"] for p in parents] == [parent_id]
        children = search(f"tags.`mlflow.parentRunId` = '{parent_id}'")
        trials = precision_sweep.read("trials.json")
        trials = trials["trials"] if isinstance(trials, dict) else trials
        assert len(children) == len(trials) == 6
        for child in children:
            params = {p["key"] for p in child["data"]["params"]}
            metrics = {m["key"] for m in child["data"]["metrics"]}
            assert {c for c in columns if c.startswith("params.")} <= {f"params.`{p}`" for p in params}
            assert "val_loss" in metrics
        parent_metrics = {m["key"] for m in parents[0]["data"]["metrics"]}
        cbs = precision_sweep.read("cbs.json")  # the parent logs a summary metric where cbs.json's value is finite
        assert {m for m in ("target_loss", "b_crit") if isinstance(cbs.get(m), (int, float))} <= parent_metrics
        assert "target_loss" in parent_metrics
    finally:
        stop_group(proc, grace_s=20)  # SIGTERM: critbatch stops its server; SIGKILL to what is left after 20 s
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)
