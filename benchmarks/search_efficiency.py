"""Search efficiency: the critical batch size from a pruned search, for a fraction of a full grid's FLOPs.

    python benchmarks/search_efficiency.py [--quick] [--searches 5] [--trials-per-batch-size 4]
        [--multipliers 0.7,1,1.4,2,2.8,4] [--grace-fraction G] [--reduction-factor R]
        [--rule loss_at_rung|predicted_final] [--fit-fractions 0.5,0.75,1] [--margin M]
        [--min-trials-per-rung N] [--mode stop|pause] [--no-pruning] [--concurrency 2] [--jobs 2]

1. **Full grid.** Every batch size of the Shakespeare example (``sweeps/examples/shakespeare-char.yaml``)
   times every LR multiplier of ``--multipliers`` (square-root rule, one beta2 half-life, seed 0),
   each trained for the example's token budget by ``workloads.pretrain.run_pretrain`` (plain PyTorch,
   ``--jobs`` processes of one thread). Each trial's milestone curve (tokens, FLOPs, validation loss,
   seconds since the trial started) is cached as JSON in ``benchmarks/cache/search_efficiency/``, keyed
   by a hash of its full trial config, so reruns train nothing. ``sweeps.analysis.analyze_trials``
   gives the grid's ``b_crit`` and its 95 % bootstrap interval.
2. **Pruned searches.** ``--searches`` times (search seed 0, 1, ...): per batch size, an Optuna TPE
   study (the sampler ``BatchSizeSearcher`` uses, seeded the same way) proposes LR multipliers from the
   same grid, ``--trials-per-batch-size`` distinct ones; trials run ``--concurrency`` at a time,
   handed out round-robin over batch sizes as ``BatchSizeSearcher`` does, every trial training at the
   same FLOP rate (the clock is FLOPs, so the replay does not depend on the machine's load; only
   the order of trials of one batch size matters to the decisions, and their steps cost the same);
   every report goes through ``sweeps.pruning.scheduler.EqualComputeScheduler`` (the spec's default pruning
   section, or ``--grace-fraction``/``--reduction-factor``/``--rule``/``--fit-fractions``/``--margin``/
   ``--min-trials-per-rung``/``--mode``, the ``pruning`` fields of the same names; ``--no-pruning`` for the same
   searches without early stopping), which stops trials at its FLOP rungs; a stopped trial is told
   to its study as PRUNED. In ``mode: pause`` a trial at a rung frees its slot and waits; promoted, it
   resumes (first, before new trials) from where it stopped, as a real sweep does from its checkpoint. Training is deterministic for a fixed config and seed, so a trial's curve up
   to where it was stopped is the cached curve: replaying it is what running it again would report.
   The FLOPs a search spends are the training FLOPs of every trial up to its last report. Its
   ``b_crit`` is analysed at the grid's target loss.
3. The last line: ``flops_fraction=X within_ci=yes|no`` (``X``: the searches' median FLOPs over the
   grid's; ``yes`` when every search's ``b_crit`` lies in the grid's interval).

``--quick`` runs a tiny model on a few batch sizes, to check the script end to end in about a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the product (Optuna, Ray Tune) is imported where it is used, so that --help answers at once
if TYPE_CHECKING:
    from sweeps.analysis import TrialRecord
    from sweeps.spec import SweepSpec

CACHE = ROOT / "benchmarks" / "cache" / "search_efficiency"
HALF_LIFE_TOKENS = 32768.0  # beta2 token half-life of every trial (the example's range is 8 Ki - 128 Ki)


def make_spec(
    quick: bool,
    multipliers: list[float],
    trials_per_batch_size: int,
    concurrency: int,
    pruning: dict[str, Any] | None = None,
) -> SweepSpec:
    """The benchmark's spec: the Shakespeare example with the searched dimensions narrowed to the grid's LR
    multipliers, pruning on (``pruning`` overrides its fields); ``quick``: a tiny model on 4 batch sizes."""
    from sweeps.spec import parse_spec

    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "shakespeare-char.yaml").read_text())
    d["name"] = "search-efficiency"
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    # the grid that was trained and cached (the example's budget and evaluation when it was measured)
    d["budget_tokens"] = 393216
    d["eval"] = {"milestones": 16, "eval_tokens": 16384}
    d["search"].update(
        lr_rules=["sqrt"],
        lr_multiplier=[min(multipliers), max(multipliers)],
        beta2={"half_life_tokens": [HALF_LIFE_TOKENS, HALF_LIFE_TOKENS]},
        trials_per_batch_size=min(trials_per_batch_size, len(multipliers)),
    )
    # what this replays: per batch size an Optuna study of its own sampling LR multipliers (search.strategy
    # independent), the planned trials only (no search.precision waves); the example's transfer and waves are
    # measured in benchmarks/search_placement.py, and neither runs with pruning.mode pause (the default here)
    d["search"]["strategy"] = "independent"
    d["search"].pop("precision", None)
    d["resources"]["max_concurrent_trials"] = concurrency
    d["pruning"] = {"enabled": True, **(pruning or {})}
    if quick:
        d["model"] = {"family": "llama", "d_model": 32, "n_layers": 1, "n_heads": 2, "context_length_tokens": 32}
        d["budget_tokens"] = 16384
        d["schedule"] = {"warmup_tokens": 1024, "ema_half_life_tokens": 2048}
        d["eval"] = {"milestones": 8, "eval_tokens": 2048}
        d["search"].update(batch_sizes_sequences=[4, 8, 16, 32], base_batch_size_sequences=8)
        d.pop("targets", None)  # the example's fixed losses are out of this model's reach: chosen from the curves
    return parse_spec(d)


# ---- the full grid: real training, cached ------------------------------------------------------------------


def _with_data_path(d: dict[str, Any], path: str) -> dict[str, Any]:
    """A copy of a ``TrialConfig`` dict whose ``workload.data.path`` is ``path``."""
    data = {**d["workload"]["data"], "path": path}
    return {**d, "workload": {**d["workload"], "data": data}}


def trial_dict(spec: SweepSpec, b: int, m: float) -> dict[str, Any]:
    """The grid trial at batch size ``b`` and LR multiplier ``m`` as a ``TrialConfig`` dict (its data path
    relative to the repo, so the cache key does not depend on the checkout)."""
    from sweeps.launch.trainable import trial_config
    from sweeps.search.space import hyperparameters_for

    cfg = {"batch_size_sequences": b, "seed": spec.seeds[0], **hyperparameters_for(spec, b, {"lr_multiplier": m})}
    d = trial_config(spec, cfg, f"grid-B{b}-m{m:g}", data_path=spec.data.path).to_dict()
    # the key must not depend on the checkout
    return _with_data_path(d, str(Path(d["workload"]["data"]["path"]).relative_to(ROOT)))


def cache_key(d: dict[str, Any]) -> str:
    """The cache file of a trial: a hash of its ``TrialConfig`` dict without its id.

    The keys changed with every change of the trial config (``warmup_min_steps``, then the
    nested configs): the cached curves under benchmarks/cache/ were trained by the code
    before ``warmup_min_steps`` and no longer match a key; a rerun trains the grid again.
    """
    blob = json.dumps({k: v for k, v in d.items() if k != "trial_id"}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _warm() -> None:
    """Pool initializer: the imports, so that a trial's seconds are its own."""
    import torch

    torch.set_num_threads(1)
    import workloads.pretrain  # noqa: F401


