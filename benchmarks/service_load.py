"""Load test of the REST service on loopback: liveness under load and with frozen backends.

Starts, in process groups of its own (and stops them at the end): a Ray head (2 CPUs, every port
chosen by the OS, none in 10002-19999), an ``mlflow server`` (SQLite) and ``critbatch serve``,
all on 127.0.0.1. It submits a few sweeps with ``critbatch submit`` whose data path does not
exist on the cluster (each job fails in seconds, but stays in Ray's job list with an MLflow URI,
so every listed sweep costs the service MLflow queries). Then, sending traffic only to 127.0.0.1:

1. ``GET /v1/sweeps`` at 50, 100 and 200 concurrent clients for ``--phase-s`` seconds each:
   list p50/p99 and ``/healthz`` p50/p99 sampled every 50 ms meanwhile;
2. the same at 200 concurrent with the MLflow server stopped (SIGSTOP to its process group);
3. the same at 200 concurrent with the Ray dashboard (the job server) stopped (SIGSTOP).

Bounded: each phase lasts ``--phase-s`` (default 20 s) plus the requests in flight, whose
timeouts the service bounds (30 s); the whole run stops itself after ``--max-s`` (600 s).

    .venv/bin/python benchmarks/service_load.py [--phase-s 20] [--out benchmarks/service_load.json]

Prints one line per phase and writes the numbers as JSON; docs/benchmarks.md quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOKEN = "load-test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "CRITBATCH_API_TOKEN")}
    e.update(
        PATH=f"{BIN}{os.pathsep}{e.get('PATH', '')}",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    return e


def start(cmd: list[str], log: Path, e: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, env=e, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not up after {timeout_s} s\n{log.read_text()[-3000:]}")


def dashboard_pids(ray_proc: subprocess.Popen) -> list[int]:
    """The Ray dashboard (job server) processes of our own head's process group."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,args="], capture_output=True, text=True).stdout
    return [
        int(ln.split()[0])
        for ln in out.splitlines()
        if int(ln.split()[1]) == ray_proc.pid and "dashboard/dashboard.py" in ln
    ]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def sample_healthz(url: str, seconds: float, out: Path) -> None:
    """``GET /healthz`` every 50 ms for ``seconds`` over one kept-alive connection; latencies (s) to ``out``.

    Runs in a process of its own, so the load generator's own event loop does not delay it.
    """
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    lat = []
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        r.read()
        assert r.status == 200
        lat.append(time.perf_counter() - t0)
        time.sleep(0.05)
    out.write_text(json.dumps(lat))


