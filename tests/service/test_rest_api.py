"""The REST service in-process (real app, real SweepJobs, in-memory Ray and MLflow): routes, auth, limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from svc_fakes import tiny_spec
from svc_store import seed_sweep

from service.app import create_app
from service.server import check_serve_settings
from service.settings import Settings, SettingsError
from sweeps.remote import SweepJobs

REPO = Path(__file__).resolve().parents[2]
TOKEN = "unit-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = tiny_spec()


@pytest.fixture
def client(fake_jobs):
    settings = Settings(api_token=TOKEN, tracking_uri="http://mlflow.invalid", data_dir=str(REPO))
    with TestClient(create_app(settings, jobs=fake_jobs)) as c:
        yield c


def post_yaml(client, spec, **params):
    return client.post(
        "/v1/sweeps", content=yaml.safe_dump(spec), params=params, headers={**AUTH, "Content-Type": "application/yaml"}
    )


# ---- auth --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer "},
    ],
)
@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v1/sweeps"),
        ("GET", "/v1/sweeps/x"),
        ("DELETE", "/v1/sweeps/x"),
        ("GET", "/v1/sweeps/x/logs"),
        ("GET", "/v1/sweeps/x/report"),
        ("POST", "/v1/sweeps"),
        ("GET", "/openapi.json"),
    ],
)
def test_every_route_but_health_needs_the_token(client, fake_ray, headers, method, path):
    r = client.request(
        method,
        path,
        headers={**headers, "Content-Type": "application/yaml"},
        content=yaml.safe_dump(SPEC) if method == "POST" else None,
    )
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert fake_ray.submitted == [] and fake_ray.stop_calls == []


def test_health_needs_no_token(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_no_docs_pages_outside_the_token(client):
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404


def test_the_service_refuses_to_start_without_a_token():
    with pytest.raises(SettingsError, match="without an API token"):
        Settings.from_env({})
    with pytest.raises(SettingsError, match="at least 16"):
        Settings.from_env({"CRITBATCH_API_TOKEN": "short"})
    with pytest.raises(SettingsError, match="loopback"):
        check_serve_settings(host="0.0.0.0", local_only=True)
    assert Settings.from_env({}, local_only=True).api_token is None


def test_the_service_reads_its_critbatch_variables_into_the_products_settings():
    """One reading of every ``CRITBATCH_*`` variable (``sweeps.settings.Settings.from_env``): the service's object
    is the product's, with its defaults where a variable is unset, and the same refusals."""
    import sweeps.settings

    env = {
        "CRITBATCH_API_TOKEN": TOKEN,
        "CRITBATCH_MAX_RUNNING": "7",
        "CRITBATCH_REQUEST_TIMEOUT_S": "12.5",
        "CRITBATCH_SHIP_DATA_MAX_MB": "3",
        "CRITBATCH_OPTUNA_STORAGE": "postgresql://db/optuna",
        "RAY_ADDRESS": "http://head:8265",
    }
    s = Settings.from_env(env)
    assert isinstance(s, sweeps.settings.Settings)
    product = sweeps.settings.Settings.from_env(env)
    assert {f: getattr(s, f) for f in vars(product)} == vars(product)
    assert (s.max_running, s.request_timeout_s, s.ship_data_max_mb, s.ray_address) == (7, 12.5, 3.0, "http://head:8265")
    assert (s.max_body_bytes, s.ray_timeout_s, s.ready_timeout_s, s.upload_max_mb) == (1024 * 1024, 10.0, 2.0, None)
    with pytest.raises(SettingsError, match="CRITBATCH_RAY_TIMEOUT_S must be positive"):
        Settings.from_env({**env, "CRITBATCH_RAY_TIMEOUT_S": "0"})
    with pytest.raises(SettingsError, match="CRITBATCH_MAX_RUNNING='many' is not an integer"):
        Settings.from_env({**env, "CRITBATCH_MAX_RUNNING": "many"})


def test_local_only_serves_without_a_token(fake_jobs):
    with TestClient(create_app(Settings(local_only=True), jobs=fake_jobs)) as c:
        assert c.get("/v1/sweeps").status_code == 200


# ---- submission ----------------------------------------------------------------------------------


