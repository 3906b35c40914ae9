"""The sweeps' Optuna studies outlive a RayJob's cluster: a PostgreSQL database of their own on the platform's
StatefulSet (its volume a PersistentVolumeClaim), named by the URL in Secret ``critbatch-optuna``, set up by the
``critbatch-optuna-db-setup`` Job, reached with the driver the ``critbatch`` image carries."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from urllib.parse import urlsplit

import pytest
from k8s_fixtures import K8S, ROOT, render

from sweeps.remote.k8s_platform import OPTUNA_STORAGE_SECRET

PLATFORM = "overlays/example"
SECRETS = K8S / "overlays" / "example" / "secrets"


def _by(objs, kind, name):
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _env_file(name: str) -> dict[str, str]:
    lines = (SECRETS / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _example_url() -> str:
    return _env_file("optuna")[OPTUNA_STORAGE_SECRET.key]


def _setup_job():
    return _by(render(PLATFORM), "Job", "critbatch-optuna-db-setup")


def test_the_studies_live_in_the_statefulset_that_keeps_its_volume():
    objs = render(PLATFORM)
    postgres = _by(objs, "StatefulSet", "critbatch-postgres")
    (claim,) = postgres["spec"]["volumeClaimTemplates"]
    (c,) = postgres["spec"]["template"]["spec"]["containers"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/postgresql/data"} in c["volumeMounts"]
    url = urlsplit(_example_url())
    service = _by(objs, "Service", url.hostname)
    assert service["spec"]["selector"].items() <= postgres["spec"]["template"]["metadata"]["labels"].items()
    assert url.port == service["spec"]["ports"][0]["port"]
    # a user and a database of their own: MLflow's superuser keeps its password, and both keep an alembic_version
    mlflow = _env_file("postgres")
    assert url.username != mlflow["POSTGRES_USER"] and url.path.lstrip("/") != mlflow["POSTGRES_DB"]


def test_the_secret_holds_the_url_under_the_key_the_renderer_names():
    base = _by(render("base"), "Secret", OPTUNA_STORAGE_SECRET.name)
    assert base["metadata"]["annotations"]["critbatch.io/required-keys"] == OPTUNA_STORAGE_SECRET.key
    assert not base.get("data")  # the overlay fills it
    assert set(_by(render(PLATFORM), "Secret", OPTUNA_STORAGE_SECRET.name)["data"]) == {OPTUNA_STORAGE_SECRET.key}


def test_the_image_has_the_driver_the_url_names():
    """The driver runs in the critbatch image: the URL's SQLAlchemy dialect must be installed there."""
    driver = urlsplit(_example_url()).scheme.partition("+")[2]
    assert driver == "psycopg2"
    dockerfile = (ROOT / "Dockerfile").read_text()
    critbatch_stage = dockerfile[dockerfile.index("AS critbatch") :]
    (install,) = re.findall(
        r'^RUN pip install -c constraints\.txt "\.\[sweep,service\]" (.*)$', critbatch_stage, flags=re.MULTILINE
    )
    assert '"psycopg2-binary>=2.9,<3"' in install
    assert "import torch, ray, mlflow, optuna, psycopg2" in critbatch_stage  # the build fails without it


def test_the_setup_job_reads_the_admin_and_the_optuna_secrets_and_runs_restricted():
    pod = _setup_job()["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert refs["OPTUNA_STORAGE_URL"] == {"name": OPTUNA_STORAGE_SECRET.name, "key": OPTUNA_STORAGE_SECRET.key}
    assert refs["PGPASSWORD"] == {"name": "critbatch-postgres", "key": "POSTGRES_PASSWORD"}
    postgres = _by(render(PLATFORM), "StatefulSet", "critbatch-postgres")["spec"]["template"]["spec"]
    assert c["image"] == postgres["containers"][0]["image"]  # its psql, no other image to pull
    assert pod["restartPolicy"] == "OnFailure"  # until PostgreSQL answers


# ---- the setup script, with psql replaced by a recorder ---------------------------------------------------


@pytest.fixture
def run_setup(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    record = tmp_path / "psql.log"
    fake = tmp_path / "bin" / "psql"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\necho --- >> {record}\ncat >> {record}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (c,) = _setup_job()["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["/bin/bash", "-c"]

    def run(url: str) -> tuple[int, str, str | None]:
        env = {
            "PATH": f"{fake.parent}:{os.environ['PATH']}",
            "POSTGRES_USER": "mlflow",
            "POSTGRES_DB": "mlflow",
            "PGPASSWORD": "admin",
            "OPTUNA_STORAGE_URL": url,
        }
        record.unlink(missing_ok=True)
        proc = subprocess.run(["bash", "-c", c["command"][2]], env=env, capture_output=True, text=True, timeout=30)
        return proc.returncode, proc.stdout + proc.stderr, record.read_text() if record.exists() else None

    return run


def test_setup_creates_the_role_and_database_of_the_url_idempotently(run_setup):
    rc, out, psql = run_setup(_example_url())
    assert rc == 0, out
    args, _, sql = psql.partition("---\n")
    assert args.split("\n")[:8] == ["-v", "ON_ERROR_STOP=1", "-h", "critbatch-postgres", "-U", "mlflow", "-d", "mlflow"]
    assert {"user=optuna", "password=example-optuna-password", "db=optuna"} <= set(args.split("\n"))
    # names and password go in as psql variables, quoted by psql: no SQL is pasted together from the URL
    assert "CREATE ROLE %I LOGIN" in sql and "WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'user')" in sql
    assert "ALTER ROLE :\"user\" WITH LOGIN PASSWORD :'password';" in sql
    assert "CREATE DATABASE %I OWNER %I" in sql and "WHERE NOT EXISTS (SELECT FROM pg_database" in sql
    assert "optuna" not in sql


@pytest.mark.parametrize(
    ("url", "rc", "says"),
    [
        ("postgresql+psycopg2://mlflow:pw@critbatch-postgres:5432/optuna", 1, "not MLflow's"),
        ("postgresql+psycopg2://optuna:pw@critbatch-postgres:5432/mlflow", 1, "not MLflow's"),
        ("postgresql+psycopg2://optuna:a%40b@critbatch-postgres:5432/optuna", 1, "%-escapes"),
        ("sqlite:////tmp/optuna.db", 1, "not postgresql+psycopg2://"),
        ("postgresql+psycopg2://optuna:pw@db.example.com:5432/optuna", 0, "nothing to set up"),
    ],
)
def test_setup_refuses_mlflows_names_and_leaves_other_servers_alone(run_setup, url, rc, says):
    code, out, psql = run_setup(url)
    assert code == rc and says in out
    assert psql is None  # PostgreSQL was not touched


def test_the_services_long_lived_head_keeps_its_studies_in_the_same_rdb_as_the_rayjobs():
    """The REST service's sweeps run their driver on the platform's RayCluster head: a job Ray Jobs restarts, or a
    replaced head pod, must find the studies where a RayJob's retry does (not in sqlite on the pod's disk)."""
    from sweeps.remote.k8s_platform import OPTUNA_STORAGE_ENV

    cluster = next(o for o in render("base") if o["kind"] == "RayCluster")
    (head,) = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    (env,) = [e for e in head["env"] if e["name"] == OPTUNA_STORAGE_ENV]
    ref = env["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (OPTUNA_STORAGE_SECRET.name, OPTUNA_STORAGE_SECRET.key)