async def phase(url: str, concurrency: int, seconds: float, tmp: Path) -> dict:
    """``concurrency`` clients calling ``GET /v1/sweeps`` back to back for ``seconds``, while a separate
    process samples ``/healthz`` every 50 ms."""
    lat_list: list[float] = []
    codes: dict[int, int] = {}
    stop_at = time.monotonic() + seconds
    health_file = tmp / f"healthz-{concurrency}-{time.monotonic_ns()}.json"
    sampler = subprocess.Popen([sys.executable, __file__, "--sample-healthz", url, str(seconds), str(health_file)])
    limits = httpx.Limits(max_connections=concurrency + 10, max_keepalive_connections=concurrency + 10)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def worker() -> None:
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                try:
                    r = await client.get(f"{url}/v1/sweeps", headers=AUTH, params={"limit": 20})
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                except httpx.HTTPError:
                    codes[-1] = codes.get(-1, 0) + 1
                lat_list.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    sampler.wait(timeout=120)
    lat_health = json.loads(health_file.read_text())
    return {
        "concurrency": concurrency,
        "seconds": seconds,
        "list_requests": len(lat_list),
        "codes": codes,
        "list_p50_s": pct(lat_list, 50),
        "list_p99_s": pct(lat_list, 99),
        "healthz_samples": len(lat_health),
        "healthz_p50_ms": 1000 * pct(lat_health, 50),
        "healthz_p99_ms": 1000 * pct(lat_health, 99),
        "healthz_max_ms": 1000 * max(lat_health),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=20.0)
    ap.add_argument("--max-s", type=float, default=600.0)
    ap.add_argument(
        "--sweeps", type=int, default=5, help="failing sweeps submitted first (each listed sweep costs MLflow reads)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "service_load.json")
    ap.add_argument("--sample-healthz", nargs=3, metavar=("URL", "SECONDS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sample_healthz:
        url, seconds, out = args.sample_healthz
        sample_healthz(url, float(seconds), Path(out))
        return
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("load test ran past --max-s")))
    signal.alarm(int(args.max_s))

    tmp = Path(tempfile.mkdtemp(prefix="cbload", dir="/tmp"))
    e = env()
    procs: list[subprocess.Popen] = []
    results: dict = {"phases": []}
    try:
        ml_port, dash, svc = free_port(), free_port(), free_port()
        ml = start(
            [
                str(BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{tmp}/mlflow.db",
                "--serve-artifacts",
                "--artifacts-destination",
                str(tmp / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(ml_port),
                "--workers",
                "1",
            ],
            tmp / "mlflow.log",
            e,
        )
        procs.append(ml)
        ray = start(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--block",
                "--num-cpus=2",
                "--disable-usage-stats",
                "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1",
                f"--temp-dir={tmp}",
                f"--port={free_port()}",
                f"--dashboard-port={dash}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}",
                f"--metrics-export-port={free_port()}",
                f"--node-manager-port={free_port()}",
                f"--object-manager-port={free_port()}",
                "--min-worker-port=0",
                "--max-worker-port=0",
            ],
            tmp / "ray.log",
            e,
        )
        procs.append(ray)
        ray_url, ml_url = f"http://127.0.0.1:{dash}", f"http://127.0.0.1:{ml_port}"
        wait_http(f"{ray_url}/api/jobs/", 240, ray, tmp / "ray.log")
        wait_http(f"{ml_url}/health", 300, ml, tmp / "mlflow.log")
        e_cluster = dict(e, RAY_ADDRESS=ray_url, MLFLOW_TRACKING_URI=ml_url)
        svc_proc = start(
            [
                sys.executable,
                "-m",
                "critbatch",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(svc),
                "--log-level",
                "warning",
            ],
            tmp / "service.log",
            dict(e_cluster, CRITBATCH_API_TOKEN=TOKEN, CRITBATCH_DATA_DIR=str(REPO)),
        )
        procs.append(svc_proc)
        url = f"http://127.0.0.1:{svc}"
        wait_http(f"{url}/healthz", 60, svc_proc, tmp / "service.log")
        spec = yaml.safe_load((REPO / "tests" / "specs" / "tiny.yaml").read_text())
        spec["data"]["path"] = "/nonexistent/critbatch-load-test.txt"  # the job fails fast (exit 2)
        spec_file = tmp / "spec.yaml"
        spec_file.write_text(yaml.safe_dump(spec))
        for i in range(args.sweeps):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "critbatch",
                    "submit",
                    str(spec_file),
                    "--sweep-id",
                    f"load-{i}",
                    "--no-ship-data",
                ],
                env=e_cluster,
                cwd=REPO,
                capture_output=True,
                timeout=180,
                check=True,
            )
        listed = httpx.get(f"{url}/v1/sweeps", headers=AUTH, timeout=60).json()
        results["listed_sweeps"] = listed["total"]

        def run(label: str, concurrency: int) -> None:
            r = asyncio.run(phase(url, concurrency, args.phase_s, tmp))
            r["label"] = label
            results["phases"].append(r)
            print(
                f"{label:>22} c={concurrency:<3} list p50={r['list_p50_s']:.2f}s p99={r['list_p99_s']:.2f}s "
                f"n={r['list_requests']} codes={r['codes']}  healthz p50={r['healthz_p50_ms']:.1f}ms "
                f"p99={r['healthz_p99_ms']:.1f}ms max={r['healthz_max_ms']:.1f}ms",
                flush=True,
            )

        for c in (50, 100, 200):
            run("normal", c)
        os.killpg(ml.pid, signal.SIGSTOP)
        try:
            run("mlflow frozen", 200)
        finally:
            os.killpg(ml.pid, signal.SIGCONT)
        pids = dashboard_pids(ray)
        results["dashboard_pids"] = len(pids)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            run("ray dashboard frozen", 200)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        results["machine"] = {"cpus": os.cpu_count(), "loadavg": os.getloadavg()}
        args.out.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    finally:
        signal.alarm(0)
        for p in reversed(procs):
            stop(p)
        if os.environ.get("CRITBATCH_KEEP_TEST_LOGS") != "1":
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
