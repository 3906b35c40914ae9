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
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TOKEN = "test-token-0123456789abcdef"


# ---- fakes ---------------------------------------------------------------------------------------


class FakeRayJobs:
    """The subset of ``JobSubmissionClient`` that ``SweepJobs`` uses, in memory."""

    def __init__(self) -> None:
        from ray.job_submission import JobStatus

        self.JobStatus = JobStatus
        self.jobs: dict[str, SimpleNamespace] = {}
        self.submitted: list[dict[str, Any]] = []
        self.logs: dict[str, str] = {}
        self.stop_calls: list[str] = []
        self.clock = 1_700_000_000_000

    def add(self, sweep_id: str, status: str = "RUNNING", *, metadata: dict[str, str] | None = None,
            message: str | None = None, exit_code: int | None = None) -> SimpleNamespace:
        self.clock += 1000
        md = {"critbatch.sweep_id": sweep_id, "critbatch.name": sweep_id, "critbatch.experiment": "exp",
              "critbatch.tracking_uri": "http://mlflow.invalid", "critbatch.trials_planned": "2",
              "critbatch.fingerprint": "f" * 10}
        md.update(metadata or {})
        job = SimpleNamespace(
            submission_id=sweep_id, status=self.JobStatus(status), metadata=md, message=message,
            start_time=self.clock, end_time=None, driver_exit_code=exit_code, entrypoint="",
        )
        self.jobs[sweep_id] = job
        return job

    def _missing(self, job_id: str) -> RuntimeError:
        return RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")

    def get_job_info(self, job_id: str) -> SimpleNamespace:
        if job_id not in self.jobs:
            raise self._missing(job_id)
        return self.jobs[job_id]

    def submit_job(self, *, entrypoint: str, submission_id: str, runtime_env: dict, metadata: dict) -> str:
        if submission_id in self.jobs:
            raise RuntimeError(f"Request failed with status code 500: Job with submission_id {submission_id} already exists.")
        self.submitted.append(dict(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                                   metadata=metadata, files=sorted(
                                       str(p.relative_to(runtime_env["working_dir"]))
                                       for p in Path(runtime_env["working_dir"]).rglob("*") if p.is_file())))
        job = self.add(submission_id, "PENDING", metadata=metadata)
        job.entrypoint = entrypoint
        return submission_id

    def list_jobs(self) -> list[SimpleNamespace]:
        return list(self.jobs.values()) + [
            SimpleNamespace(submission_id="not-a-sweep", status=self.JobStatus("RUNNING"), metadata={},
                            message=None, start_time=1, end_time=None, driver_exit_code=None)
        ]

    def get_job_logs(self, job_id: str) -> str:
        if job_id not in self.jobs:
            raise self._missing(job_id)
        return self.logs.get(job_id, "")

    def stop_job(self, job_id: str) -> bool:
        if job_id not in self.jobs:
            raise self._missing(job_id)
        self.stop_calls.append(job_id)
        job = self.jobs[job_id]
        if job.status.is_terminal():
            return False
        job.status = self.JobStatus("STOPPED")
        return True


def fake_run(run_id: str, *, role: str, sweep_id: str, status: str = "RUNNING", tag_status: str = "RUNNING",
             metrics: dict[str, float] | None = None, params: dict[str, str] | None = None,
             tags: dict[str, str] | None = None, experiment_id: str = "1") -> SimpleNamespace:
    all_tags = {"critbatch.sweep_id": sweep_id, "critbatch.role": role, "critbatch.status": tag_status,
                "critbatch.trial_id": run_id if role == "trial" else ""}
    all_tags.update(tags or {})
    return SimpleNamespace(
        info=SimpleNamespace(run_id=run_id, status=status, experiment_id=experiment_id),
        data=SimpleNamespace(tags=all_tags, params=params or {}, metrics=metrics or {}),
    )


class FakeReader:
    """The subset of ``sweeps.jobs._MlflowReader`` that ``SweepJobs`` uses, over in-memory runs."""

    def __init__(self) -> None:
        self.parents: dict[str, SimpleNamespace] = {}
        self.trial_runs: dict[str, list[SimpleNamespace]] = {}
        self.artifacts: dict[str, Any] = {}
        self.closed: list[str] = []
        self.fail_with: Exception | None = None

    def __call__(self, uri: str) -> "FakeReader":
        if self.fail_with is not None:
            raise self.fail_with
        return self

    def experiment_ids(self, name: str | None) -> list[str]:
        return ["1"]

    def parent(self, sweep_id: str, exp_ids: list[str]) -> SimpleNamespace | None:
        return self.parents.get(sweep_id)

    def trials(self, sweep_id: str, exp_ids: list[str]) -> list[SimpleNamespace]:
        return list(self.trial_runs.get(sweep_id, []))

    def close_orphans(self, parent, trials, sweep_status: str) -> int:
        for r in [*trials, parent]:
            if r is not None and r.info.status == "RUNNING":
                r.info.status = "KILLED"
                if r.data.tags.get("critbatch.status") == "RUNNING":
                    r.data.tags["critbatch.status"] = sweep_status if r.data.tags["critbatch.role"] == "sweep" else "STOPPED"
                self.closed.append(r.info.run_id)
        return len(self.closed)

    def load_json_artifact(self, run_id: str, path: str) -> Any:
        return self.artifacts.get(run_id)


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
