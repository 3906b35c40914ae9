"""What a client may point the service at: tracking URI, storage path, data
paths, reading MLflow without creating stores, and what staging ships.

In-process app with the in-memory Ray job server; the MLflow side is real where it matters (a real
MLflow SQLite store, a loopback HTTP listener standing in for a hostile tracking server).
"""

from __future__ import annotations

import http.server
import sqlite3
import threading
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from svc_fakes import tiny_spec

from service.app import create_app
from service.settings import Settings
from sweeps.errors import InvalidInput
from sweeps.remote import (
    StagingError,
    StagingLimits,
    StoreRefused,
    SweepJobs,
    check_existing_store,
    shippable_files,
    stage_sweep,
)
from sweeps.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
TOKEN = "unit-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}
ML = "http://mlflow.invalid"


spec = tiny_spec


class Listener:
    """A loopback HTTP server that records every request (and answers 500 with a marker body)."""

    BODY = b"INTERNAL-JOB-LIST-secret-marker"

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.requests.append((self.path, dict(self.headers)))
                self.send_response(500)
                self.send_header("Content-Length", str(len(outer.BODY)))
                self.end_headers()
                self.wfile.write(outer.BODY)

            do_GET = do_POST = _any

            def log_message(self, *a) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener():
    ls = Listener()
    yield ls
    ls.close()


def app_client(fake_jobs, **settings):
    s = Settings(
        api_token=TOKEN,
        tracking_uri=settings.pop("tracking_uri", ML),
        data_dir=settings.pop("data_dir", str(REPO)),
        **settings,
    )
    return TestClient(create_app(s, jobs=fake_jobs))


def post(c, d, **params):
    return c.post("/v1/sweeps", content=yaml.safe_dump(d), headers=AUTH, params=params)


def paths(r) -> list[str]:
    return [e["path"] for e in r.json()["errors"]]


# ---- tracking.uri -------------------------------------------------------------------------------


def test_a_spec_naming_another_tracking_uri_is_refused_and_never_contacted(fake_jobs, fake_ray, listener, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "service-secret-token")
    with app_client(fake_jobs) as c:
        r = post(c, spec(tracking={"uri": listener.url}))
        assert r.status_code == 422 and paths(r) == ["tracking.uri"], r.text
        assert listener.url not in r.text
        # the service's own URI is fine (and so is none)
        assert post(c, spec(tracking={"uri": ML + "/"}), sweep_id="own").status_code == 201
    assert listener.requests == [] and [s["submission_id"] for s in fake_ray.submitted] == ["own"]


def test_the_service_never_reads_a_tracking_uri_recorded_by_another_submitter(fake_ray, listener, monkeypatch):
    """A job submitted with the CLI records its own URI; the service does not call it (with its token)."""
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "service-secret-token")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    fake_ray.add("other", "SUCCEEDED", metadata={"critbatch.tracking_uri": listener.url})
    jobs = SweepJobs("http://ray.invalid:8265", client=fake_ray)  # the real MLflow reader
    with app_client(jobs) as c:
        body = c.get("/v1/sweeps/other", headers=AUTH).json()
        assert body["status"] == "SUCCEEDED" and body["trials"] is None
        assert body["mlflow_error"] == "the sweep logs to a tracking URI that this service does not read"
        assert c.get("/v1/sweeps/other/report", headers=AUTH).status_code == 409
    assert listener.requests == []


