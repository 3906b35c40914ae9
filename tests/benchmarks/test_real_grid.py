"""The real-training coverage benchmark's grid and replay (``benchmarks/real_grid.py``, ``benchmarks/real_coverage.py``):
a cached cell is the curve a sweep trial at that config gets today (if the training code changes, the cache is stale
and this fails), a longer budget's curve starts with the shorter one's, the grid's LRs are the search's lattice
floats, and the replay cuts curves as the training loop does."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest

from tests.conftest import ROOT


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def grid_mod():
    return _load("real_grid")


def test_the_grid_lrs_are_the_searchs_lattice_floats(grid_mod):
    from sweeps.search.lattice import lattice_lr

    for k in range(-6, 14):
        assert grid_mod.lattice_lr(0.003, k) == lattice_lr(0.003, k, 0.5)


@pytest.mark.slow
def test_a_cached_cell_is_the_curve_a_sweep_trial_gets_today(grid_mod):
    """B = 256 at a cached LR, trained now for one budget by the trial runners' code: its 16 milestones equal the
    cache's first 16 to the last bit (deterministic training; a 4-budget cell's start is the 1-budget trial)."""
    cells = grid_mod.read_grid()
    key = next(
        (
            k
            for k in sorted(cells)
            if k[1] == 256 and cells[k]["budget_multiple"] >= 2 and cells[k]["status"] == "completed"
        ),
        None,
    )
    assert key is not None, "the committed grid has no B = 256 cell"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    now = grid_mod.train_cell(key[0], key[1], key[2], 1)
    cached = cells[key]
    assert now["lr"] == cached["lr"] and now["beta2"] == cached["beta2"]
    assert now["tokens"] == cached["tokens"][:16]
    assert now["val_loss"] == cached["val_loss"][:16]


def test_the_replay_cuts_a_curve_at_its_budget_and_its_stop_loss():
    rc = _load("real_coverage")
    tokens = [16384.0 * (i + 1) for i in range(8)]
    losses = [4.0, 3.5, 3.0, 2.7, 2.5, 2.45, None, None]
    assert rc.cut(tokens, losses, 65536, None) == (tokens[:4], [4.0, 3.5, 3.0, 2.7])
    assert rc.cut(tokens, losses, 131072, 2.8) == (tokens[:4], [4.0, 3.5, 3.0, 2.7])  # the first at or below 2.8
    t, l = rc.cut(tokens, losses, 131072, None)
    assert t == tokens[:7] and math.isnan(l[-1])  # a diverged curve ends at its first non-finite loss


def test_the_reference_is_the_seed_mean_fastest_lattice_lr_per_batch_size():
    rc = _load("real_coverage")
    cells = {}
    for s in (0, 1):
        for b in (4, 8, 16, 32, 64):
            for k, slow in ((0, 1.3), (1, 1.0), (2, 1.2)):
                steps = 100 * (1 + 12 / b) * slow * (1.05 if s else 0.95)
                tok = [16384.0 * (i + 1) for i in range(64)]
                # loss 3 exactly at `steps` steps: loss = 2 + (steps B 64 / t)^0.5
                cells[(s, b, k)] = {
                    "tokens": tok,
                    "val_loss": [2 + (steps * b * 64 / t) ** 0.5 for t in tok],
                    "budget_multiple": 4,
                    "status": "completed",
                }
    ref = rc.reference(cells, 3.0, [0, 1])
    assert [p[2] for p in ref["points"]] == [1] * 5  # the seed-mean fastest LR
    assert [p[1] for p in ref["points"]] == pytest.approx(
        [100 * (1 + 12 / b) * math.sqrt(0.95 * 1.05) for b in (4, 8, 16, 32, 64)], rel=2e-3
    )  # milestones interpolated
    assert ref["b_crit"] == pytest.approx(12.0, rel=1e-2)


@pytest.mark.parametrize("script", ["real_grid.py", "real_coverage.py", "search_placement.py"])
def test_the_coverage_benchmarks_answer_help(script):
    import subprocess

    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0 and "usage" in r.stdout, r.stderr[-2000:]