def _train(d: dict[str, Any]) -> dict[str, Any]:
    """Run one trial with one thread; returns its curve."""
    import torch

    torch.set_num_threads(1)
    from workloads.api import TrialConfig, get_workload

    relative = d["workload"]["data"]["path"]
    cfg = TrialConfig.from_dict(_with_data_path(d, str(ROOT / relative)))
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def report(metrics: dict[str, Any], state: Any) -> None:
        rows.append(
            {
                "tokens": metrics["tokens_seen"],
                "flops": metrics["flops"],
                "val_loss": metrics["val_loss"],
                "seconds": time.perf_counter() - t0,
                "status": metrics["status"],
            }
        )

    get_workload("pretrain").train(cfg, device=torch.device("cpu"), report=report)
    return {"config": d, "curve": rows}


def run_grid(spec: SweepSpec, multipliers: list[float], jobs: int) -> dict[tuple[int, float], dict[str, Any]]:
    """Every ``(batch size, multiplier)`` trial's output (config and curve), trained with ``jobs`` processes where
    not cached yet."""
    CACHE.mkdir(parents=True, exist_ok=True)
    want = {(b, m): trial_dict(spec, b, m) for b in spec.search.batch_sizes_sequences for m in multipliers}
    missing = [(k, d) for k, d in want.items() if not (CACHE / f"{cache_key(d)}.json").is_file()]
    print(
        f"grid: {len(want)} trials, {len(want) - len(missing)} cached, training {len(missing)} "
        f"({jobs} process(es) of one thread)",
        flush=True,
    )
    if missing:
        t0 = time.perf_counter()
        # the slowest (smallest batch) first, so the pool ends together
        missing.sort(key=lambda kd: kd[0][0])
        with mp.get_context("spawn").Pool(jobs, initializer=_warm) as pool:
            for (key, d), out in zip(missing, pool.imap(_train, [d for _, d in missing])):
                (CACHE / f"{cache_key(d)}.json").write_text(json.dumps(out))
                c = out["curve"][-1]
                print(
                    f"  B={key[0]:<4} m={key[1]:<5g} val_loss={c['val_loss']:.4f} ({c['seconds']:.0f} s, "
                    f"{time.perf_counter() - t0:.0f} s elapsed)",
                    flush=True,
                )
    return {k: json.loads((CACHE / f"{cache_key(d)}.json").read_text()) for k, d in want.items()}