def test_mlflow_errors_quote_neither_the_answer_nor_the_address(fake_ray, listener, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    fake_ray.add("s1", "RUNNING", metadata={"critbatch.tracking_uri": listener.url})
    jobs = SweepJobs("http://ray.invalid:8265", client=fake_ray)
    with app_client(jobs, tracking_uri=listener.url) as c:
        body = c.get("/v1/sweeps/s1", headers=AUTH).json()
    assert listener.requests and all(path.startswith("/api/2.0/mlflow/") for path, _ in listener.requests), (
        listener.requests
    )  # the service's own server is read, through MLflow's REST API
    err = body["mlflow_error"]
    assert err and "secret-marker" not in err and "127.0.0.1" not in err, err
    assert err.startswith("MLflow could not be read (")


# ---- storage_path --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["/etc/critbatch", "s3://cluster-bucket/x", "/srv/cb/../etc", "relative/dir"])
def test_storage_path_outside_the_service_root_is_refused(fake_jobs, fake_ray, value):
    with app_client(fake_jobs, storage_root="/srv/cb") as c:
        r = post(c, spec(resources={"storage_path": value}))
    assert r.status_code == 422 and paths(r) == ["resources.storage_path"], r.text
    assert fake_ray.submitted == []


def test_storage_path_is_refused_without_a_service_root_and_jobs_use_the_root(fake_jobs, fake_ray):
    with app_client(fake_jobs) as c:
        r = post(c, spec(resources={"storage_path": "/srv/cb/mine"}))
        assert r.status_code == 422 and paths(r) == ["resources.storage_path"]
    with app_client(fake_jobs, storage_root="s3://team-bucket/critbatch") as c:
        assert (
            post(c, spec(resources={"storage_path": "s3://team-bucket/critbatch/a"}), sweep_id="a").status_code == 201
        )
        assert post(c, spec(), sweep_id="b").status_code == 201
    env = [s["runtime_env"]["env_vars"] for s in fake_ray.submitted]
    assert [e.get("CRITBATCH_STORAGE_PATH") for e in env] == ["s3://team-bucket/critbatch"] * 2


# ---- data paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("data.path", "file:///etc/passwd"),
        ("data.path", "s3://bucket/corpus.txt"),
        ("data.path", "/etc/passwd"),
        ("data.path", "../outside.txt"),
        ("data.path", "data/../../outside.txt"),
        ("data.path", "data/no-such-file.txt"),
        ("data.tokenizer", "/root/tok"),
        ("data.tokenizer", "file:///root/tok"),
    ],
)
def test_input_paths_outside_the_data_roots_are_refused(fake_jobs, fake_ray, field, value):
    section, key = field.split(".")
    with app_client(fake_jobs, cluster_data_dir="/data") as c:
        r = post(c, spec(**{section: {key: value}}))
    assert r.status_code == 422 and paths(r) == [field], r.text
    assert "/work" not in r.text and str(REPO) not in r.text  # the data root itself is not named
    assert fake_ray.submitted == []


def test_absolute_paths_inside_the_cluster_data_root_are_passed_on(fake_jobs, fake_ray):
    with app_client(fake_jobs, cluster_data_dir="/data") as c:
        r = post(c, spec(data={"path": "/data/corpus/big.txt"}))
    assert r.status_code == 201, r.text
    sub = fake_ray.submitted[0]
    assert not any(f.startswith("inputs/") for f in sub["files"])
    assert "/data/corpus/big.txt" not in sub["entrypoint"]  # the path travels in spec.yaml only


