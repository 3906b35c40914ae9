"""A grid of real training curves of the main job's model: every (training seed, batch size, lattice LR), trained
in this process by the code a sweep's trial runners run (``sweeps.launch.trainable.trial_config`` +
``workloads.pretrain.train_in_process``), so a curve is the one a sweep trial at that config reports.

    python benchmarks/real_grid.py build --seeds 0-11 --batch-sizes 4,8,16,32,64,128,256 --jobs 2
    python benchmarks/real_grid.py summary

Each cell trains the main job's spec (``sweeps/examples/shakespeare-char.yaml``) at one batch size, seed and LR
``base_lr * 2^(k/2)`` (:func:`sweeps.search.lattice.lattice_lr`, the search's lattice), beta2 at the search's
carried token half-life (the geometric middle of ``search.beta2.half_life_tokens``: 32,768 tokens), for a
budget of ``budget_multiple`` token budgets (milestones at the spec's spacing; the schedule is horizon-free, so
the first ``m`` budgets of a longer curve are the curve of an ``m``-budget trial: ``tests/benchmarks`` pins it).

``build`` brackets the fastest LR at every reference target (:data:`REFERENCE_TARGETS`): per (seed, batch size)
it starts with five LRs around a guess and adds lattice points on a side until the fastest LR at every target
that some LR reaches lies at least :data:`ROOM` points inside the tried range (room for the search's probes), an
LR diverges above, or :data:`MAX_INDEX_SPAN` points were tried; then it completes the band the reference compares
(:func:`band_cells`: every LR within one step of any seed's fastest, for every seed). A replay asks for more cells
(other LRs, batch sizes a sweep adds) and trains them with ``--train-missing``. Resumable: a cell is appended to the cache
(``benchmarks/cache/real_coverage/grid.jsonl``, one JSON object a line) as soon as it ends, and cells already
there are not trained again. On the 2-core machine a seed of the seven main batch sizes takes about 12 minutes
with two jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # last: a replay of other code (real_coverage.py --code-root) keeps its own first
    sys.path.append(str(ROOT))

GRID = ROOT / "benchmarks" / "cache" / "real_coverage" / "grid.jsonl"
SPEC = ROOT / "sweeps" / "examples" / "shakespeare-char.yaml"
LATTICE_OCTAVES = 0.5
#: the lattice's origin: cell ``k`` trains at ``BASE_LR * 2^(k / 2)`` (the main job's ``search.base_lr``)
BASE_LR = 0.003
#: the target losses the grid must bracket the fastest LR at (nats)
REFERENCE_TARGETS = (2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0)
#: lattice points the fastest LR must lie inside the tried range, on each side
ROOM = 2
MAX_INDEX_SPAN = 12
#: the batch sizes ``build`` trains for every seed: the reference is measured on these
REFERENCE_BATCH_SIZES = (4, 8, 16, 32, 64, 128, 256)
#: the budget multiple each batch size is trained to (enough to reach the lowest reference target at its best LR)
BUDGET_MULTIPLE = {2: 1, 4: 1, 6: 1, 8: 1, 11: 1, 16: 1, 23: 1, 32: 1, 45: 2, 64: 2, 91: 4, 128: 4, 181: 4, 256: 4}


def budget_multiple(b: int) -> int:
    return BUDGET_MULTIPLE.get(b, 1 if b <= 32 else 2 if b <= 64 else 4)


def guess_index(b: int) -> int:
    """A first guess of the fastest LR's lattice index: 0.007 (B/4)^0.25 on the lattice from 0.003."""
    return round(math.log2(0.007 * (b / 4) ** 0.25 / 0.003) / LATTICE_OCTAVES)


def load_spec() -> Any:
    import yaml

    from sweeps.spec import parse_spec

    d = yaml.safe_load(SPEC.read_text())
    d["data"]["path"] = str(ROOT / d["data"]["path"])
    return parse_spec(d)


def lattice_lr(base_lr: float, k: int) -> float:
    """The grid's LR ``k``: the same expression as :func:`sweeps.search.lattice.lattice_lr` (so the same float;
    ``tests/benchmarks/test_real_grid.py`` checks it), here so that a replay of code without the lattice reads
    the grid too."""
    return base_lr * 2.0 ** (int(k) * LATTICE_OCTAVES)


