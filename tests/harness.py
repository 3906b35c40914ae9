"""Process helpers shared by the suite: free ports, process groups, waiting on HTTP, a Ray head on
ports outside Ray's default worker range, and a migrated MLflow store copied per test.

Every process started here runs in a session of its own, so stopping it (``stop_group``) signals
its whole process group and nothing else.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
PIN_DATE_DIR = Path(__file__).resolve().parent / "service" / "pin_date"
#: Ray Tune's date_str() in every process of a pinned cluster (tests/service/pin_date): every sweep
#: on it "starts in the same second", the case where Ray's staging folders of two sweeps meet.
PINNED_DATE = "2026-01-01_00-00-00"
#: Worker ports of the suite's heads: outside Ray's default 10002-19999, which other clusters on
#: this machine (a CLI's in-process Ray) use.
WORKER_PORTS = (20000, 29999)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it, so never in 10002-19999
    by design: Linux's ephemeral range starts at 32768)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env() -> dict[str, str]:
    """This process's environment without any cluster or tracking address, token auth and usage
    stats off, the venv's scripts first on PATH."""
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI", "CRITBATCH_API_TOKEN"):
        env.pop(k, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pinned_date_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Ray Tune's start second pinned to :data:`PINNED_DATE` (tests/service/pin_date)."""
    return dict(
        env,
        CRITBATCH_TEST_PIN_DATE=PINNED_DATE,
        PYTHONPATH=os.pathsep.join(p for p in (str(PIN_DATE_DIR), env.get("PYTHONPATH")) if p),
    )


def start_group(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own, stdout and stderr to ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to a process started by :func:`start_group`, then SIGKILL anything left in its group after
    ``grace_s``. Ray heads get ``grace_s=0`` (SIGKILL at once): a ``ray start --block`` took 33 s to stop
    on SIGTERM, and on SIGINT 1.5 s in one run and 30 s in another."""
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


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll ``predicate`` until it returns something truthy (returned); raise AssertionError naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    """Wait until ``url`` answers 200; fail early (with the log's tail) if ``proc`` exits."""
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


@dataclass(frozen=True)
class RayHead:
    """A ``ray start --head --block`` process: its job server URL, GCS address and ``--temp-dir``."""

    proc: subprocess.Popen
    dashboard_url: str
    gcs_address: str
    temp_dir: Path


def start_ray_head(temp_dir: Path, *, num_cpus: int, env: dict[str, str], attempts: int = 3) -> RayHead:
    """``ray start --head --block`` on free ports, worker ports in :data:`WORKER_PORTS`.

    Retried because Ray gives a head node 30 s (hard-coded) to register, which a loaded 2-core
    machine can miss. Raises RuntimeError with the last log's tail after ``attempts`` failures.
    """
    log = temp_dir / "ray-start.log"
    for attempt in range(attempts):
        dash, gcs = free_port(), free_port()
        cmd = [
            str(VENV_BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--num-cpus={num_cpus}",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={temp_dir}",
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--min-worker-port={WORKER_PORTS[0]}",
            f"--max-worker-port={WORKER_PORTS[1]}",
        ]
        log = temp_dir / f"ray-start-{attempt}.log"
        proc = start_group(cmd, log, env, temp_dir)
        url = f"http://127.0.0.1:{dash}"
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline and "block forever" not in log.read_text():
            time.sleep(0.5)
        if proc.poll() is None and "block forever" in log.read_text():
            wait_http(f"{url}/api/version", 120, proc, log)
            wait_http(f"{url}/api/jobs/", 60, proc, log)
            return RayHead(proc, url, f"127.0.0.1:{gcs}", temp_dir)
        stop_group(proc, grace_s=0)
    raise RuntimeError(f"ray start failed {attempts} times:\n{log.read_text()[-4000:]}")


def make_mlflow_template(path: Path) -> Path:
    """Create a migrated (empty) MLflow SQLite store at ``path`` in a child process (~9 s: the
    schema's migrations), so tests copy the file instead of migrating again. Returns ``path``."""
    code = "import sys, mlflow; mlflow.MlflowClient(tracking_uri='sqlite:///' + sys.argv[1]).search_experiments()"
    subprocess.run(
        [sys.executable, "-c", code, str(path)], check=True, env=base_env(), stdout=subprocess.DEVNULL, timeout=300
    )
    return path


def copy_mlflow_store(template: Path, dest: Path) -> str:
    """Copy the template store to ``dest`` (a ``.db`` path); returns its ``sqlite:///`` URI."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, dest)
    return f"sqlite:///{dest}"
