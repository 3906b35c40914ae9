"""Sweep overhead: the same trials as plain PyTorch loops and through the whole sweep.

    python benchmarks/overhead.py [--budget-tokens N] [--batch-sizes 4,8,...] [--trials-per-batch-size 2]
                                  [--concurrency 2] [--no-tune-only]
    python benchmarks/overhead.py --pruned     # the pruned example's wall clock over the main job's (~35 min)

By default the trials are the main job's (``sweeps/examples/shakespeare-char.yaml``): 7 batch sizes
x 2 trials, 256 Ki tokens each, 2 at a time, with one fixed LR rule and beta2 per batch size (so the
three sides train exactly the same 14 trials). Three sides train the same trials (same model, data,
hyperparameters, seeds, token budget) with the same parallelism: ``--concurrency`` trials at once, one CPU thread each. The plain side runs
``workloads.pretrain.run_pretrain`` in a process pool; the Tune-only side is what a user would
write instead of critbatch (Ray Tune + ``OptunaSearch`` + ``MLflowLoggerCallback``, a function
trainable running the same loop in its own process, no Ray Train); the sweep side runs ``critbatch
run`` (Ray started in-process, Tune + Optuna + Ray Train + MLflow + analysis + report). The last line
is ``ratio=X tune_only_ratio=Y sweep_over_tune_only=Z fixed_cost_s=W`` (sweep and Tune-only wall
clock over plain wall clock, the sweep over Tune-only, and the median per-trial fixed cost over the
trials after the first ``--concurrency`` (each trial runner's first pays its start): the sweep's time
to a trial's first report minus the plain loop's time to its first report at that batch size); the
lines before it say where the difference goes (``sweep wall clock by part``: :func:`sweep_breakdown`).

``--pruned`` instead runs the main job (``sweeps/examples/shakespeare-char.yaml``) and the pruned
example (``sweeps/examples/shakespeare-char-pruned.yaml``, the same training FLOPs) one after the other
through ``critbatch run``, each with a fresh output folder and MLflow store, and prints
``pruned_over_main=X`` (wall clock over wall clock) with both wall clocks, trial counts and Ray Train runs
(first starts and restarts from checkpoints, with their ``startup_s``: :func:`train_starts`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_spec(budget_tokens: int, batch_sizes: list[int], concurrency: int, trials_per_batch_size: int = 1) -> dict:
    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "shakespeare-char.yaml").read_text())
    d["name"] = "overhead-bench"
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    d["budget_tokens"] = budget_tokens
    d["search"].update(
        batch_sizes_sequences=batch_sizes,
        lr_rules=["sqrt"],
        lr_multiplier=[1.0, 1.0],
        beta2={"values": [0.99]},
        trials_per_batch_size=trials_per_batch_size,
        strategy="independent",
        precision=None,
    )
    d["resources"] = {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": concurrency}
    return d


def _plain_trial(args: tuple[dict, int]) -> tuple[float, float, float]:
    """One trial as a plain loop in this process: ``(training wall clock, time to its first report, steps and
    reports, evaluations excluded)`` (s; :func:`steps_time_s`)."""
    spec_dict, b = args
    import torch

    torch.set_num_threads(1)
    from sweeps.launch.trainable import trial_config
    from sweeps.search.searcher import hyperparameters_for
    from sweeps.spec import parse_spec
    from workloads.pretrain import run_pretrain

    spec = parse_spec(spec_dict)
    cfg = trial_config(
        spec,
        {"batch_size_sequences": b, "seed": 0, **hyperparameters_for(spec, b, {})},
        f"plain-{b}",
        data_path=spec.data.path,
    )
    t0 = time.perf_counter()
    first: list[float] = []
    reports: list[dict] = []

    def report(metrics: dict, state) -> None:
        first.append(time.perf_counter() - t0)
        reports.append(metrics)

    run_pretrain(cfg, device=torch.device("cpu"), report=report)
    return time.perf_counter() - t0, first[0], steps_time_s(reports)


def steps_time_s(reports: list[dict]) -> float:
    """A trial's seconds in training steps and reports, evaluations excluded: the sum over its reports of the
    tokens since the previous one over that interval's ``tokens_per_s`` (``workloads/train/loop.py``: each interval
    runs from the previous report's start, so it holds that report and its checkpoint, not the evaluation)."""
    total, prev = 0.0, 0.0
    for r in reports:
        if r.get("tokens_per_s"):
            total += (r["tokens_seen"] - prev) / r["tokens_per_s"]
        prev = r["tokens_seen"]
    return total


def _tune_only_trial(config: dict) -> None:
    """The Tune-only side's function trainable: the plain loop, reporting each milestone to Tune."""
    import torch
    from ray import tune

    torch.set_num_threads(1)
    from sweeps.launch.trainable import trial_config
    from sweeps.search.searcher import hyperparameters_for
    from sweeps.spec import parse_spec
    from workloads.pretrain import run_pretrain

    spec = parse_spec(config["spec"])
    b = int(config["batch_size_sequences"])
    cfg = trial_config(
        spec,
        {"batch_size_sequences": b, "seed": 0, **hyperparameters_for(spec, b, {})},
        tune.get_context().get_trial_id(),
        data_path=spec.data.path,
    )
    run_pretrain(
        cfg,
        device=torch.device("cpu"),
        report=lambda m, s: tune.report({k: v for k, v in m.items() if isinstance(v, (int, float))}),
    )


