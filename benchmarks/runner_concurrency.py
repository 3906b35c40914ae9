"""One trial runner or two for a small sweep on a small machine: the same tiny sweep with
``resources.max_concurrent_trials`` 2 and 1, alternately, on one Ray head.

    python benchmarks/runner_concurrency.py [--repeats 2] [--batch-sizes 4,8,16]

Each run is ``critbatch run tests/specs/tiny.yaml`` (its ``data.path`` made absolute, the batch sizes given)
with ``--address`` on a head this script starts (``ray start --head --num-cpus 3``, ports outside Ray's
default worker range) and stops; each run gets a fresh output folder and SQLite MLflow store. Prints one
line per run, ``concurrency=C wall_s=S rc=R``, then the median wall clock per concurrency. What it shows:
on the 2-core machine, whether starting a second trial runner (its host, Ray Train controller and worker
processes) at the same time as the first pays for itself when the trials are a fraction of a second. What
it does not show: anything about trials that train for seconds or minutes (the main job's take ~8 s each,
and there the second runner halves the training span).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_head(temp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--num-cpus=3",
        "--min-worker-port=20000",
        "--max-worker-port=20999",
        f"--ray-client-server-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--disable-usage-stats",
        "--include-dashboard=false",
        f"--temp-dir={temp}",
    ]
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return head, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    os.killpg(head.pid, signal.SIGKILL)
    raise RuntimeError("the Ray head did not come up in 120 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-sizes", default="4,8,16")
    args = ap.parse_args()
    spec = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    spec["data"]["path"] = str(ROOT / spec["data"]["path"])
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    spec["search"]["batch_sizes_sequences"] = sizes
    base = spec["search"]["base_batch_size_sequences"]  # search.strategy transfer starts there: one of the sizes
    spec["search"]["base_batch_size_sequences"] = min(sizes, key=lambda b: (abs(math.log(b / base)), b))
    work = Path(tempfile.mkdtemp(prefix="cbconc"))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")  # the head and the drivers alike
    head, address = _start_head(Path(tempfile.mkdtemp(prefix="cbr", dir="/tmp")), env)
    walls: dict[int, list[float]] = {2: [], 1: []}
    try:
        for rep in range(args.repeats):
            for conc in (2, 1):
                spec["resources"] = {"max_concurrent_trials": conc}
                path = work / f"spec-{conc}.yaml"
                path.write_text(yaml.safe_dump(spec))
                out = work / f"out-{rep}-{conc}"
                t0 = time.monotonic()
                r = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "critbatch",
                        "run",
                        str(path),
                        "--output",
                        str(out),
                        "--tracking-uri",
                        f"sqlite:///{work / f'ml-{rep}-{conc}.db'}",
                        "--no-progress",
                        "--address",
                        address,
                    ],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                wall = time.monotonic() - t0
                walls[conc].append(wall)
                print(f"concurrency={conc} wall_s={wall:.1f} rc={r.returncode}", flush=True)
                if r.returncode != 0:
                    print(r.stdout[-2000:] + r.stderr[-3000:], flush=True)
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(" ".join(f"median_wall_s[concurrency={c}]={statistics.median(w):.1f}" for c, w in walls.items()))


if __name__ == "__main__":
    main()
