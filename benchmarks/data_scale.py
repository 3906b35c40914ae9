"""Memory and start-up of one training worker against the corpus size.

    python benchmarks/data_scale.py [--tokens 2e7,2e8,2e9] [--dir /tmp/critbatch-data-scale] [--steps 30]
                                    [--raw-baseline] [--trials]

For each size, synthetic prepared shards (``workloads.data.shards`` format, byte vocabulary so ``uint16``,
uniform random ids, 2^28-token shards, a 1 M-token validation split) are written once (kept in
``--dir`` for the next run), then one fresh process plays a training worker: it builds the trial's
workload from a tiny spec exactly as a Ray Train worker does (``sweeps.launch.trainable.trial_config``
then ``workloads.pretrain.build_pretrain``: the shards memory-mapped), and trains ``--steps`` AdamW
steps of 64 random windows x 64 tokens drawn over the whole corpus (the sweep's own
``window_batch``). It reports its peak RSS (``ru_maxrss``) and its time from process start to the
end of the first optimizer step. With ``--raw-baseline`` the smallest size is also run the old way
(a text file read and tokenized into int64 in the worker). With ``--trials`` each size is also the
data of a one-trial sweep (``critbatch run``: Ray Tune, Train, MLflow), whose first report's
``time_total_s`` is printed (8 steps and one evaluation after the trial's start). The last line is ``rss_ratio=X``:
the largest corpus's peak RSS over the smallest's (goal X <= 1.2).

Not measured: Ray Train's own start-up (35-50 s a trial, the same for every corpus size), several
workers on one node sharing the page cache, a corpus larger than the machine's memory being read
at random (page-cache misses: the first steps then wait on the disk).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARD_TOKENS = 2**28
VAL_TOKENS = 2**20


def make_shards(folder: Path, n_tokens: int) -> None:
    """Synthetic uint16 shards of ``n_tokens`` training tokens plus :data:`VAL_TOKENS` held out."""
    import numpy as np

    from workloads.data._prepare_io import _ShardWriter
    from workloads.data.prepare import tokenizer_identity
    from workloads.data.shards import FORMAT, INDEX_FILE

    if (folder / INDEX_FILE).is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shards = []
    for split, total in (("train", n_tokens), ("validation", VAL_TOKENS)):
        for k, lo in enumerate(range(0, total, SHARD_TOKENS)):
            w = _ShardWriter(folder / f"{split}-{k:05d}.bin", np.dtype(np.uint16))
            n = min(SHARD_TOKENS, total - lo)
            for c in range(0, n, 2**24):
                w.write(rng.integers(0, 256, size=min(2**24, n - c), dtype=np.uint16), 0)
            shards.append(w.close(split))
    ident = tokenizer_identity("byte")
    index = {
        "format": FORMAT,
        "tokenizer": ident,
        "vocab_size": 256,
        "dtype": "uint16",
        "split": {"method": "synthetic", "seed": 0, "validation_fraction": None},
        "inputs_sha256": "synthetic",
        "inputs": [],
        "input_format": "synthetic",
        "text_column": None,
        "shards": shards,
        "totals": {},
    }
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=1))


def worker(shards: str | None, raw: str | None, steps: int) -> dict:
    """One training worker's life up to ``steps`` optimizer steps: ``{peak_rss_mb, first_step_s, steps_s}``."""
    import resource

    import torch
    import yaml

    from sweeps.launch.trainable import trial_config
    from sweeps.spec import parse_spec
    from workloads.pretrain import build_pretrain

    torch.set_num_threads(1)
    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["data"] = {"shards": shards} if shards else {"path": raw}
    d["model"]["context_length_tokens"] = 64
    spec = parse_spec(d)
    cfg = trial_config(
        spec,
        {
            "lr": 1e-3,
            "lr_rule": "sqrt",
            "beta2": 0.99,
            "beta2_half_life_tokens": 1e4,
            "batch_size_sequences": 64,
            "seed": 0,
        },
        "bench",
        data_path=raw or "",
        shards=shards,
    )
    work = build_pretrain(cfg, torch.device("cpu"))
    opt = torch.optim.AdamW(work.model.parameters(), lr=1e-3)
    first = None
    for step in range(steps):
        x, y = work.train_batch(step=step, global_batch_size_sequences=64, start=0, count=64)
        logits = work.model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first is None:
            first = time.perf_counter() - T0
    return {
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "first_step_s": first,
        "steps_s": time.perf_counter() - T0 - first,
        "train_tokens": len(work.corpus.train_ids),
    }