def record(tid: str, b: int, m: float, spec: SweepSpec, curve: list[dict[str, Any]], status: str) -> TrialRecord:
    """A trial's curve (cached or replayed) as the analysis reads it."""
    from sweeps.analysis import TrialRecord
    from sweeps.search.space import hyperparameters_for

    hp = hyperparameters_for(spec, b, {"lr_multiplier": m})
    return TrialRecord(
        trial_id=tid,
        batch_size_sequences=b,
        seed=spec.seeds[0],
        group_id=tid,
        status=status,
        hyperparameters=hp,
        tokens=[r["tokens"] for r in curve],
        val_loss=[r["val_loss"] if r["val_loss"] is not None else math.nan for r in curve],
        flops=[r["flops"] for r in curve],
    )


def status_of(curve: list[dict[str, Any]]) -> str:
    """``DIVERGED`` if the curve's last report says so, else ``COMPLETED``."""
    return "DIVERGED" if curve and curve[-1]["status"] == "diverged" else "COMPLETED"


def analyse(spec: SweepSpec, records: list[TrialRecord], targets: list[float] | None) -> dict[str, Any]:
    """``sweeps.analysis.analyze_trials`` on ``records`` at ``targets``, as the sweep's ``cbs.json``."""
    from sweeps.analysis import analyze_trials

    return analyze_trials(
        records,
        context_length_tokens=spec.model.context_length_tokens,
        reference_batch=float(spec.search.base_batch_size_sequences),
        targets=targets,
    )


# ---- one pruned search, replayed on the cached curves --------------------------------------------------------


@dataclass
class _Running:
    tid: str
    b: int
    m: float
    ot_trial: Any
    curve: list[dict[str, Any]]
    start: float  # on the FLOP clock
    seen: list[dict[str, Any]] = field(default_factory=list)


