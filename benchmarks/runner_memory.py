"""Peak resident memory of each kind of process during a sweep with 2 trial runners.

    .venv/bin/python benchmarks/runner_memory.py

Starts a local 3-CPU Ray head (as the test suite's, ``tests/harness.py``), runs the tiny spec
(``tests/specs/tiny.yaml``, 3 batch sizes x 2 trials, 2 at a time) through ``critbatch run --address``,
samples ``ps`` every 0.5 s and prints, per process kind (``ray::<class>`` titles; the driver), the largest
resident set seen, in MiB. Resident memory counts shared libraries once per process, so sums over-state a
node's use. Used to size the KubeRay head for the runners' hosts and controllers (``sweeps/remote/k8s.py``,
``head_memory_gib``; docs/benchmarks.md, "Trial runners").
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from harness import base_env, copy_mlflow_store, make_mlflow_template, pinned_date_env, start_ray_head, stop_group  # noqa: E402


def sample_peaks(peak: dict[str, int], stop: threading.Event, interval_s: float = 0.5) -> None:
    """Until ``stop`` is set, record in ``peak`` the largest RSS (MiB) of each process kind."""
    while not stop.is_set():
        out = subprocess.run(["ps", "-eo", "rss,args", "--no-headers"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            rss, _, args = line.strip().partition(" ")
            args = args.strip()
            kind = (args.split()[0].split(".")[0] if args.startswith("ray::")
                    else "driver (critbatch run)" if "sweeps.cli" in args else None)
            if kind:
                peak[kind] = max(peak[kind], int(rss) // 1024)
        stop.wait(interval_s)


def main() -> None:
    temp = Path(tempfile.mkdtemp(prefix="cbray", dir="/tmp"))  # short: Ray's socket paths are length-limited
    head = start_ray_head(temp, num_cpus=3, env=dict(pinned_date_env(base_env()),
                                                      RAY_TRAIN_ENABLE_PREEMPTION_WATCHER="0"))
    try:
        work = Path(tempfile.mkdtemp(prefix="runner-memory"))
        d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
        d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
        d["search"]["trials_per_batch_size"] = 2
        (work / "spec.yaml").write_text(yaml.safe_dump(d))
        uri = copy_mlflow_store(make_mlflow_template(temp / "template.db"), work / "mlflow.db")
        peak: dict[str, int] = collections.defaultdict(int)
        stop = threading.Event()
        sampler = threading.Thread(target=sample_peaks, args=(peak, stop), daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "sweeps.cli", "run", str(work / "spec.yaml"), "--output",
                            str(work / "out"), "--tracking-uri", uri, "--address", head.gcs_address, "--no-progress"],
                           cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0"))
        stop.set()
        sampler.join()
        if r.returncode != 0:
            raise SystemExit(f"the sweep failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        print(f"sweep: {time.perf_counter() - t0:.1f} s; peak resident memory by process kind (MiB):")
        for kind, mib in sorted(peak.items(), key=lambda kv: -kv[1]):
            print(f"{mib:6d}  {kind}")
    finally:
        stop_group(head.proc, grace_s=0)


if __name__ == "__main__":
    main()
