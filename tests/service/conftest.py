"""Fixtures for the service tests.

Fakes (no cluster): an in-memory Ray job server and MLflow reader behind the real ``SweepJobs``.

Real processes (session-scoped, started only by the tests that ask for them, stopped at the end):
the suite's Ray head (``tests/conftest.py::ray_head``, token auth off with ``RAY_AUTH_MODE=disabled``
so a token left in ``~/.ray`` by another test cannot switch it on), an ``mlflow server`` (SQLite
backend, served artifacts) and the REST service (``critbatch serve``).
Each runs in its own process group, which teardown signals; nothing else is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import base_env, free_port, start_group, stop_group, wait_http
from svc_fakes import FakeRayJobs, FakeReader, fake_run

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TOKEN = "test-token-0123456789abcdef"


# ---- fakes (defined in svc_fakes.py) -----------------------------------------------------------


@pytest.fixture
def make_run():
    """``fake_run``: an MLflow-run-like object (import-free, so test modules need not import conftest)."""
    return fake_run


@pytest.fixture
def fake_ray() -> FakeRayJobs:
    return FakeRayJobs()


@pytest.fixture
def fake_reader() -> FakeReader:
    return FakeReader()


@pytest.fixture
def fake_jobs(fake_ray: FakeRayJobs, fake_reader: FakeReader):
    from sweeps.remote import SweepJobs

    return SweepJobs("http://ray.invalid:8265", client=fake_ray, reader_factory=fake_reader)


# ---- real processes --------------------------------------------------------------------------------


def _wait_ready(url: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    """Wait until the service reaches the Ray cluster (``GET /v1/sweeps`` answers 200)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"{url}/v1/sweeps", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
            if last.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"service at {url} not ready: {last and last.text}\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def backends(ray_head, mlflow_template: Path) -> Iterator[tuple[str, str, str]]:
    """An ``mlflow server`` (SQLite, a copy of the suite's migrated template store, served
    artifacts) beside the suite's Ray head (``tests/conftest.py::ray_head``: Tune's start second
    pinned, see :func:`harness.pinned_date_env`); yields ``(ray job server URL, MLflow URL, GCS
    address)``. Set ``CRITBATCH_KEEP_TEST_LOGS=1`` to keep the server's folder (logs).
    """
    ml_tmp = Path(tempfile.mkdtemp(prefix="cbmlflow"))
    db = ml_tmp / "mlflow.db"
    shutil.copyfile(mlflow_template, db)
    ml_port = free_port()
    ml_cmd = [
        str(VENV_BIN / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{db}",
        "--serve-artifacts",
        "--artifacts-destination",
        str(ml_tmp / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(ml_port),
        "--workers",
        "1",
    ]
    # MLflow's job-execution backend (GenAI jobs) is not used here and slows the start.
    ml_env = dict(base_env(), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    ml_proc = None
    ml_url = f"http://127.0.0.1:{ml_port}"
    try:
        ml_log = ml_tmp / "mlflow.log"
        ml_proc = start_group(ml_cmd, ml_log, ml_env, ml_tmp)
        wait_http(f"{ml_url}/health", 300, ml_proc, ml_log)
        yield ray_head.dashboard_url, ml_url, ray_head.gcs_address
    finally:
        if ml_proc is not None:
            stop_group(ml_proc, grace_s=5)
        if os.environ.get("CRITBATCH_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(ml_tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster(backends: tuple[str, str, str]) -> str:
    """The test Ray cluster's job server URL (``http://127.0.0.1:PORT``)."""
    return backends[0]


@pytest.fixture(scope="session")
def mlflow_server(backends: tuple[str, str, str]) -> str:
    """The test ``mlflow server`` (SQLite backend, served artifacts) URL."""
    return backends[1]


@pytest.fixture(scope="session")
def ray_gcs_address(backends: tuple[str, str, str]) -> str:
    """The test Ray cluster's GCS address (``127.0.0.1:PORT``), for ``critbatch run --address``."""
    return backends[2]


@pytest.fixture(scope="session")
def ray_temp_dir(ray_head) -> Path:
    """The test Ray head's ``--temp-dir`` (its sessions' staging folders are under ``session_*/artifacts``)."""
    return ray_head.temp_dir


@pytest.fixture(scope="session")
def cluster_env(ray_cluster: str, mlflow_server: str) -> dict[str, str]:
    """Environment for CLI processes talking to the test cluster and MLflow server."""
    env = base_env()
    env["RAY_ADDRESS"] = ray_cluster
    env["MLFLOW_TRACKING_URI"] = mlflow_server
    return env


@pytest.fixture(scope="session")
def service_url(cluster_env: dict[str, str]) -> Iterator[str]:
    """``critbatch serve`` on loopback against the test cluster, with a token; yields its URL."""
    tmp = Path(tempfile.mkdtemp(prefix="cbsvc"))
    port = free_port()
    env = dict(cluster_env, CRITBATCH_API_TOKEN=TOKEN, CRITBATCH_DATA_DIR=str(REPO))
    log = tmp / "service.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "critbatch", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", 60, proc, log)
        _wait_ready(url, 60, proc, log)
        yield url
    finally:
        stop_group(proc, grace_s=10)
        if os.environ.get("CRITBATCH_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(tmp, ignore_errors=True)