def _run_worker(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"worker failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def trial_first_report(shards: Path, work: Path) -> float:
    """Seconds from a one-trial sweep's trial start to its first report (Tune's ``time_total_s``), on ``shards``.

    The trial: the tiny spec's model, batch 8 x 64 tokens, first milestone after 8 steps (plus one
    evaluation of 1024 tokens); Ray started in-process by ``critbatch run``.
    """
    import shutil

    import yaml

    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d.update(
        name="data-scale", data={"shards": str(shards)}, budget_tokens=8192, eval={"milestones": 2, "eval_tokens": 1024}
    )
    d["model"]["context_length_tokens"] = 64
    d["search"].update(batch_sizes_sequences=[8], trials_per_batch_size=1)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "spec.yaml").write_text(yaml.safe_dump(d))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "critbatch",
            "run",
            str(work / "spec.yaml"),
            "--output",
            str(work / "out"),
            "--tracking-uri",
            f"sqlite:///{work / 'mlflow.db'}",
            "--sweep-id",
            "ds",
            "--no-progress",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    rows = [json.loads(x) for f in (work / "out" / "tune").rglob("result.json") for x in f.read_text().splitlines()[:1]]
    if not rows:
        raise SystemExit(f"the one-trial sweep on {shards} reported nothing (see {work})")
    return float(rows[0]["time_total_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="2e7,2e8,2e9")
    ap.add_argument("--dir", default="/tmp/critbatch-data-scale")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--raw-baseline", action="store_true")
    ap.add_argument("--trials", action="store_true", help="also a one-trial sweep per size (Ray Tune + Train)")
    ap.add_argument("--worker", nargs=3, metavar=("SHARDS", "RAW", "STEPS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        shards, raw, steps = a.worker
        print(json.dumps(worker(shards or None, raw or None, int(steps))))
        return
    sizes = [int(float(x)) for x in a.tokens.split(",")]
    rss = {}
    for n in sizes:
        folder = Path(a.dir) / f"synthetic-{n}"
        t = time.perf_counter()
        make_shards(folder, n)
        made = time.perf_counter() - t
        res = _run_worker([str(folder), "", str(a.steps)])
        rss[n] = res["peak_rss_mb"]
        print(
            f"shards {n:>13,} tokens ({n * 2 / 2**30:.2f} GiB uint16, made in {made:.0f} s): peak RSS "
            f"{res['peak_rss_mb']:.0f} MB, first step {res['first_step_s']:.2f} s after process start, "
            f"{a.steps} steps {res['steps_s']:.2f} s more",
            flush=True,
        )
        if a.trials:
            print(
                f"  one-trial sweep on it: first report {trial_first_report(folder, Path(a.dir) / 'sweep'):.1f} s "
                "after the trial started",
                flush=True,
            )
    if a.raw_baseline:
        n = sizes[0]
        raw = Path(a.dir) / f"raw-{n}.txt"
        if not raw.is_file():
            import numpy as np

            raw.write_bytes(np.random.default_rng(0).integers(32, 127, size=n, dtype=np.uint8).tobytes())
        res = _run_worker(["", str(raw), str(a.steps)])
        print(
            f"raw text {n:>11,} bytes (the old path: read and tokenized to int64 in the worker): peak RSS "
            f"{res['peak_rss_mb']:.0f} MB, first step {res['first_step_s']:.2f} s",
            flush=True,
        )
    print(f"rss_ratio={rss[sizes[-1]] / rss[sizes[0]]:.3f}")


if __name__ == "__main__":
    main()