def test_submit_yaml_then_duplicate_is_409(client, fake_ray):
    r = post_yaml(client, SPEC)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "PENDING" and body["id"].startswith("tiny-")
    assert r.headers["location"] == f"/v1/sweeps/{body['id']}"
    [sub] = fake_ray.submitted
    assert sub["submission_id"] == body["id"]
    assert "--tracking-uri" in sub["entrypoint"] and "http://mlflow.invalid" in sub["entrypoint"]
    assert "inputs/data/input.txt" in sub["files"]  # inside CRITBATCH_DATA_DIR: shipped
    r2 = post_yaml(client, SPEC)
    assert r2.status_code == 409 and r2.json()["same_spec"] is True and r2.json()["id"] == body["id"]
    # the REST client's parameter, not the CLI's option
    assert r2.json()["detail"] == (
        f"sweep {body['id']!r} was already submitted (the same spec; status PENDING); no "
        "second job started (choose another id with ?sweep_id= to run it again)"
    )
    assert len(fake_ray.submitted) == 1


def test_submit_json_with_a_client_id(client, fake_ray):
    r = client.post(
        "/v1/sweeps",
        params={"sweep_id": "my-run.1"},
        content=json.dumps(SPEC),
        headers={**AUTH, "Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 201 and r.json()["id"] == "my-run.1"
    assert fake_ray.submitted[0]["submission_id"] == "my-run.1"


def test_invalid_specs_get_422_with_each_fields_path(client, fake_ray):
    bad = json.loads(json.dumps(SPEC))
    bad["search"]["batch_sizes_sequences"] = [4, -8]
    bad["model"]["d_model"] = 30
    bad["surprise"] = 1
    r = post_yaml(client, bad)
    assert r.status_code == 422 and r.json()["detail"] == "invalid sweep spec"  # answered by service.errors
    paths = {e["path"] for e in r.json()["errors"]}
    assert {"search.batch_sizes_sequences.1", "model", "surprise"} <= paths
    assert fake_ray.submitted == []


@pytest.mark.parametrize(
    "content,ctype,path",
    [
        (b"", "application/yaml", "<root>"),
        (b"[1, 2]", "application/yaml", "<root>"),
        (b"a: [", "application/yaml", "<root>"),
        (b"\xff\xfe", "application/json", "<root>"),
        (b'{"name": NaN}', "application/json", "<root>"),
        (b"a: &x [1]\nb: *x\n", "application/yaml", "<root>"),
        (b"[" * 100_000, "application/json", "<root>"),
        (b"[" * 100_000, "application/yaml", "<root>"),
        (b"[" * 5000 + b"]" * 5000, "application/json", "<root>"),
        (b"name: " + b"[" * 5000 + b"]" * 5000, "application/yaml", "<root>"),
    ],
)
def test_unparseable_bodies_are_422_not_500(client, content, ctype, path):
    r = client.post("/v1/sweeps", content=content, headers={**AUTH, "Content-Type": ctype})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["path"] == path and r.json()["detail"] == "invalid sweep spec"


def test_wrong_media_type_is_415(client):
    r = client.post("/v1/sweeps", content=yaml.safe_dump(SPEC), headers={**AUTH, "Content-Type": "text/plain"})
    assert r.status_code == 415


def test_bad_sweep_id_is_422(client):
    r = post_yaml(client, SPEC, sweep_id="../etc")
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "sweep_id"


def test_a_10_mb_body_is_refused(client, fake_ray):
    big = b"name: x\n" + b"#" * (10 * 1024 * 1024)
    r = client.post("/v1/sweeps", content=big, headers={**AUTH, "Content-Type": "application/yaml"})
    assert r.status_code == 413
    assert fake_ray.submitted == []


def test_a_streamed_body_without_length_is_counted(fake_jobs):
    """Chunked uploads carry no Content-Length: the limit still holds."""
    app = create_app(Settings(api_token=TOKEN, max_body_bytes=1000), jobs=fake_jobs)

    def chunks():
        for _ in range(10):
            yield b"#" * 500

    with TestClient(app) as c:
        r = c.post("/v1/sweeps", content=chunks(), headers={**AUTH, "Content-Type": "application/yaml"})
    assert r.status_code == 413


def test_a_spec_whose_batch_size_folds_milestones_is_422_and_not_submitted(client, fake_ray):
    """B = 256 of 32 tokens steps past two of the 4 milestones of 16384 tokens: refused at
    submission, naming the numbers, instead of failing inside the Ray job."""
    folded = json.loads(json.dumps(SPEC))
    folded.update(budget_tokens=16384, eval={"milestones": 4, "eval_tokens": 1024})
    folded["search"]["batch_sizes_sequences"] = [4, 256]
    r = post_yaml(client, folded)
    assert r.status_code == 422, r.text
    assert "batch size 256 (8192 tokens per optimizer step) reports at 2 of the 4 milestones" in r.text
    assert fake_ray.submitted == []


def test_staging_over_the_upload_limit_is_422(fake_jobs):
    app = create_app(Settings(api_token=TOKEN, data_dir=str(REPO), upload_max_mb=0.5), jobs=fake_jobs)
    with TestClient(app) as c:
        r = post_yaml(c, SPEC)
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "<root>"


# ---- reading -------------------------------------------------------------------------------------


def test_get_list_logs_report(client, fake_ray, fake_reader, make_run):
    """The reading routes (stopping, which writes to MLflow, is tested on a real store below)."""
    fake_ray.add("s1", "RUNNING")
    fake_ray.logs["s1"] = "line1\nline2\nline3\n"
    fake_reader.parents["s1"] = make_run("p", role="sweep", sweep_id="s1")
    fake_reader.trial_runs["s1"] = [
        make_run("t1", role="trial", sweep_id="s1", metrics={"val_loss": 2.0}, params={"batch_size_sequences": "4"})
    ]
    r = client.get("/v1/sweeps/s1", headers=AUTH)
    assert r.status_code == 200
    b = r.json()
    assert b["id"] == "s1" and b["status"] == "RUNNING"
    assert b["trials"] == {"planned": 2, "done": 0, "running": 1, "failed": 0, "diverged": 0, "pruned": 0, "stopped": 0}
    assert b["best"]["val_loss"] == 2.0 and b["links"]["report"] == "/v1/sweeps/s1/report"

    assert client.get("/v1/sweeps/s1/logs", headers=AUTH).text == "line1\nline2\nline3\n"
    assert client.get("/v1/sweeps/s1/logs", params={"tail": 1}, headers=AUTH).text == "line3\n"
    assert client.get("/v1/sweeps/s1/report", headers=AUTH).status_code == 409

    page = client.get("/v1/sweeps", params={"limit": 1}, headers=AUTH).json()
    assert page["total"] == 1 and page["items"][0]["id"] == "s1" and page["next_offset"] is None

    fake_ray.add("done", "SUCCEEDED")
    fake_reader.parents["done"] = make_run(
        "pd", role="sweep", sweep_id="done", status="FINISHED", tag_status="SUCCEEDED"
    )
    fake_reader.artifacts["pd"] = {"b_crit": 10.0, "s_min": float("nan")}
    rep = client.get("/v1/sweeps/done/report", headers=AUTH)
    assert rep.status_code == 200 and rep.json()["cbs"] == {"b_crit": 10.0, "s_min": None}
    assert rep.json()["mlflow"]["links"]["parent_run"] == "http://mlflow.invalid/#/experiments/1/runs/pd"


def test_delete_closes_the_stopped_sweeps_runs_in_a_real_mlflow_store(fake_ray, mlflow_uri):
    """DELETE stops the job, then the real reader closes the runs it left RUNNING (MLflow is read
    and written for real; only Ray's job server is the in-memory one)."""
    sw = seed_sweep(
        mlflow_uri,
        "s1",
        {"t1": ("RUNNING", "RUNNING", {"val_loss": 2.0}), "t2": ("FINISHED", "COMPLETED", {"val_loss": 2.5})},
    )
    fake_ray.add("s1", "RUNNING", metadata={"critbatch.tracking_uri": mlflow_uri})
    settings = Settings(api_token=TOKEN, tracking_uri=mlflow_uri, data_dir=str(REPO))
    with TestClient(create_app(settings, jobs=SweepJobs("http://ray.invalid", client=fake_ray))) as c:
        live = c.get("/v1/sweeps/s1", headers=AUTH).json()
        assert (live["status"], live["trials"]["running"], live["trials"]["done"], live["mlflow_error"]) == (
            "RUNNING",
            1,
            1,
            None,
        ), live
        r = c.delete("/v1/sweeps/s1", headers=AUTH, params={"wait_s": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["status"], body["stop_sent"], body["mlflow_error"]) == ("STOPPED", True, None), body
        assert (body["trials"]["running"], body["trials"]["stopped"], body["trials"]["done"]) == (0, 1, 1), body
        again = c.delete("/v1/sweeps/s1", headers=AUTH)
        assert again.status_code == 200 and again.json()["stop_sent"] is False
    assert fake_ray.stop_calls == ["s1"]
    t1, t2, p = sw.run("t1"), sw.run("t2"), sw.run()
    assert (t1.info.status, t1.data.tags["critbatch.status"]) == ("KILLED", "STOPPED")
    assert (p.info.status, p.data.tags["critbatch.status"]) == ("KILLED", "STOPPED")
    assert (t2.info.status, t2.data.tags["critbatch.status"]) == ("FINISHED", "COMPLETED")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sweeps/nope",
        "/v1/sweeps/nope/logs",
        "/v1/sweeps/nope/report",
        "/v1/sweeps/..",
        "/v1/sweeps/%2E%2E%2Fapi",
        "/v1/sweeps/a%20b",
    ],
)
def test_unknown_ids_are_404(client, path):
    assert client.get(path, headers=AUTH).status_code == 404


@pytest.mark.parametrize("path", ["/v1/sweeps/nope", "/v1/sweeps/%2E%2E%2Fapi", "/v1/sweeps/a%20b"])
def test_stopping_unknown_ids_is_404_and_stops_nothing(client, fake_ray, path):
    assert client.delete(path, headers=AUTH).status_code == 404
    assert fake_ray.stop_calls == []


def test_cluster_down_is_503_not_500():
    app = create_app(Settings(api_token=TOKEN, ray_address="http://127.0.0.1:9", data_dir=str(REPO)))
    with TestClient(app) as c:
        r = c.get("/v1/sweeps", headers=AUTH)
        assert r.status_code == 503
        assert "127.0.0.1" not in r.text and ":9" not in r.text  # no internal address in an error
        assert c.get("/v1/sweeps/x", headers=AUTH).status_code == 503
        assert post_yaml(c, SPEC).status_code == 503


def test_openapi_schema_is_published_behind_the_token(client):
    r = client.get("/openapi.json", headers=AUTH)
    assert r.status_code == 200
    s = r.json()
    assert set(s["paths"]) == {
        "/healthz",
        "/readyz",
        "/v1/sweeps",
        "/v1/sweeps/{sweep_id}",
        "/v1/sweeps/{sweep_id}/logs",
        "/v1/sweeps/{sweep_id}/report",
    }
    body = s["paths"]["/v1/sweeps"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/SweepSpec"}
    assert "SearchSpec" in s["components"]["schemas"] and "HTTPBearer" in s["components"]["securitySchemes"]
    assert "security" not in s["paths"]["/healthz"]["get"]
    # the id a submission returns links to the other operations (stateful testing follows it)
    links = s["paths"]["/v1/sweeps"]["post"]["responses"]["201"]["links"]
    op_ids = {op["operationId"] for path in s["paths"].values() for op in path.values()}
    assert {link["operationId"] for link in links.values()} <= op_ids and len(links) == 4


def test_the_reports_cbs_schema_names_the_fields_of_cbs_json(client):
    """The report's ``cbs`` is described field by field (the records' dump-the-given-keys serializer must not
    turn their response schemas into empty ones)."""
    schemas = client.get("/openapi.json", headers=AUTH).json()["components"]["schemas"]
    report = schemas["ReportOut"]["properties"]["cbs"]
    assert {"$ref": "#/components/schemas/CbsResult"} in report["anyOf"]
    cbs = schemas["CbsResult"]["properties"]
    assert {"b_crit", "b_crit_ci", "status", "targets", "per_batch", "local_cbs", "headline"} <= set(cbs)
    assert all(schemas[name].get("properties") for name in ("TargetFit", "BatchRecord", "LocalCbsPoint"))
