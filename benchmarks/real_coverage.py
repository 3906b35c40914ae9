"""Real-training coverage of ``b_crit``'s interval: the product's own search, ``search.precision`` waves and
analysis, replayed against a cached grid of real training curves of the main job (``benchmarks/real_grid.py``),
one replay per training seed, each scored against a reference measured on the whole grid.

    python benchmarks/real_coverage.py                           # the shipped code, every cached seed
    python benchmarks/real_coverage.py --baseline-rev f89663f    # the same, plus the code at a git revision
    python benchmarks/real_coverage.py --train-missing           # train the grid cells a replay asks for

**The replay.** For each training seed ``k`` the main job's spec (``sweeps/examples/shakespeare-char.yaml``)
with ``seeds: [k]`` is run through :class:`sweeps.search.searcher.BatchSizeSearcher` (its Optuna studies in a
real SQLite storage) as Ray Tune would run it with ``max_concurrent_trials`` slots (a free slot asks for a
trial; the earliest started trial ends first), ``search.precision``'s waves refitting with
:func:`sweeps.run.finish.sweep_analysis`, and the final analysis as ``cbs.json`` gets it. Each trial's curve is
the grid's cell at its (seed, batch size, LR), cut to its budget and its ``stop_at_loss`` as the training loop
cuts it. Training is deterministic and the grid was trained by the trial runners' own code, so a replayed
trial's curve is the one the sweep would get (``tests/benchmarks/test_real_grid.py``). An LR off the grid's
lattice (code that does not snap LRs to it) gets a curve interpolated linearly in log LR between its two
lattice neighbours, milestone by milestone; the output counts those trials (``interpolated_trials=``).

**The reference** at a target loss: per batch size of the grid (:data:`real_grid.REFERENCE_BATCH_SIZES`), the
fastest lattice LR by the mean over every cached seed of log steps to the target (only LRs that every seed's
curve brings there), its steps the geometric mean over the seeds; those points fitted by
:func:`sweeps.analysis.fit.analyze_points`. Batch sizes whose best LR does not reach the target in every seed
are left out of the reference (the output says which).

**Scored** at each target of each replay's ``cbs.json`` (its declared targets): ``coverage=`` (the 95 %
interval holds the reference; an open end counts as open; a target with no interval counts as covered and is
counted in ``no_interval=``), ``median_width_ratio=`` (upper / lower end), ``median_log2_bias=`` (log2 of the
estimate over the reference), ``compute_trials=`` (tokens trained in token budgets, the mean over replays),
per target and overall; and the headline target's coverage.

What it does not show: other models, corpora or budgets than the main job's; seeds beyond those cached; the
order in which trials end under a real Ray Tune (here the earliest started ends first, which with two slots and
two trials per batch size hands out the same trials); the reference is itself an estimate (its own interval is
printed beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _code_root_from_argv() -> Path:
    """``--code-root DIR`` (the product code to replay; default this checkout), read before anything imports it."""
    argv = sys.argv
    for i, a in enumerate(argv):
        if a == "--code-root" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if a.startswith("--code-root="):
            return Path(a.split("=", 1)[1]).resolve()
    return ROOT


CODE_ROOT = _code_root_from_argv()
sys.path.insert(0, str(CODE_ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))

import numpy as np
import real_grid


def _code_of_sweeps() -> Path:
    """The checkout whose ``sweeps`` package this process replays (it must be ``CODE_ROOT``'s)."""
    import sweeps

    return Path(sweeps.__file__).resolve().parents[1]


FIXED_TARGETS_NOTE = "the spec's targets"


class CellMissing(Exception):
    """A replay asked for grid cells the cache lacks."""

    def __init__(self, cells: set[tuple[int, int, int, int]]):
        super().__init__(f"{len(cells)} grid cell(s) missing")
        self.cells = cells


class Grid:
    """The cached curves, looked up by (seed, batch size, LR, budget multiple)."""

    def __init__(self, cells: dict[tuple[int, int, int], dict[str, Any]], base_lr: float):
        self.cells, self.base_lr = cells, base_lr
        self.missing: set[tuple[int, int, int, int]] = set()
        self.interpolated = 0

    def _cell(self, seed: int, b: int, k: int, m: int) -> dict[str, Any] | None:
        c = self.cells.get((seed, b, k))
        if c is None or c["budget_multiple"] < m:
            self.missing.add((seed, b, k, max(m, real_grid.budget_multiple(b))))
            return None
        return c

    def curve(self, seed: int, b: int, lr: float, m: int) -> tuple[list[float], list[float | None], str]:
        """``(tokens, val_loss, status)`` of a trial at ``lr`` trained for ``m`` budgets (uncut)."""
        x = math.log2(lr / self.base_lr) / real_grid.LATTICE_OCTAVES
        k = round(x)
        if abs(x - k) < 1e-6:
            c = self._cell(seed, b, k, m)
            if c is None:
                raise CellMissing(self.missing)
            return c["tokens"], c["val_loss"], c["status"]
        lo = math.floor(x)
        w = x - lo
        a, z = self._cell(seed, b, lo, m), self._cell(seed, b, lo + 1, m)
        if a is None or z is None:
            raise CellMissing(self.missing)
        self.interpolated += 1
        n = min(len(a["tokens"]), len(z["tokens"]))
        if len(a["tokens"]) != len(z["tokens"]):  # one diverged early: the nearer decides the rest
            near = a if w < 0.5 else z
            n = len(near["tokens"])
        losses = []
        for i in range(n):
            la = a["val_loss"][i] if i < len(a["val_loss"]) else None
            lz = z["val_loss"][i] if i < len(z["val_loss"]) else None
            if la is None or lz is None:
                losses.append(la if w < 0.5 else lz)
            else:
                losses.append((1 - w) * la + w * lz)
        tokens = (a if len(a["tokens"]) >= n else z)["tokens"][:n]
        status = a["status"] if w < 0.5 else z["status"]
        return tokens, losses, status


def cut(
    tokens: list[float], losses: list[float | None], budget_tokens: float, stop_at_loss: float | None
) -> tuple[list[float], list[float]]:
    """A curve cut to a trial's budget and, with ``stop_at_loss``, to its first milestone at or below it (as
    ``workloads/train/loop.py`` ends such a trial); a non-finite loss ends it (a diverged trial)."""
    out_t, out_l = [], []
    for t, l in zip(tokens, losses):
        if t > budget_tokens + 0.5:
            break
        out_t.append(float(t))
        out_l.append(float(l) if l is not None else math.nan)
        if l is None or not math.isfinite(l):
            break
        if stop_at_loss is not None and l <= stop_at_loss:
            break
    return out_t, out_l


def replay(spec: Any, grid: Grid, seeds: list[int], workdir: Path) -> dict[str, Any]:
    """One sweep of ``spec`` with ``seeds``, replayed on ``grid``: its analysis (``cbs.json``'s content) and
    ``compute_budgets`` (tokens trained over the token budget, per seed)."""
    from sweeps.analysis import TrialRecord
    from sweeps.run.finish import sweep_analysis
    from sweeps.search.objective import OBJECTIVE
    from sweeps.search.searcher import BatchSizeSearcher

    spec = spec.model_copy(update={"seeds": list(seeds)})
    name = "-".join(map(str, seeds))
    storage = f"sqlite:///{workdir / f'optuna-{name}.db'}"
    searcher = BatchSizeSearcher(spec, storage_url=storage, study_prefix=f"replay-{name}")
    records: list[Any] = []
    tps = float(spec.model.context_length_tokens)
    searcher.attach_records(lambda: list(records))
    state: dict[str, Any] = {"targets": None}

    def analyse(targets: list[float] | None) -> tuple[dict[str, Any], list]:
        return sweep_analysis(spec, list(records), 1.0, targets=targets, tokens_per_seq=tps).to_json_dict(), list(
            records
        )

    def report(waves: Any, outcome: Any, planned: int, targets: list[float] | None) -> None:
        state["targets"], state["outcome"] = targets, outcome

    if spec.search.precision is not None:
        searcher.attach_precision(analyse, report)
    slots = spec.resources.max_concurrent_trials
    running: list[tuple[str, dict[str, Any]]] = []
    n, finished = 0, False
    while True:
        while not finished and len(running) < slots and n < spec.max_tune_trials:
            tid = f"t{n:04d}"
            cfg = searcher.suggest(tid)
            if cfg is None:
                break
            if cfg == "FINISHED" or cfg is BatchSizeSearcher.FINISHED:
                finished = True
                break
            running.append((tid, cfg))
            n += 1
        if not running:
            break
        tid, cfg = running.pop(0)
        b, lr = int(cfg["batch_size_sequences"]), float(cfg["lr"])
        budget = float(cfg.get("budget_tokens") or spec.budget_tokens)
        m = int(round(budget / spec.budget_tokens))
        seed = int(cfg["seed"])
        tokens, losses, status = grid.curve(seed, b, lr, m)
        tok, loss = cut(tokens, losses, budget, cfg.get("stop_at_loss"))
        diverged = not loss or not math.isfinite(loss[-1])
        rec = TrialRecord(
            trial_id=tid,
            batch_size_sequences=b,
            seed=seed,
            group_id=str(cfg.get("group_id", tid)),
            status="DIVERGED" if diverged else "COMPLETED",
            hyperparameters={
                k: cfg.get(k) for k in ("lr_rule", "lr_multiplier", "lr", "beta2", "beta2_half_life_tokens")
            },
            tokens=tok,
            val_loss=loss,
            flops=[t * 1.0 for t in tok],
        )
        records.append(rec)
        objective = math.log(256.0) if diverged else loss[-1]
        searcher.on_trial_complete(tid, {OBJECTIVE: objective, "val_loss": None if diverged else loss[-1]})
    targets = state["targets"]
    analysis = sweep_analysis(spec, list(records), 1.0, targets=targets, tokens_per_seq=tps).to_json_dict()
    analysis["compute_budgets"] = sum(max(r.tokens) for r in records if r.tokens) / spec.budget_tokens / len(seeds)
    analysis["n_trials"] = len(records)
    analysis["replay_outcome"] = state.get("outcome")
    analysis["replay_waves"] = list(getattr(searcher, "waves", []) or [])
    analysis["replay_trials"] = [r.to_dict() for r in records]
    return analysis


def reference(
    grid_cells: dict[tuple[int, int, int], dict[str, Any]],
    target: float,
    seeds: list[int],
    tokens_per_sequence: float = 64.0,
    reference_batch: float = 16.0,
) -> dict[str, Any]:
    """The grid's ``b_crit`` at ``target`` (module docstring): ``{b_crit, b_crit_ci, points, left_out}``."""
    from sweeps.analysis.fit import analyze_points

    by_b: dict[int, dict[int, dict[int, float | None]]] = {}
    for (s, b, k), c in grid_cells.items():
        if s in seeds and b in real_grid.REFERENCE_BATCH_SIZES:
            tok = real_grid.crossing(c["tokens"], c["val_loss"], target)
            by_b.setdefault(b, {}).setdefault(k, {})[s] = tok
    points, left_out = [], []
    for b in sorted(by_b):
        best = None
        for k, per_seed in by_b[b].items():
            if len(per_seed) < len(seeds) or any(v is None for v in per_seed.values()):
                continue
            m = float(np.mean([math.log(v / (b * tokens_per_sequence)) for v in per_seed.values()]))
            if best is None or m < best[0]:
                best = (m, k)
        if best is None:
            left_out.append(b)
            continue
        points.append((b, math.exp(best[0]), best[1]))
    if len(points) < 3:
        return {"b_crit": None, "b_crit_ci": None, "points": points, "left_out": left_out}
    fit = analyze_points([p[0] for p in points], [p[1] for p in points], reference_batch)
    est = fit.get("b_crit") or (fit["s_min"] and fit["e_min"] / fit["s_min"])
    return {
        "b_crit": est,
        "b_crit_ci": fit.get("b_crit_ci"),
        "status": fit["status"],
        "points": points,
        "left_out": left_out,
        "rms_log_residual": fit.get("rms_log_residual"),
    }


def _score(rows: list[tuple[float, list[float | None] | None, float | None]]) -> dict[str, Any]:
    """``rows``: (reference, interval, estimate) per case."""
    covered, widths, biases, none = 0, [], [], 0
    for ref, ci, est in rows:
        if not ci:
            none += 1
            covered += 1
            continue
        lo, hi = ci[0] or 0.0, ci[1] if ci[1] is not None else math.inf
        covered += lo <= ref <= hi
        widths.append(hi / lo if lo > 0 else math.inf)
        if est:
            biases.append(math.log2(est / ref))
    n = len(rows)
    return {
        "n": n,
        "coverage": covered / n if n else math.nan,
        "no_interval": none,
        "median_width_ratio": float(np.median(widths)) if widths else math.nan,
        "median_log2_bias": float(np.median(biases)) if biases else math.nan,
    }


def run_code(spec_path: Path, sweeps: list[list[int]], train_missing: bool, jobs: int) -> dict[str, Any]:
    """Replay every sweep (its seeds) with the code under ``CODE_ROOT``; each replay's analysis, by its seeds."""
    from sweeps.spec import load_spec

    if _code_of_sweeps() != CODE_ROOT:
        raise SystemExit(f"replaying {_code_of_sweeps()}'s sweeps, not {CODE_ROOT}'s: the import path is wrong")
    spec = load_spec(spec_path)
    spec = spec.model_copy(update={"data": spec.data.model_copy(update={"path": str(ROOT / spec.data.path)})})
    while True:
        cells = real_grid.read_grid()
        grid = Grid(cells, real_grid.BASE_LR)
        results, missing = {}, set()
        with tempfile.TemporaryDirectory() as tmp:
            for seeds in sweeps:
                try:
                    results[tuple(seeds)] = replay(spec, grid, seeds, Path(tmp))
                except CellMissing as exc:
                    missing |= exc.cells
        if not missing:
            break
        if not train_missing:
            raise SystemExit(
                f"the grid lacks {len(missing)} cell(s) these replays ask for: run with --train-missing "
                f"(first: {sorted(missing)[:5]})"
            )
        print(f"[replay] training {len(missing)} missing cell(s)", file=sys.stderr, flush=True)
        # by this checkout's code (the grid's), whatever code is replayed
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "real_grid.py"),
                "ensure",
                json.dumps(sorted(missing)),
                "--jobs",
                str(jobs),
            ],
            check=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    return {"results": results, "interpolated_trials": grid.interpolated}