def pruned_search(
    spec: SweepSpec,
    grid: dict[tuple[int, float], dict[str, Any]],
    multipliers: list[float],
    search_seed: int,
    prune: bool = True,
) -> tuple[list[TrialRecord], float, int]:
    """One pruned search (module docstring, step 2). Returns its records, the FLOPs spent and how many
    times a paused trial was resumed (``mode: pause``: each resume restarts a Ray Train run).

    ``prune=False``: the same search without early stopping (every trial trains its budget)."""
    import optuna

    from sweeps.pruning.scheduler import EqualComputeScheduler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    batches = list(spec.search.batch_sizes_sequences)
    k = spec.search.trials_per_batch_size
    dist = {"lr_multiplier": optuna.distributions.CategoricalDistribution(multipliers)}
    studies = {
        b: optuna.create_study(
            direction="minimize", sampler=optuna.samplers.TPESampler(seed=(search_seed * 7919 + b) % 2**31)
        )
        for b in batches
    }
    tried: dict[int, dict[float, tuple[str, float | None]]] = {b: {} for b in batches}  # m -> outcome
    assigned = {b: 0 for b in batches}
    sched = EqualComputeScheduler.from_spec(spec) if prune else None
    if sched is not None:
        sched.annotator().setup()
    records: list[TrialRecord] = []
    spent = 0.0
    rr = 0
    events: list[tuple[float, int, str]] = []  # (FLOP clock, sequence, trial id)
    running: dict[str, _Running] = {}
    seq = 0

    def ask(b: int):
        """A multiplier not yet run at this batch size: a repeat is told its known outcome at no cost
        (FAIL while the first run is still going), and the sampler is asked again."""
        for _ in range(1000):
            t = studies[b].ask(dist)
            m = t.params["lr_multiplier"]
            if m not in tried[b]:
                return t, m
            state, value = tried[b][m]
            studies[b].tell(t, value, state=getattr(optuna.trial.TrialState, state))
        raise RuntimeError(f"the sampler keeps proposing multipliers already run at B={b}")

    def start(now: float) -> bool:
        nonlocal rr, seq
        for i in range(len(batches)):
            b = batches[(rr + i) % len(batches)]
            if assigned[b] < min(k, len(multipliers)):
                rr = (rr + i + 1) % len(batches)
                assigned[b] += 1
                t, m = ask(b)
                tid = f"s{search_seed}-B{b}-{assigned[b]}"
                run = _Running(tid, b, m, t, grid[(b, m)]["curve"], now)
                tried[b][m] = ("FAIL", None)  # until it ends
                running[tid] = run
                if sched is not None and sched.mode == "pause":
                    sched.add_member(tid, b)
                seq += 1
                heapq.heappush(events, (now + run.curve[0]["flops"], seq, tid))
                return True
        return False

    pause = sched is not None and sched.mode == "pause"
    paused: dict[str, _Running] = {}
    resumes = 0
    conc = spec.resources.max_concurrent_trials

    def finish(run: _Running, pruned: bool) -> None:
        nonlocal spent
        spent += run.seen[-1]["flops"]
        if pruned:
            status, value = "PRUNED", None
        else:
            status = status_of(run.curve)
            value = run.seen[-1]["val_loss"] if status == "COMPLETED" else None
        state = "PRUNED" if status == "PRUNED" else ("COMPLETE" if value is not None else "FAIL")
        studies[run.b].tell(run.ot_trial, value, state=getattr(optuna.trial.TrialState, state))
        tried[run.b][run.m] = (state, value)
        records.append(record(run.tid, run.b, run.m, spec, run.seen, status))

    def schedule_next(run: _Running) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (run.start + run.curve[len(run.seen)]["flops"], seq, run.tid))

    def fill(now: float) -> None:
        """Prune what the scheduler pruned while paused; resume the promoted trials, then start new ones."""
        nonlocal resumes
        if pause:
            while sched.to_prune:
                finish(paused.pop(sched.to_prune.pop(0)), pruned=True)
        while len(running) < conc:
            if pause and sched.to_resume:
                run = paused.pop(sched.to_resume.pop(0))
                run.start = now - run.seen[-1]["flops"]  # it goes on from its checkpoint at the rung
                resumes += 1
                running[run.tid] = run
                schedule_next(run)
            elif not start(now):
                break

    fill(0.0)
    now = 0.0
    while events or (pause and sched.waiting):
        if not events:  # nothing runs and nothing new can start: decide the lowest waiting rung as it is
            sched.force_lowest()
            fill(now)
            continue
        now, _, tid = heapq.heappop(events)
        run = running[tid]
        row = run.curve[len(run.seen)]
        run.seen.append(row)
        loss = row["val_loss"] if row["val_loss"] is not None else math.nan
        done = len(run.seen) == len(run.curve)
        if pause:
            decision = sched.report(tid, run.b, row["flops"], row["tokens"], loss).upper()
        else:
            decision = (
                "CONTINUE"
                if sched is None
                else sched.on_trial_result(
                    None,
                    SimpleNamespace(trial_id=tid, config={"batch_size_sequences": run.b}),
                    {"tokens_seen": row["tokens"], "flops": row["flops"], "val_loss": loss},
                )
            )
        if decision == "STOP" or done:
            del running[tid]
            finish(run, pruned=decision == "STOP")
            if pause and decision != "STOP":
                sched.end(tid)
        elif decision == "PAUSE":
            paused[tid] = running.pop(tid)
        else:
            schedule_next(run)
        fill(now)
    return records, spent, resumes