def tune_only(spec: dict, bs: list[int], concurrency: int, tmp: str) -> float:
    """Wall clock of a hand-written Ray Tune + Optuna + MLflow sweep of the same trials (Ray start included)."""
    t0 = time.perf_counter()
    import ray
    from ray import tune
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune.search.optuna import OptunaSearch

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    try:
        searcher = OptunaSearch(
            space={"batch_size_sequences": tune.choice(sorted(set(bs)))},
            metric="val_loss",
            mode="min",
            points_to_evaluate=[{"batch_size_sequences": b} for b in bs],
        )
        tuner = tune.Tuner(
            tune.with_resources(_tune_only_trial, {"CPU": 1}),
            param_space={"spec": spec},
            tune_config=tune.TuneConfig(
                search_alg=searcher, num_samples=len(bs), max_concurrent_trials=concurrency, reuse_actors=True
            ),
            run_config=tune.RunConfig(
                storage_path=f"{tmp}/tune-only",
                verbose=0,
                callbacks=[
                    MLflowLoggerCallback(tracking_uri=f"sqlite:///{tmp}/tune-only-ml.db", experiment_name="tune-only")
                ],
            ),
        )
        grid = tuner.fit()
        if grid.num_errors:
            raise SystemExit(f"the Tune-only sweep had {grid.num_errors} failed trial(s)")
    finally:
        ray.shutdown()
    return time.perf_counter() - t0


def _run_sweep(spec_path: Path, tmp: str) -> float:
    """``critbatch run SPEC --output TMP/out --tracking-uri sqlite:///TMP/ml.db``; returns its wall clock (s).

    Raises:
        SystemExit: the run exited other than 0 (done) or 1 (the analysis found no answer).
    """
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    t0 = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "critbatch",
            "run",
            str(spec_path),
            "--output",
            f"{tmp}/out",
            "--tracking-uri",
            f"sqlite:///{tmp}/ml.db",
            "--no-progress",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit(f"the sweep {spec_path.name} failed (exit {r.returncode})")
    return wall


def train_starts(out: Path) -> tuple[list[float], list[float]]:
    """``(startup_s of each trial's first Ray Train run, startup_s of each restart)`` from ``OUT/reports/``.

    Every Ray Train run of a trial (the first, and each resume from a checkpoint) reports a new
    ``startup_s`` with its first result; a resume also re-sends the earlier reports, whose values
    repeat, so the distinct values of a trial's file, in order, are its runs.
    """
    first: list[float] = []
    restarts: list[float] = []
    for f in sorted((out / "reports").glob("*.jsonl")):
        seen: list[float] = []
        for line in f.read_text().splitlines():
            v = json.loads(line).get("startup_s") if line.strip() else None
            if v is not None and v not in seen:
                seen.append(v)
        first += seen[:1]
        restarts += seen[1:]
    return first, restarts


def sweep_breakdown(out: Path, started_unix: float, wall_s: float, concurrency: int) -> dict[str, float]:
    """Where a ``critbatch run``'s wall clock went, from its records (1 s resolution in places: file times).

    ``before_sweep_s``: the CLI's start to ``OUT/sweep.json``'s ``created`` (imports, checks, Ray's start, the
    MLflow parent); ``to_first_trial_s``: from there to the first trial's ``params.json``; ``trials_s``: the first
    trial's start to the last trial's ``end.json``, split per slot (sums over trials / ``concurrency``) into
    ``training_s`` (steps and reports, evaluations excluded: :func:`steps_time_s`), ``first_starts_s`` (the ``startup_s`` of each
    runner's first trial), ``later_starts_s`` (the other trials' ``startup_s``) and ``rest_s`` (evaluations,
    the rest of a trial's reports, and slots left idle); ``after_trials_s``: the last ``end.json`` to the CLI's exit
    (the analysis, the report, the records, Ray's stop). ``training_total_s`` is the sum over trials.
    """
    created = json.loads((out / "sweep.json").read_text())["created"]
    trials = []
    for f in sorted((out / "reports").glob("*.jsonl")):
        tid = f.name[: -len(".jsonl")]
        reps = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        start = (out / "reports" / f"{tid}.params.json").stat().st_mtime
        end = (out / "reports" / f"{tid}.end.json").stat().st_mtime
        trials.append((start, end, reps[0].get("startup_s") or 0.0, steps_time_s(reps)))
    trials.sort()
    first, last_end = trials[0][0], max(t[1] for t in trials)
    span = last_end - first
    training = sum(t[3] for t in trials)
    starts = [t[2] for t in trials]
    b = {
        "before_sweep_s": created - started_unix,
        "to_first_trial_s": first - created,
        "trials_s": span,
        "training_s": training / concurrency,
        "first_starts_s": sum(starts[:concurrency]) / concurrency,
        "later_starts_s": sum(starts[concurrency:]) / concurrency,
        "after_trials_s": started_unix + wall_s - last_end,
        "training_total_s": training,
    }
    b["rest_s"] = span - b["training_s"] - b["first_starts_s"] - b["later_starts_s"]
    return b


