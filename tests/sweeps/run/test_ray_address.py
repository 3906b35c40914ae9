"""A dead or wrong Ray address fails fast (``sweeps.launch.reach``): exit 1 with one line that names the address
and what was tried, within ``--connect-timeout-s``, and nothing of the sweep behind it (no output folder, no
lock, no ``sweep.json``, no MLflow run), since Ray is connected before any of them is made.

It used to print only Ray's own "Failed to connect to GCS" lines for five minutes, with ``OUT/sweep.json``
``STARTING`` and a lock in place all along (what a ``kill -9`` then left).

The stand-ins for wrong addresses are real sockets on loopback: a closed port, a listener that never answers
(a stopped process), an HTTP/1 server (the dashboard's port given as the GCS address), a server that answers
HTTP/2's greeting and nothing else (a gRPC port that is no GCS). The live head is the suite's.
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest

from sweeps.errors import InvalidInput
from sweeps.launch.reach import CONNECT_TIMEOUT_ENV, RayUnreachable, probe_ray_address, ray_connect_timeout_s
from tests.conftest import ROOT, invoke_cli, run_cli, tiny_spec, write_spec
from tests.harness import base_env, free_port, stop_group


def _closed_port() -> int:
    """A loopback port nothing listens on (the OS handed it out a moment ago and it was closed)."""
    return free_port()


def _run_args(tmp_path: Path, address: str, uri: str, timeout_s: float) -> list[str]:
    spec = write_spec(tmp_path, tiny_spec())
    return [
        "run",
        str(spec),
        "--output",
        str(tmp_path / "out"),
        "--no-progress",
        "--tracking-uri",
        uri,
        "--address",
        address,
        "--connect-timeout-s",
        f"{timeout_s:g}",
    ]


def _assert_nothing_started(tmp_path: Path, uri: str) -> None:
    assert not (tmp_path / "out").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())
    client = mlflow.MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    assert client.search_runs(exps) == [], "an MLflow run was created for a sweep that never connected"


def _error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def silent_listener():
    """A loopback socket that accepts connections (the kernel does) and never answers: a stopped process."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


# ---- the CLI ----------------------------------------------------------------------------------------------


def test_run_against_a_closed_port_exits_1_at_once_naming_it_and_leaves_nothing(tmp_path, mlflow_uri):
    address = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    r = invoke_cli(_run_args(tmp_path, address, mlflow_uri, 300))
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    line = _error_line(r.stderr)
    assert f"cannot reach a Ray cluster at {address}" in line and "refused" in line and "Nothing was started" in line
    assert "Traceback" not in r.stdout + r.stderr and "sweep failed" not in r.stderr
    assert took < 60, took  # refused: no wait for the 300 s timeout (Ray's own retries took 5 minutes)
    _assert_nothing_started(tmp_path, mlflow_uri)


def test_run_against_a_silent_listener_gives_up_after_the_timeout(tmp_path, mlflow_uri, silent_listener):
    address = f"127.0.0.1:{silent_listener.getsockname()[1]}"
    t0 = time.monotonic()
    r = invoke_cli(_run_args(tmp_path, address, mlflow_uri, 2))
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    line = _error_line(r.stderr)
    assert address in line and "nothing answered within 2 s" in line and "--connect-timeout-s" in line, line
    assert 2 <= took < 60, took
    _assert_nothing_started(tmp_path, mlflow_uri)


def test_a_driver_killed_while_it_connects_leaves_nothing(tmp_path, mlflow_uri, silent_listener):
    """``kill -9`` while the driver waits for the address (it used to leave ``sweep.json`` STARTING and the lock)."""
    silent_listener.settimeout(120)
    address = f"127.0.0.1:{silent_listener.getsockname()[1]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "critbatch", *_run_args(tmp_path, address, mlflow_uri, 300)],
        cwd=ROOT,
        env=base_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        conn, _ = silent_listener.accept()  # the driver is in the probe now: everything before it has run
        conn.close()
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        stop_group(proc, grace_s=0)
    _assert_nothing_started(tmp_path, mlflow_uri)


