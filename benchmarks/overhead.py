"""Sweep overhead: the same trials as plain PyTorch loops and through the whole sweep.

    python benchmarks/overhead.py [--budget-tokens N] [--batch-sizes 16,64] [--concurrency 2]

Both sides train the same trials (same model, data, hyperparameters, seeds, token budget) with the
same parallelism: ``--concurrency`` trials at once, one CPU thread each. The plain side runs
``workloads.pretrain.run_pretrain`` in a process pool; the sweep side runs ``critbatch run`` (Ray
started in-process, Tune + Optuna + Ray Train + MLflow + analysis + report). The last line is
``ratio=X`` (sweep wall clock over plain wall clock); the lines before it say where the difference
goes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_spec(budget_tokens: int, batch_sizes: list[int], concurrency: int) -> dict:
    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "shakespeare-char.yaml").read_text())
    d["name"] = "overhead-bench"
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    d["budget_tokens"] = budget_tokens
    d["search"].update(batch_sizes_sequences=batch_sizes, lr_rules=["sqrt"], lr_multiplier=[1.0, 1.0],
                       beta2={"values": [0.99]}, trials_per_batch_size=1)
    d["resources"] = {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": concurrency}
    return d


def _plain_trial(args: tuple[dict, int]) -> float:
    spec_dict, b = args
    import torch

    torch.set_num_threads(1)
    from sweeps.spec import parse_spec
    from sweeps.search.searcher import hyperparameters_for
    from sweeps.run.trainable import trial_config
    from workloads.pretrain import run_pretrain

    spec = parse_spec(spec_dict)
    cfg = trial_config(spec, {"batch_size_sequences": b, "seed": 0, **hyperparameters_for(spec, b, {})},
                       f"plain-{b}", data_path=spec.data.path)
    t0 = time.perf_counter()
    run_pretrain(cfg, device=torch.device("cpu"), report=lambda m, s: None)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-tokens", type=int, default=786432)
    ap.add_argument("--batch-sizes", default="16,64")
    ap.add_argument("--concurrency", type=int, default=2)
    a = ap.parse_args()
    bs = [int(x) for x in a.batch_sizes.split(",")]
    spec = make_spec(a.budget_tokens, bs, a.concurrency)

    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(a.concurrency) as pool:
        per_trial = pool.map(_plain_trial, [(spec, b) for b in bs])
    plain = time.perf_counter() - t0
    print(f"plain: {plain:.1f} s wall for {len(bs)} trials (training {', '.join(f'{t:.1f}' for t in per_trial)} s each)")

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "spec.yaml"
        p.write_text(yaml.safe_dump(spec))
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "sweeps.cli", "run", str(p), "--output", f"{tmp}/out",
                            "--tracking-uri", f"sqlite:///{tmp}/ml.db", "--no-progress"], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        sweep = time.perf_counter() - t0
        if r.returncode not in (0, 1):
            print(r.stdout, r.stderr)
            raise SystemExit("the sweep failed")
        rows = []
        for f in sorted(Path(tmp, "out", "tune").glob("**/result.json")):
            rows.append([json.loads(x) for x in f.read_text().splitlines() if x.strip()])
        first = [r_[0]["time_total_s"] for r_ in rows]
        total = [r_[-1]["time_total_s"] for r_ in rows]
        print(f"sweep: {sweep:.1f} s wall; per trial: time to first report {', '.join(f'{x:.1f}' for x in first)} s, "
              f"trial total {', '.join(f'{x:.1f}' for x in total)} s")
        print(f"plain-loop training time per trial ~{sum(per_trial) / len(per_trial):.1f} s; "
              f"sweep fixed costs (Ray start, Optuna/MLflow setup, analysis, report, shutdown) "
              f"~{sweep - max(total) * math.ceil(len(bs) / a.concurrency):.1f} s")
    print(f"ratio={sweep / plain:.3f}")


if __name__ == "__main__":
    main()