def summarise(label: str, out: dict[str, Any], cells: dict, seeds: list[int]) -> dict[str, Any]:
    results = out["results"]
    ref_cache: dict[float, dict[str, Any]] = {}
    per_rank: dict[int, list] = {}
    per_target: dict[float, list] = {}
    headline_rows, all_rows = [], []
    for s, res in sorted(results.items()):
        entries = sorted(res.get("targets") or [], key=lambda e: e["target_loss"])
        for rank, e in enumerate(entries):
            t = round(float(e["target_loss"]), 6)
            if t not in ref_cache:
                ref_cache[t] = reference(cells, t, seeds)
            ref = ref_cache[t]["b_crit"]
            if ref is None:
                continue
            est = e.get("b_crit")
            row = (ref, e.get("b_crit_ci"), est)
            all_rows.append(row)
            per_rank.setdefault(rank, []).append(row)
            per_target.setdefault(t, []).append(row)
            if res.get("target_loss") is not None and abs(float(res["target_loss"]) - t) < 1e-9:
                headline_rows.append(row)
    overall = _score(all_rows)
    compute = float(np.mean([r["compute_budgets"] for r in results.values()]))
    print(
        f"\n== {label} (the code in {_code_of_sweeps()}): {len(results)} replays, {out['interpolated_trials']} "
        "interpolated trial(s)"
    )
    for t, rows in sorted(per_target.items()):
        sc = _score(rows)
        ref = ref_cache[t]
        ci = ref["b_crit_ci"]
        print(
            f"  target {t:.4f}: reference b_crit {ref['b_crit']:.2f} [{ci[0]:.2f}, {ci[1] if ci[1] else math.inf:.2f}]"
            f" (left out: {ref['left_out']}) coverage={sc['coverage']:.3f} ({sc['n']}) "
            f"median_width_ratio={sc['median_width_ratio']:.2f} median_log2_bias={sc['median_log2_bias']:+.3f}"
        )
    hs = _score(headline_rows)
    print(f"  headline target: coverage={hs['coverage']:.3f} ({hs['n']})")
    print(
        f"  overall: coverage={overall['coverage']:.3f} ({overall['n']} seed x target cases, "
        f"{overall['no_interval']} without an interval) median_width_ratio={overall['median_width_ratio']:.2f} "
        f"median_log2_bias={overall['median_log2_bias']:+.3f} compute_trials={compute:.2f}"
    )
    for s, res in sorted(results.items()):
        ci = res.get("b_crit_ci")
        print(
            f"    seeds {','.join(map(str, s)):>5}: b_crit {res.get('b_crit')} {ci} at {res.get('target_loss')} {res.get('status')}, "
            f"{res['n_trials']} trials, {res['compute_budgets']:.2f} budgets, "
            f"{(res.get('replay_outcome') or {}).get('stopped_because')}"
        )
    return {
        "label": label,
        "overall": overall,
        "headline": hs,
        "compute_trials": compute,
        "per_target": {str(t): _score(r) for t, r in per_target.items()},
        "sweeps": {
            ",".join(map(str, s)): {
                k: res.get(k) for k in ("b_crit", "b_crit_ci", "target_loss", "status", "n_trials", "compute_budgets")
            }
            for s, res in results.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "sweeps" / "examples" / "shakespeare-char.yaml"))
    ap.add_argument("--seeds", default=None, help="e.g. 0-11 (default: every seed the grid holds)")
    ap.add_argument("--baseline-rev", default=None, help="also replay the code at this git revision")
    ap.add_argument("--code-root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--label", default="this checkout")
    ap.add_argument(
        "--seeds-per-sweep",
        type=int,
        default=1,
        help="seeds in each replayed sweep (2: pairs 0+1, 2+3, ...: the seeds' random effect)",
    )
    ap.add_argument("--train-missing", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the scores here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cells = real_grid.read_grid()
    seeds = real_grid.parse_range(args.seeds) if args.seeds else sorted({s for s, _, _ in cells})
    k = args.seeds_per_sweep
    sweeps = [seeds[i : i + k] for i in range(0, len(seeds) - k + 1, k)]
    out = run_code(Path(args.spec), sweeps, args.train_missing, args.jobs)
    cells = real_grid.read_grid()
    scores = [summarise(args.label, out, cells, seeds)]
    if args.baseline_rev:
        with tempfile.TemporaryDirectory() as tmp:
            wt = Path(tmp) / "baseline"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), args.baseline_rev],
                check=True,
                capture_output=True,
            )
            try:
                spec = wt / Path(args.spec).resolve().relative_to(ROOT)
                cmd = [
                    sys.executable,
                    __file__,
                    "--code-root",
                    str(wt),
                    "--spec",
                    str(spec),
                    "--label",
                    f"revision {args.baseline_rev}",
                    "--seeds",
                    ",".join(map(str, seeds)),
                    "--jobs",
                    str(args.jobs),
                    "--seeds-per-sweep",
                    str(k),
                ]
                if args.train_missing:
                    cmd.append("--train-missing")
                subprocess.run(cmd, check=True)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], check=False)
    if args.json:
        Path(args.json).write_text(json.dumps(scores, indent=1, default=str))


if __name__ == "__main__":
    main()
