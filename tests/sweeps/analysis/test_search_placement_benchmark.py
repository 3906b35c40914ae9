"""``benchmarks/search_placement.py``'s synthetic grids have the structure its docstring states (the numbers it prints
are in docs/benchmarks.md; this checks the model, not the figures): the hyperbola at the optimum LR, an optimum LR
that moves with the target loss, a seed's effect shared by every batch size, and one simulated sweep through the
product's own replay."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("search_placement", ROOT / "benchmarks" / "search_placement.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cal(**over):
    """A hand-made calibration: b_crit 12 and S_min 40 steps at every loss... scaled so that lower losses need
    more steps (S_min doubles per 0.5 nat)."""
    losses = [2.2 + 0.1 * i for i in range(15)]
    cal = {
        "table": {
            "loss": losses,
            "b_crit": [12.0] * len(losses),
            "s_min": [40.0 * 2 ** ((2.6 - L) / 0.5) for L in losses],
        },
        "x0": math.log2(0.006),
        "a": 0.0,
        "m": 1.0,
        "k_above": 0.3,
        "k_below": 0.2,
        "sd_seed": 0.0,
        "sd_cell": 0.0,
        "diverge_octaves": 3.0,
        "seeds": 12,
        "lattice_octaves": 0.5,
        "base_lr": 0.003,
    }
    cal.update(over)
    return cal


def _steps(grid, seed, b, lr, target):
    from sweeps.analysis.targets import tokens_to_target

    tokens, losses, _ = grid.curve(seed, b, lr, 4)
    tok = tokens_to_target(tokens, [x if x is not None else math.nan for x in losses], target)
    return None if tok is None else tok / (b * 64)


def test_at_the_optimum_lr_steps_follow_the_hyperbola(bench):
    grid = bench.SyntheticGrid(_cal(m=0.0), 0)
    steps = {b: _steps(grid, 0, b, 0.006, 2.6) for b in (4, 16, 64)}
    for b, s in steps.items():
        assert s == pytest.approx(40.0 * (1 + 12.0 / b), rel=0.02)


def test_the_optimum_lr_moves_with_the_target_loss_inside_the_measured_range(bench):
    """With m = 3 octaves per nat, the fastest lattice LR to loss 2.8 lies about 0.9 octave above the one to 2.5
    (the drift's measured range); outside that range the optimum stays where the range's end put it."""
    grid = bench.SyntheticGrid(_cal(m=3.0), 0)
    lrs = [0.003 * 2 ** (k / 2) for k in range(-2, 8)]

    def fastest(target):
        got = {lr: _steps(grid, 0, 16, lr, target) for lr in lrs}
        return min((lr for lr in got if got[lr] is not None), key=lambda lr: got[lr])

    assert bench.DRIFT_RANGE == (2.5, 2.8)
    assert math.log2(fastest(2.8) / fastest(2.5)) == pytest.approx(0.9, abs=0.3)
    assert fastest(3.0) == fastest(2.8) and fastest(2.2) == fastest(2.5)


def test_a_seed_moves_every_batch_size_the_same_way(bench):
    grid = bench.SyntheticGrid(_cal(sd_seed=0.2, m=0.0), 7)
    diffs = [math.log(_steps(grid, 1, b, 0.006, 2.6) / _steps(grid, 0, b, 0.006, 2.6)) for b in (4, 16, 64, 256)]
    assert all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
    assert abs(diffs[-1]) > abs(diffs[0])  # weighted by B / (B + b_crit): the large batch sizes most


def test_one_simulated_sweep_runs_through_the_products_replay(bench):
    out = bench.simulate(
        _cal(sd_seed=0.05, sd_cell=0.05), ROOT / "sweeps" / "examples" / "shakespeare-char.yaml", 1, False, 0
    )
    assert sorted(out["rows"]) == [2.4, 2.5, 2.6, 2.7, 2.8]  # the main job's fixed targets
    assert all(rows[0][0] == pytest.approx(12.0) for rows in out["rows"].values())  # the truth
    assert 14 <= out["compute"] <= 21 + 1e-9