def test_a_link_out_of_the_data_root_is_refused(fake_jobs, fake_ray, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").symlink_to("/etc/hostname")
    with app_client(fake_jobs, data_dir=str(tmp_path)) as c:
        r = post(c, spec(data={"path": "data/corpus.txt"}))
    assert r.status_code == 422 and paths(r) == ["data.path"]


def test_the_service_without_a_data_root_ships_nothing_and_says_so(fake_jobs, fake_ray):
    with TestClient(create_app(Settings(api_token=TOKEN, tracking_uri=ML), jobs=fake_jobs)) as c:
        r = post(c, spec())
    assert r.status_code == 422 and paths(r) == ["data.path"] and "CRITBATCH_DATA_DIR" in r.text


# ---- reading never creates or migrates a store ------------------------------------------------------


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_spec_sqlite_uri_is_refused_by_a_service_without_tracking_uri(fake_jobs, fake_ray, tmp_path):
    db = tmp_path / "any.db"
    with TestClient(create_app(Settings(api_token=TOKEN, data_dir=str(REPO)), jobs=fake_jobs)) as c:
        r = post(c, spec(tracking={"uri": f"sqlite:///{db}"}))
    assert r.status_code == 422 and paths(r) == ["tracking.uri"]
    assert not db.exists()


def test_the_reader_creates_no_database_and_migrates_none(tmp_path, fake_ray):
    missing = tmp_path / "missing.db"
    with pytest.raises(StoreRefused):
        check_existing_store(f"sqlite:///{missing}")
    assert not missing.exists()
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(StoreRefused):
        check_existing_store(f"sqlite:///{foreign}")
    assert _tables(foreign) == {"invoices"}
    # through a reader (the CLI's: any recorded URI), a status read leaves the foreign database alone
    fake_ray.add("s1", "SUCCEEDED", metadata={"critbatch.tracking_uri": f"sqlite:///{foreign}"})
    state = SweepJobs("http://ray.invalid", client=fake_ray).get("s1")
    assert state.mlflow_error and state.trials is None
    assert _tables(foreign) == {"invoices"}
    with pytest.raises(StoreRefused):
        check_existing_store(str(tmp_path / "no-mlruns"))
    assert not (tmp_path / "no-mlruns").exists()


def test_the_reader_opens_a_real_mlflow_store_without_writing_to_it(mlflow_uri):
    db = Path(mlflow_uri[len("sqlite:///") :])
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    check_existing_store(mlflow_uri)  # no error
    from sweeps.tracking.reader import MlflowReader

    assert MlflowReader(mlflow_uri).experiment_ids(None) == ["0"]  # the store's default experiment, read back
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before


# ---- what staging ships ----------------------------------------------------------------------------


def _tokenizer_dir(root: Path) -> Path:
    tok = root / "tok"
    (tok / ".git").mkdir(parents=True)
    (tok / ".git" / "config").write_text("[remote] url = https://user:pw@example.com/x\n")
    (tok / ".git" / "pack").write_bytes(b"x" * (3 * 1024 * 1024))
    (tok / ".venv" / "lib").mkdir(parents=True)
    (tok / ".venv" / "lib" / "x.py").write_text("x")
    (tok / "__pycache__").mkdir()
    (tok / "__pycache__" / "a.pyc").write_bytes(b"c")
    (tok / ".env").write_text("SECRET=1")
    (tok / "tokenizer.json").write_text("{}")
    (tok / "sub").mkdir()
    (tok / "sub" / "vocab.txt").write_text("a b")
    (tok / "inside-link.json").symlink_to(tok / "tokenizer.json")
    (tok / "outside-link").symlink_to("/etc/hostname")
    (tok / "dir-link").symlink_to("/etc")
    return tok


def test_staging_ships_no_dotfiles_caches_or_links_out(tmp_path):
    tok = _tokenizer_dir(tmp_path)
    assert sorted(str(rel) for _src, rel in shippable_files(tok)) == [
        "inside-link.json",
        "sub/vocab.txt",
        "tokenizer.json",
    ]
    into = tmp_path / "stage"
    into.mkdir()
    s = parse_spec(spec(data={"path": str(REPO / "data/tinyshakespeare/input.txt"), "tokenizer": str(tok)}))
    # 1 MB limit: the 3 MB .git pack is not shipped, so it does not count
    staged = stage_sweep(s, into, limits=StagingLimits(ship_data_max_bytes=2 * 1024 * 1024))
    files = sorted(str(p.relative_to(into)) for p in into.rglob("*") if p.is_file() or p.is_symlink())
    shipped_tok = [f for f in files if f.startswith("inputs/tokenizer/")]
    assert shipped_tok == [
        "inputs/tokenizer/inside-link.json",
        "inputs/tokenizer/sub/vocab.txt",
        "inputs/tokenizer/tokenizer.json",
    ]
    assert not any("/." in f or f.startswith(".") or "__pycache__" in f for f in files), files
    assert not any(p.is_symlink() for p in into.rglob("*"))
    assert ("data.tokenizer", str(tok)) in staged.shipped


def test_a_dotfile_input_is_never_shipped(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("x")
    s = parse_spec(spec(data={"path": ".git/config"}))
    into = tmp_path / "stage"
    into.mkdir()
    with pytest.raises(StagingError) as e:
        stage_sweep(s, into, base_dir=tmp_path)
    assert e.value.path == "data.path"


def test_the_repo_as_data_root_ships_only_the_corpus(fake_jobs, fake_ray):
    """docs/service.md's setting (CRITBATCH_DATA_DIR=the repo): the job gets the corpus and nothing hidden."""
    with app_client(fake_jobs) as c:
        assert post(c, spec()).status_code == 201
    files = fake_ray.submitted[0]["files"]
    assert [f for f in files if f.startswith("inputs/")] == ["inputs/data/input.txt"]
    assert not any(part.startswith(".") for f in files for part in Path(f).parts), files


_NO_SHORTHAND = {"family": None, "d_model": None, "n_layers": None, "n_heads": None}


@pytest.mark.parametrize("value", ["/root/config.json", "../config.json", "s3://bucket/config.json"])
def test_a_model_hf_config_path_outside_the_data_roots_is_refused(fake_jobs, fake_ray, value):
    with app_client(fake_jobs, cluster_data_dir="/data") as c:
        r = post(c, spec(model={**_NO_SHORTHAND, "hf_config": value}))
    assert r.status_code == 422 and paths(r) == ["model.hf_config"], r.text
    assert fake_ray.submitted == []


def test_an_inline_model_hf_config_names_no_file(fake_jobs, fake_ray):
    gqa = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
    with app_client(fake_jobs, cluster_data_dir="/data") as c:
        r = post(c, spec(model={**_NO_SHORTHAND, "hf_config": gqa}))
    assert r.status_code == 201, r.text


def test_a_comparison_is_refused_by_the_service_and_by_job_staging(fake_jobs, fake_ray, tmp_path):
    """An arm may name its own data or storage, which the service's location checks of one sweep would not see."""
    d = spec(arms=[{"name": "a"}, {"name": "b", "data": {"path": "/etc/passwd"}}])
    with app_client(fake_jobs) as c:
        r = post(c, d)
    assert r.status_code == 422 and "arms" in paths(r), r.text
    assert fake_ray.submitted == []
    ok = spec(arms=[{"name": "a"}, {"name": "b", "search": {"lr_rules": ["linear"]}}])
    into = tmp_path / "stage"
    into.mkdir()
    with pytest.raises(InvalidInput, match="comparison"):
        stage_sweep(parse_spec(ok), into, base_dir=REPO)
    assert not any(into.iterdir())


def _data_root(root: Path) -> None:
    """A service data root holding the tiny spec's corpus (``data.path``, relative), as the repo does."""
    corpus = root / tiny_spec()["data"]["path"]
    corpus.parent.mkdir(parents=True)
    corpus.write_text("To be, or not to be, that is the question.\n" * 100)


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "is not JSON"),
        ('["a list"]', "is not a transformers config"),
        ('{"hidden_size": 32}', "is not a transformers config"),
    ],
)
def test_a_model_hf_config_file_that_does_not_parse_is_422_naming_it(fake_jobs, fake_ray, tmp_path, content, needle):
    """The config.json is read at submission, as the job would read it: a broken one was accepted (201) and the job
    failed half a minute later on the cluster."""
    _data_root(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "broken.json").write_text(content)
    with app_client(fake_jobs, data_dir=str(tmp_path)) as c:
        r = post(c, spec(model={**_NO_SHORTHAND, "hf_config": "models/broken.json"}))
    assert r.status_code == 422, r.text
    assert paths(r) == ["model.hf_config"] and r.json()["detail"] == "an input of the submission is refused", r.text
    message = r.json()["errors"][0]["message"]
    assert "models/broken.json" in message and needle in message, message
    assert fake_ray.submitted == []


def test_a_model_hf_config_folder_is_read_through_its_config_json(fake_jobs, fake_ray, tmp_path):
    _data_root(tmp_path)
    (tmp_path / "gqa").mkdir()
    (tmp_path / "gqa" / "config.json").write_text("{")
    with app_client(fake_jobs, data_dir=str(tmp_path)) as c:
        r = post(c, spec(model={**_NO_SHORTHAND, "hf_config": "gqa"}))
    assert r.status_code == 422 and paths(r) == ["model.hf_config"], r.text
    assert "gqa/config.json" in r.json()["errors"][0]["message"]
    (tmp_path / "gqa" / "config.json").write_text('{"model_type": "llama", "num_key_value_heads": 2}')
    with app_client(fake_jobs, data_dir=str(tmp_path)) as c:
        r = post(c, spec(model={**_NO_SHORTHAND, "hf_config": "gqa"}))
    assert r.status_code == 201, r.text
    assert "inputs/model/gqa/config.json" in fake_ray.submitted[0]["files"]
