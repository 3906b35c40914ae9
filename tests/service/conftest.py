"""Fixtures for the service tests.

Fakes (no cluster): an in-memory Ray job server and MLflow reader behind the real ``SweepJobs``.

Real processes (session-scoped, started only by the tests that ask for them, stopped at the end):
a Ray head (``ray start --head --block``, every port chosen free, token auth off with
``RAY_AUTH_MODE=disabled`` so a token left in ``~/.ray`` by another test cannot switch it on), an
``mlflow server`` (SQLite backend, served artifacts) and the REST service (``critbatch serve``).
Each runs in its own process group, which teardown signals; nothing else is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from svc_fakes import FakeReader, FakeRayJobs, fake_run

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not up after {timeout_s} s:\n{log.read_text()[-4000:]}")


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


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop a process we started in its own session, then anything left in its process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI", "CRITBATCH_API_TOKEN"):
        env.pop(k, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _start(cmd: list[str], tmp: Path, name: str, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    return proc, log


#: Ray Tune's date_str() in every process of the test cluster (tests/service/pin_date): every sweep
#: on it "starts in the same second", the case where Ray's staging folders of two sweeps meet.
PINNED_DATE = "2026-01-01_00-00-00"


def pinned_date_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Ray Tune's start second pinned to :data:`PINNED_DATE` (tests/service/pin_date)."""
    pin_dir = str(Path(__file__).resolve().parent / "pin_date")
    return dict(env, CRITBATCH_TEST_PIN_DATE=PINNED_DATE,
                PYTHONPATH=os.pathsep.join(p for p in (pin_dir, env.get("PYTHONPATH")) if p))


def _start_ray(tmp: Path, attempts: int = 3) -> tuple[subprocess.Popen, str, str]:
    """``ray start --head --block`` on free ports (worker ports chosen by the OS, so none in Ray's
    default 10002-19999); retried because Ray gives a head node 30 s (hard-coded) to register,
    which a loaded 2-core machine can miss. Returns the process, the job server URL and the GCS
    address (``127.0.0.1:PORT``, for ``critbatch run --address``)."""
    for attempt in range(attempts):
        dash = free_port()
        gcs = free_port()
        cmd = [
            str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus=2", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={tmp}",
            f"--port={gcs}", f"--dashboard-port={dash}", f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}",
            f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            "--min-worker-port=0", "--max-worker-port=0",
        ]
        proc, log = _start(cmd, tmp, f"ray-start-{attempt}", pinned_date_env(base_env()))
        url = f"http://127.0.0.1:{dash}"
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline and "block forever" not in log.read_text():
            time.sleep(0.5)
        if proc.poll() is None and "block forever" in log.read_text():
            _wait_http(f"{url}/api/version", 120, proc, log)
            _wait_http(f"{url}/api/jobs/", 60, proc, log)
            return proc, url, f"127.0.0.1:{gcs}"
        _stop_group(proc, grace_s=5)
    raise RuntimeError(f"ray start failed {attempts} times:\n{log.read_text()[-4000:]}")


_RAY_TMP: list[Path] = []


@pytest.fixture(scope="session")
def backends() -> Iterator[tuple[str, str, str]]:
    """An ``mlflow server`` and a local Ray head (2 CPUs, Tune's start second pinned: see
    :func:`pinned_date_env`), started side by side; yields ``(ray job server URL, MLflow URL,
    GCS address)``. (Both at once can starve Ray's head of the 30 s it gets
    to register: ``_start_ray`` retries.)
    Set ``CRITBATCH_KEEP_TEST_LOGS=1`` to keep their folders (logs) after the session.
    """
    ray_tmp = Path(tempfile.mkdtemp(prefix="cbray", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    _RAY_TMP[:] = [ray_tmp]
    ml_tmp = Path(tempfile.mkdtemp(prefix="cbmlflow"))
    ml_port = free_port()
    ml_cmd = [
        str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{ml_tmp}/mlflow.db",
        "--serve-artifacts", "--artifacts-destination", str(ml_tmp / "artifacts"),
        "--host", "127.0.0.1", "--port", str(ml_port), "--workers", "1",
    ]
    # MLflow's job-execution backend (GenAI jobs) is not used here and slows the start.
    ml_env = dict(base_env(), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    ray_proc = ml_proc = None
    ml_url = f"http://127.0.0.1:{ml_port}"
    try:
        ml_proc, ml_log = _start(ml_cmd, ml_tmp, "mlflow", ml_env)  # the slow one (~45 s idle): first
        ray_proc, ray_url, gcs = _start_ray(ray_tmp)
        _wait_http(f"{ml_url}/health", 300, ml_proc, ml_log)
        yield ray_url, ml_url, gcs
    finally:
        if ml_proc is not None:
            _stop_group(ml_proc, grace_s=5)
        if ray_proc is not None:
            _stop_group(ray_proc, grace_s=10)
        if os.environ.get("CRITBATCH_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(ray_tmp, ignore_errors=True)
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
def ray_temp_dir(backends: tuple[str, str, str]) -> Path:
    """The test Ray head's ``--temp-dir`` (its sessions' staging folders are under ``session_*/artifacts``)."""
    return _RAY_TMP[0]


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
            [sys.executable, "-m", "sweeps.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/healthz", 60, proc, log)
        _wait_ready(url, 60, proc, log)
        yield url
    finally:
        _stop_group(proc, grace_s=10)
        if os.environ.get("CRITBATCH_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(tmp, ignore_errors=True)