def pruned_over_main() -> None:
    """The ``--pruned`` mode (module docstring)."""
    walls = {}
    for example in ("shakespeare-char.yaml", "shakespeare-char-pruned.yaml"):
        with tempfile.TemporaryDirectory() as tmp:
            walls[example] = _run_sweep(ROOT / "sweeps" / "examples" / example, tmp)
            out = Path(tmp, "out")
            trials = json.loads((out / "cbs.json").read_text())["trials"]
            first, restarts = train_starts(out)

        def med(xs):
            return statistics.median(xs) if xs else float("nan")

        print(
            f"{example}: {walls[example]:.1f} s wall; trials {trials}; Ray Train runs: {len(first)} first "
            f"(startup_s median {med(first):.1f}, sum {sum(first):.0f}), {len(restarts)} restarts "
            f"(median {med(restarts):.1f}, sum {sum(restarts):.0f})"
        )
    print(f"pruned_over_main={walls['shakespeare-char-pruned.yaml'] / walls['shakespeare-char.yaml']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-tokens", type=int, default=262144)
    ap.add_argument("--batch-sizes", default="4,8,16,32,64,128,256")
    ap.add_argument("--trials-per-batch-size", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--no-tune-only", action="store_true", help="skip the hand-written Ray Tune sweep")
    ap.add_argument("--pruned", action="store_true", help="only the pruned example's wall clock over the main job's")
    a = ap.parse_args()
    if a.pruned:
        return pruned_over_main()
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    bs = [b for b in sizes for _ in range(a.trials_per_batch_size)]  # every trial, in the sweep's order
    spec = make_spec(a.budget_tokens, sizes, a.concurrency, a.trials_per_batch_size)

    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(a.concurrency) as pool:
        plain_rows = pool.map(_plain_trial, [(spec, b) for b in bs], chunksize=1)
    plain = time.perf_counter() - t0
    per_trial = [r[0] for r in plain_rows]
    plain_steps = sum(r[2] for r in plain_rows)
    plain_first = {b: statistics.mean(r[1] for b_, r in zip(bs, plain_rows) if b_ == b) for b in sizes}
    print(
        f"plain: {plain:.1f} s wall for {len(bs)} trials (training {sum(per_trial):.1f} s in all; "
        f"first report after {statistics.median(r[1] for r in plain_rows):.2f} s median)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        tune_s = None
        if not a.no_tune_only:
            tune_s = tune_only(spec, bs, a.concurrency, tmp)
            print(
                f"tune-only: {tune_s:.1f} s wall (Ray Tune + OptunaSearch + MLflowLoggerCallback, no Ray Train, "
                f"actors reused)"
            )
        p = Path(tmp) / "spec.yaml"
        p.write_text(yaml.safe_dump(spec))
        started_unix = time.time()
        sweep = _run_sweep(p, tmp)
        br = sweep_breakdown(Path(tmp, "out"), started_unix, sweep, a.concurrency)
        rows = []
        for f in sorted(Path(tmp, "out", "tune").glob("**/result.json")):
            rows.append([json.loads(x) for x in f.read_text().splitlines() if x.strip()])
        rows.sort(key=lambda r: r[0]["timestamp"] - r[0]["time_total_s"])  # by the trial's start
        fixed = [r[0]["time_total_s"] - plain_first[int(r[0]["config"]["batch_size_sequences"])] for r in rows]
        later = fixed[a.concurrency :] or fixed
        total = [r[-1]["time_total_s"] for r in rows]
        print(
            f"sweep: {sweep:.1f} s wall, {len(rows)} trials; fixed cost per trial (first report, sweep - plain) "
            f"in start order: {', '.join(f'{x:.1f}' for x in fixed)} s"
        )
        print(
            f"plain-loop training time per trial ~{sum(per_trial) / len(per_trial):.1f} s; sweep trial time "
            f"~{sum(total) / len(total):.1f} s; sweep minus plain wall clock {sweep - plain:.1f} s"
        )
        print(
            "sweep wall clock by part (s; the trials' span per slot): "
            + ", ".join(f"{k}={v:.1f}" for k, v in br.items() if k != "training_total_s")
            + f"; steps and reports in all {br['training_total_s']:.1f} s (plain loops: {plain_steps:.1f} s of "
            f"{sum(per_trial):.1f} s)"
        )
    extra = "" if tune_s is None else f" tune_only_ratio={tune_s / plain:.3f} sweep_over_tune_only={sweep / tune_s:.3f}"
    print(f"ratio={sweep / plain:.3f}{extra} fixed_cost_s={statistics.median(later):.1f}")


if __name__ == "__main__":
    main()
