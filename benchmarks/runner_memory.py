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

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from harness import base_env, copy_mlflow_store, make_mlflow_template, pinned_date_env, start_ray_head, stop_group


def sample_peaks(peak: dict[str, int], roots: list[int], stop: threading.Event, interval_s: float = 0.5) -> None:
    """Until ``stop`` is set, record in ``peak`` the largest RSS (MiB) of each process kind among the
    descendants of ``roots`` (this head's ``ray start`` and the sweep's CLI: other Ray clusters on the machine
    are not counted)."""
    while not stop.is_set():
        out = subprocess.run(["ps", "-eo", "pid=,ppid=,rss=,args="], capture_output=True, text=True).stdout
        rows = {}
        for line in out.splitlines():
            pid, ppid, rss, *args = line.split(None, 3)
            rows[int(pid)] = (int(ppid), int(rss), args[0] if args else "")
        mine = set(roots)
        grew = True
        while grew:  # the descendants of the roots
            new = {pid for pid, (ppid, _, _) in rows.items() if ppid in mine and pid not in mine}
            mine |= new
            grew = bool(new)
        for pid in mine & rows.keys():
            _, rss, args = rows[pid]
            kind = (
                args.split()[0].split(".")[0]
                if args.startswith("ray::")
                else "driver (critbatch run)"
                if "-m critbatch " in args
                else None
            )
            if kind:
                peak[kind] = max(peak[kind], rss // 1024)
        stop.wait(interval_s)


def main() -> None:
    """Parse the (no) arguments first, so that ``--help`` answers without starting a Ray head; then measure."""
    argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="It takes no options: the spec, the head and the sampling are fixed (module docstring).",
    ).parse_args()
    temp = Path(tempfile.mkdtemp(prefix="cbray", dir="/tmp"))  # short: Ray's socket paths are length-limited
    head = start_ray_head(
        temp, num_cpus=3, env=dict(pinned_date_env(base_env()), RAY_TRAIN_ENABLE_PREEMPTION_WATCHER="0")
    )
    try:
        work = Path(tempfile.mkdtemp(prefix="runner-memory"))
        d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
        d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
        d["search"]["trials_per_batch_size"] = 2
        (work / "spec.yaml").write_text(yaml.safe_dump(d))
        uri = copy_mlflow_store(make_mlflow_template(temp / "template.db"), work / "mlflow.db")
        peak: dict[str, int] = collections.defaultdict(int)
        stop = threading.Event()
        t0 = time.perf_counter()
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "critbatch",
                "run",
                str(work / "spec.yaml"),
                "--output",
                str(work / "out"),
                "--tracking-uri",
                uri,
                "--address",
                head.gcs_address,
                "--no-progress",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0"),
        )
        sampler = threading.Thread(target=sample_peaks, args=(peak, [head.proc.pid, cli.pid], stop), daemon=True)
        sampler.start()
        _, err = cli.communicate()
        stop.set()
        sampler.join()
        shutil.rmtree(work, ignore_errors=True)
        if cli.returncode != 0:
            raise SystemExit(f"the sweep failed (exit {cli.returncode}):\n{err[-3000:]}")
        print(f"sweep: {time.perf_counter() - t0:.1f} s; peak resident memory by process kind (MiB):")
        for kind, mib in sorted(peak.items(), key=lambda kv: -kv[1]):
            print(f"{mib:6d}  {kind}")
    finally:
        stop_group(head.proc, grace_s=0)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
