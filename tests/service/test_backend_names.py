"""``/readyz`` checks what a submission needs, and a 504 names the backend that did not answer.

A service once said ``"ray": "ok"`` while every submission got 504: its dashboard port had been taken by
another cluster's, whose version route answered while its job routes hung. The stand-in here is a real HTTP
server on loopback that does the same (``/api/version`` answers, every ``/api/jobs/`` request hangs until
the test ends); the frozen MLflow is a listening socket that never answers, as in ``test_service_limits.py``.
The app runs under a real uvicorn server (``test_service_limits.serving``).
"""

from __future__ import annotations

import http.server
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml
from svc_fakes import tiny_spec
from test_service_limits import AUTH, serving, settings

from service.app import create_app
from sweeps.remote import SweepJobs

SPEC = yaml.safe_dump(tiny_spec())


@pytest.fixture
def hung_job_routes():
    """A Ray dashboard whose ``/api/version`` answers and whose job routes hang; yields its URL."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/api/version":
                body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x", "session_name": "s"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())
                return
            release.wait(120)  # a job route: no answer while the test runs
            self.send_error(503)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_readyz_is_not_ready_when_the_job_routes_hang_and_names_ray(hung_job_routes):
    app = create_app(settings(ray_address=hung_job_routes, tracking_uri=None, ready_timeout_s=1.0, ray_timeout_s=30))
    with serving(app) as url:
        r = httpx.get(f"{url}/readyz", timeout=60)
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "unavailable" and body["mlflow"] == "not configured", body
    assert body["ray"] == "the Ray job server did not answer within 1 s (waiting on list_jobs)", body


def test_a_submission_504_names_the_ray_job_server_and_the_request(hung_job_routes):
    """The route's limit (5 s) passes before the job client's (30 s): the detail still says who and what."""
    app = create_app(settings(ray_address=hung_job_routes, tracking_uri=None, request_timeout_s=5.0, ray_timeout_s=30))
    with serving(app) as url:
        r = httpx.post(
            f"{url}/v1/sweeps",
            params={"sweep_id": "one"},
            content=SPEC,
            timeout=60,
            headers={**AUTH, "Content-Type": "application/yaml"},
        )
    assert r.status_code == 504, r.text
    assert r.json()["detail"] == "the Ray job server did not answer within 5 s (waiting on get_job_info)", r.text
    assert "127.0.0.1" not in r.text


def test_a_submission_behind_a_stuck_one_504_names_the_wait(hung_job_routes):
    """Submissions are counted and submitted one at a time: the second waits for the first, which waits on Ray."""
    app = create_app(settings(ray_address=hung_job_routes, tracking_uri=None, request_timeout_s=6.0, ray_timeout_s=30))
    with serving(app) as url:

        def post(sid):
            return httpx.post(
                f"{url}/v1/sweeps",
                params={"sweep_id": sid},
                content=SPEC,
                headers={**AUTH, "Content-Type": "application/yaml"},
                timeout=60,
            )

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(post, ["one", "two"]))
    details = sorted(a.json()["detail"] for a in answers)
    assert [a.status_code for a in answers] == [504, 504], [a.text for a in answers]
    assert details == [
        "the Ray job server did not answer within 6 s (waiting on get_job_info)",
        "the Ray job server did not answer within 6 s (waiting on the submission ahead of this one)",
    ], details


def test_a_frozen_mlflow_504_names_mlflow(fake_ray, monkeypatch):
    import socket

    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(16)
    ml = f"http://127.0.0.1:{frozen.getsockname()[1]}"
    fake_ray.add("s1", "RUNNING", metadata={"critbatch.tracking_uri": ml})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")  # past the route's limit
    jobs = SweepJobs("http://ray.invalid:8265", client=fake_ray)
    try:
        with serving(
            create_app(settings(tracking_uri=ml, request_timeout_s=1.0, ready_timeout_s=1.0), jobs=jobs)
        ) as url:
            r = httpx.get(f"{url}/v1/sweeps/s1", headers=AUTH, timeout=60)
            rz = httpx.get(f"{url}/readyz", timeout=60)
    finally:
        frozen.close()
    assert r.status_code == 504 and r.json()["detail"].startswith("MLflow did not answer within 1 s (waiting on "), (
        r.text
    )
    assert rz.status_code == 503 and rz.json()["ray"] == "ok", rz.text
    assert rz.json()["mlflow"].startswith("MLflow did not answer within 1 s"), rz.text
