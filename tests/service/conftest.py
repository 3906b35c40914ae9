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
    from sweeps.jobs import SweepJobs

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


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A local Ray head with 2 CPUs; yields its job server URL (``http://127.0.0.1:PORT``)."""
    tmp = Path(tempfile.mkdtemp(prefix="cbray", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    dash = free_port()
    cmd = [
        str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus=2", "--disable-usage-stats",
        "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={tmp}",
        f"--port={free_port()}", f"--dashboard-port={dash}", f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}",
        f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
        "--min-worker-port=0", "--max-worker-port=0",
    ]
    log = tmp / "ray-start.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=base_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    url = f"http://127.0.0.1:{dash}"
    try:
        _wait_http(f"{url}/api/version", 120, proc, log)
        _wait_http(f"{url}/api/jobs/", 60, proc, log)
        yield url
    finally:
        _stop_group(proc, grace_s=30)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_server() -> Iterator[str]:
    """A real ``mlflow server`` (SQLite backend, served artifacts) on loopback; yields its URL."""
    tmp = Path(tempfile.mkdtemp(prefix="cbmlflow"))
    port = free_port()
    cmd = [
        str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
        "--serve-artifacts", "--artifacts-destination", str(tmp / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]
    log = tmp / "mlflow.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=base_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/health", 120, proc, log)
        yield url
    finally:
        _stop_group(proc, grace_s=15)
        shutil.rmtree(tmp, ignore_errors=True)


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
        yield url
    finally:
        _stop_group(proc, grace_s=10)
        shutil.rmtree(tmp, ignore_errors=True)