def cell_config(spec: Any, seed: int, b: int, k: int, m: int) -> dict[str, Any]:
    """The trial config a sweep's searcher gives (batch size ``b``, seed, lattice LR ``k``, ``m`` budgets)."""
    from sweeps.search.space import transfer_hyperparameters

    lo, hi = spec.search.beta2.half_life_tokens
    lr = lattice_lr(spec.search.base_lr, k)
    hp = transfer_hyperparameters(spec, b, {"beta2_half_life_tokens": math.sqrt(lo * hi)}, lr)
    cfg = {"batch_size_sequences": b, "seed": seed, **hp}
    if m > 1:
        cfg["budget_tokens"] = m * spec.budget_tokens
    return cfg


def train_cell(seed: int, b: int, k: int, m: int) -> dict[str, Any]:
    """Train one cell; its curve as a JSON-ready dict."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from sweeps.launch.trainable import trial_config
    from workloads.pretrain import train_in_process

    spec = load_spec()
    cfg = cell_config(spec, seed, b, k, m)
    tc = trial_config(spec, cfg, f"grid-s{seed}-b{b}-k{k}", data_path=str(spec.data.path))
    t0 = time.perf_counter()
    r = train_in_process(tc.to_dict(), None, None)
    reps = r["reports"]
    return {
        "seed": seed,
        "batch_size_sequences": b,
        "lr_index": k,
        "lr": cfg["lr"],
        "beta2": cfg["beta2"],
        "budget_multiple": m,
        "status": r["status"],
        "tokens": [float(x["tokens_seen"]) for x in reps],
        "val_loss": [
            float(x["val_loss"]) if x["val_loss"] is not None and math.isfinite(x["val_loss"]) else None for x in reps
        ],
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def read_grid(path: Path = GRID) -> dict[tuple[int, int, int], dict[str, Any]]:
    """The cached cells by ``(seed, batch size, lattice index)``, the longest curve of each."""
    out: dict[tuple[int, int, int], dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        c = json.loads(line)
        key = (c["seed"], c["batch_size_sequences"], c["lr_index"])
        if key not in out or c["budget_multiple"] > out[key]["budget_multiple"]:
            out[key] = c
    return out


def crossing(tokens: list[float], losses: list[float | None], target: float) -> float | None:
    from sweeps.analysis.targets import tokens_to_target

    if any(x is None for x in losses):
        losses = [x if x is not None else math.nan for x in losses]
    return tokens_to_target(tokens, losses, target)


def needed(grid: dict[tuple[int, int, int], dict[str, Any]], seed: int, b: int) -> list[int]:
    """The lattice indices still to train at ``(seed, b)`` for the bracket rule of the module docstring."""
    tried = sorted(k for (s, bb, k) in grid if s == seed and bb == b)
    g = guess_index(b)
    if not tried:
        return list(range(g - 2, g + 3))
    lo, hi = tried[0], tried[-1]
    if hi - lo + 1 >= MAX_INDEX_SPAN:
        return []
    want: set[int] = set()
    diverged_above = any(
        grid[(seed, b, k)]["status"] != "completed" or any(v is None for v in grid[(seed, b, k)]["val_loss"])
        for k in tried
        if k == hi
    )
    for target in REFERENCE_TARGETS:
        tok = {k: crossing(grid[(seed, b, k)]["tokens"], grid[(seed, b, k)]["val_loss"], target) for k in tried}
        reached = {k: v for k, v in tok.items() if v is not None}
        if not reached:
            continue
        best = min(reached, key=lambda k: (reached[k], k))
        if best - lo < ROOM:
            want.add(lo - 1)
        if hi - best < ROOM and not diverged_above:
            want.add(hi + 1)
    return sorted(want)


def parse_range(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, z = part.split("-")
            out += list(range(int(a), int(z) + 1))
        elif part:
            out.append(int(part))
    return out


def build(seeds: Iterable[int], batch_sizes: Iterable[int], jobs: int, path: Path = GRID) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    seeds, batch_sizes = list(seeds), list(batch_sizes)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        while True:
            grid = read_grid(path)
            todo = [(s, b, k, budget_multiple(b)) for s in seeds for b in batch_sizes for k in needed(grid, s, b)]
            todo = [c for c in todo if (c[0], c[1], c[2]) not in grid or grid[c[:3]]["budget_multiple"] < c[3]]
            if not todo:  # each seed bracketed: complete the band the reference's seed means compare
                todo = sorted(band_cells(grid, seeds, batch_sizes))
            print(f"[grid] {len(todo)} cells to train", flush=True)
            if not todo:
                break
            futures = {pool.submit(train_cell, *c): c for c in todo}
            for f in as_completed(futures):
                cell = f.result()
                with path.open("a") as fh:
                    fh.write(json.dumps(cell) + "\n")
                print(
                    f"[grid] seed {cell['seed']} B={cell['batch_size_sequences']} k={cell['lr_index']} "
                    f"x{cell['budget_multiple']} {cell['status']} {cell['wall_s']} s",
                    flush=True,
                )


def band_cells(
    grid: dict[tuple[int, int, int], dict[str, Any]], seeds: list[int], batch_sizes: Iterable[int]
) -> set[tuple[int, int, int, int]]:
    """The cells that complete the reference's band: for each batch size, every lattice LR within one step of any
    seed's fastest LR at any reference target, for every seed (the reference compares LRs by their seed mean, so an
    LR counts only where every seed has it)."""
    need = set()
    for b in batch_sizes:
        want: set[int] = set()
        for s in seeds:
            ks = [k for (ss, bb, k) in grid if ss == s and bb == b]
            for target in REFERENCE_TARGETS:
                tok = {k: crossing(grid[(s, b, k)]["tokens"], grid[(s, b, k)]["val_loss"], target) for k in ks}
                reached = {k: v for k, v in tok.items() if v is not None}
                if reached:
                    best = min(reached, key=lambda k: (reached[k], k))
                    want |= {best - 1, best, best + 1}
        need |= {(s, b, k, budget_multiple(b)) for k in want for s in seeds if (s, b, k) not in grid}
    return need


def ensure(cells: Iterable[tuple[int, int, int, int]], jobs: int, path: Path = GRID) -> int:
    """Train the ``(seed, batch size, lattice index, budget multiple)`` cells the cache lacks; how many."""
    grid = read_grid(path)
    todo = sorted({c for c in cells if c[:3] not in grid or grid[c[:3]]["budget_multiple"] < c[3]})
    if not todo:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(train_cell, *c) for c in todo]
        for f in as_completed(futures):
            cell = f.result()
            with path.open("a") as fh:
                fh.write(json.dumps(cell) + "\n")
            print(
                f"[grid] seed {cell['seed']} B={cell['batch_size_sequences']} k={cell['lr_index']} "
                f"x{cell['budget_multiple']} {cell['status']} {cell['wall_s']} s",
                flush=True,
            )
    return len(todo)


def summary(path: Path = GRID) -> None:
    grid = read_grid(path)
    by: dict[tuple[int, int], list[int]] = {}
    for s, b, k in grid:
        by.setdefault((b, s), []).append(k)
    for (b, s), ks in sorted(by.items()):
        print(f"B={b:4d} seed {s:2d}: k {min(ks)}..{max(ks)} ({len(ks)})")
    print(f"{len(grid)} cells, {sum(c['wall_s'] for c in grid.values()):.0f} s of training")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--seeds", default="0-11")
    b.add_argument("--batch-sizes", default=",".join(map(str, REFERENCE_BATCH_SIZES)))
    b.add_argument("--jobs", type=int, default=2)
    sub.add_parser("summary")
    e = sub.add_parser("ensure", help="train the cells given as a JSON list of [seed, B, k, budget multiple]")
    e.add_argument("cells")
    e.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if args.cmd == "build":
        build(parse_range(args.seeds), parse_range(args.batch_sizes), args.jobs)
    elif args.cmd == "ensure":
        ensure([tuple(c) for c in json.loads(args.cells)], args.jobs)
    else:
        summary()


if __name__ == "__main__":
    main()