# ---- main -------------------------------------------------------------------------------------------------------


def main() -> None:
    """Parse the arguments, then train (or read) the grid and replay the searches (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model on 4 batch sizes (checks the script)")
    ap.add_argument("--searches", type=int, default=5, help="pruned searches (search seeds 0, 1, ...)")
    ap.add_argument(
        "--trials-per-batch-size",
        type=int,
        default=4,
        help="distinct LR multipliers each search tries (3 of 6 misses the interval even unpruned)",
    )
    ap.add_argument("--multipliers", default="0.7,1,1.4,2,2.8,4", help="the grid's LR multipliers (sqrt rule)")
    ap.add_argument("--concurrency", type=int, default=2, help="trials at once in the pruned searches")
    ap.add_argument("--grace-fraction", type=float, default=None, help="pruning.grace_fraction (default: the spec's)")
    ap.add_argument(
        "--reduction-factor", type=float, default=None, help="pruning.reduction_factor (default: the spec's)"
    )
    ap.add_argument(
        "--rule", choices=["loss_at_rung", "predicted_final"], default=None, help="pruning.rule (default: the spec's)"
    )
    ap.add_argument(
        "--fit-fractions", default=None, help="pruning.fit_fractions, comma-separated (default: the spec's)"
    )
    ap.add_argument(
        "--min-trials-per-rung", type=int, default=None, help="pruning.min_trials_per_rung (default: the spec's)"
    )
    ap.add_argument("--margin", type=float, default=None, help="pruning.margin in nats (default: the spec's)")
    ap.add_argument("--mode", choices=["stop", "pause"], default=None, help="pruning.mode (default: the spec's)")
    ap.add_argument("--no-pruning", action="store_true", help="the same searches without early stopping (a baseline)")
    ap.add_argument("--jobs", type=int, default=2, help="processes training the grid")
    a = ap.parse_args()
    from sweeps.pruning.scheduler import EqualComputeScheduler

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # bootstrap percentiles over unbounded resamples
    multipliers = sorted(float(x) for x in a.multipliers.split(","))
    if a.quick and a.multipliers == ap.get_default("multipliers"):
        multipliers = [0.5, 1.0, 2.0]
    fit = [float(x) for x in a.fit_fractions.split(",")] if a.fit_fractions else None
    pruning = {
        k: v
        for k, v in (
            ("grace_fraction", a.grace_fraction),
            ("reduction_factor", a.reduction_factor),
            ("rule", a.rule),
            ("fit_fractions", fit),
            ("min_trials_per_rung", a.min_trials_per_rung),
            ("margin", a.margin),
            ("mode", a.mode),
        )
        if v is not None
    }
    spec = make_spec(a.quick, multipliers, a.trials_per_batch_size, a.concurrency, pruning)
    batches = spec.search.batch_sizes_sequences

    grid = run_grid(spec, multipliers, a.jobs)
    grid_records = [
        record(f"grid-B{b}-m{m:g}", b, m, spec, out["curve"], status_of(out["curve"])) for (b, m), out in grid.items()
    ]
    grid_flops = sum(r.flops[-1] for r in grid_records)
    ga = analyse(spec, grid_records, spec.targets)
    if ga.get("b_crit") is None or not ga.get("b_crit_ci"):
        print(f"grid: no b_crit ({ga.get('status')}: {ga.get('message')})")
        print("flops_fraction=nan within_ci=no")
        return
    lo, hi = ga["b_crit_ci"][0], ga["b_crit_ci"][1] if ga["b_crit_ci"][1] is not None else math.inf
    target = ga["target_loss"]
    best = {p["batch_size_sequences"]: p["best_config_at_budget"]["lr_multiplier"] for p in ga["per_batch"]}
    print(
        f"grid: {len(grid_records)} trials ({len(batches)} batch sizes x {len(multipliers)} LR multipliers), "
        f"{grid_flops:.4g} training FLOPs; target loss {target:.4f}: b_crit {ga['b_crit']:.1f} sequences, "
        f"95% CI [{lo:.1f}, {hi:.1f}]; best multiplier per batch size {best}"
    )

    fractions, inside = [], []
    for s in range(a.searches):
        records, spent, resumes = pruned_search(spec, grid, multipliers, s, prune=not a.no_pruning)
        pa = analyse(spec, records, [target])
        frac = spent / grid_flops
        fractions.append(frac)
        b = pa.get("b_crit")
        ok = b is not None and lo <= b <= hi
        inside.append(ok)
        counts = {k: v for k, v in pa["trials"].items() if v}
        far = (
            f"{b:.1f} sequences ({math.log2(b / ga['b_crit']):+.2f} octaves from the grid's)"
            if b
            else f"none ({pa.get('status')}: {pa.get('b_crit_bound') or pa.get('message')})"
        )
        restarts = f", {resumes} resumed from a rung" if resumes else ""
        print(
            f"search seed {s}: {len(records)} trials {counts}{restarts}, {spent:.4g} FLOPs = {frac:.3f} of the grid; "
            f"b_crit {far}; {'inside' if ok else 'outside'} the grid's CI"
        )
    p = spec.pruning
    what = (
        "without pruning"
        if a.no_pruning
        else (
            f"rungs at {[round(f, 3) for f in EqualComputeScheduler.from_spec(spec).fractions]} of the trial budget, "
            f"reduction factor {p.reduction_factor:g}, rule {p.rule}"
            + (
                f" (fit points at {[round(q, 3) for q in p.fit_fractions]} of the rung)"
                if p.rule == "predicted_final"
                else ""
            )
            + (f", those within {p.margin:g} nats of the best continue" if p.margin is not None else "")
            + (f", {p.min_trials_per_rung} values per rung before stopping" if p.min_trials_per_rung != 2 else "")
            + (", each rung waits paused for the whole batch size (mode pause)" if p.mode == "pause" else "")
        )
    )
    print(f"searches: {spec.search.trials_per_batch_size} of {len(multipliers)} multipliers per batch size, {what}")
    med = statistics.median(fractions)
    print(f"{sum(inside)}/{len(inside)} searches inside the grid's CI; median FLOPs fraction {med:.3f}")
    print(f"flops_fraction={med:.3f} within_ci={'yes' if all(inside) else 'no'}")


if __name__ == "__main__":
    main()