def test_a_bad_connect_timeout_is_invalid_input(tmp_path, mlflow_uri):
    r = invoke_cli(_run_args(tmp_path, "127.0.0.1:9", mlflow_uri, 0))
    assert r.returncode == 2 and "--connect-timeout-s must be a positive number of seconds" in r.stderr, r.stderr
    args = _run_args(tmp_path, "127.0.0.1:9", mlflow_uri, 1)[:-2]
    r = invoke_cli(args, env={CONNECT_TIMEOUT_ENV: "soon"})
    assert r.returncode == 2 and f"{CONNECT_TIMEOUT_ENV}='soon' is not a number" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_status_against_a_silent_job_server_exits_1_naming_it(silent_listener):
    url = f"http://127.0.0.1:{silent_listener.getsockname()[1]}"
    t0 = time.monotonic()
    r = invoke_cli(["status", "some-sweep", "--address", url], env={CONNECT_TIMEOUT_ENV: "2"})
    assert r.returncode == 1 and f"the Ray job server at {url} did not answer within 2 s" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60


# ---- the probe ----------------------------------------------------------------------------------------------


def test_the_connect_timeout_comes_from_the_flag_else_the_environment_else_30(monkeypatch):
    monkeypatch.delenv(CONNECT_TIMEOUT_ENV, raising=False)
    assert ray_connect_timeout_s() == 30.0
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "7.5")
    assert ray_connect_timeout_s() == 7.5 and ray_connect_timeout_s(2) == 2.0
    for bad in ("0", "-1", "inf", "nan"):
        monkeypatch.setenv(CONNECT_TIMEOUT_ENV, bad)
        with pytest.raises(InvalidInput, match=CONNECT_TIMEOUT_ENV):
            ray_connect_timeout_s()


def test_the_dashboards_port_given_as_the_gcs_address_is_named_as_http():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RayUnreachable, match="an HTTP/1 server answered, not Ray's GCS") as e:
            probe_ray_address(f"127.0.0.1:{server.server_address[1]}", 5)
        assert "http://HEAD:8265" in str(e.value)
    finally:
        server.shutdown()
        server.server_close()


def test_what_ray_resolves_itself_is_not_probed():
    for address in ("auto", "local", "no-port-here"):
        probe_ray_address(address, 0.01)


@pytest.mark.slow
def test_a_grpc_port_that_is_no_gcs_fails_in_one_ray_attempt(tmp_path, mlflow_uri):
    """The probe passes (an HTTP/2 greeting is answered); ``ray.init`` then gets one GCS attempt, not twenty."""
    settings_frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    lsock = socket.socket()
    lsock.bind(("0.0.0.0", 0))  # ray.init dials the machine's own IP for 127.0.0.1
    lsock.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            held.append(conn)
            try:
                conn.sendall(settings_frame)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    address = f"127.0.0.1:{lsock.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        r = run_cli(_run_args(tmp_path, address, mlflow_uri, 5), timeout_s=240)  # a process of its own: ray.init
        took = time.monotonic() - t0
    finally:
        lsock.close()
        for c in held:
            c.close()
    assert r.returncode == 1, r.stdout + r.stderr
    line = _error_line(r.stderr)
    assert f"cannot connect to the Ray cluster at {address}: ray.init failed" in line, line
    assert took < 150, took  # one attempt: about 40 s with Ray's defaults (twenty: about 5 minutes)
    _assert_nothing_started(tmp_path, mlflow_uri)


def test_a_live_head_is_probed_and_connected(ray_head):
    import ray

    from sweeps.launch.cluster import ray_session
    from sweeps.spec import parse_spec

    assert not ray.is_initialized()
    with ray_session(ray_head.gcs_address, parse_spec(tiny_spec()), connect_timeout_s=10) as started:
        assert started and ray.cluster_resources().get("CPU") == 3.0
        assert "RAY_gcs_server_port_wait_time_s" not in os.environ  # set for ray.init only
    assert not ray.is_initialized()
