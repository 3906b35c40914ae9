"""The fixed-against-ramp benchmark's pieces (``benchmarks/schedule_vs_fixed.py``): the ramp read from measured
``b_crit`` points doubles where the interpolated ``b_crit`` reaches the next batch and counts its steps as the
training loop does, and the paired ramp-minus-fixed interval is a t interval over seeds."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("schedule_vs_fixed", ROOT / "benchmarks" / "schedule_vs_fixed.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


POINTS = [(1000.0, 10.0), (4000.0, 40.0)]  # b_crit = 10 (D / 1000) ** 1 between the two budgets


def test_interpolation_is_log_linear_between_points_and_flat_below(bench):
    assert bench.interpolated_b_crit(POINTS, 500.0) == 10.0
    assert bench.interpolated_b_crit(POINTS, 2000.0) == pytest.approx(20.0)
    assert bench.interpolated_b_crit(POINTS, 8000.0) == pytest.approx(80.0)  # the last segment's line beyond


def test_the_points_ramp_doubles_where_b_crit_reaches_the_next_batch(bench):
    from sweeps.scaling.schedule import critbatch_block
    from workloads.train.batching import batch_schedule_steps

    ramp = bench.points_ramp(POINTS, 4000, 1)
    # 8 from 0; b_crit reaches 16 at 1600 tokens, 32 at 3200 (whole steps of the stage before: 1600, 3200)
    assert [(s["start_tokens"], s["batch_size_sequences"]) for s in ramp["stages"]] == [(0, 8), (1600, 16), (3200, 32)]
    assert ramp["steps"] == 200 + 100 + 25
    block = critbatch_block(ramp)
    phases = batch_schedule_steps(4000, 1, block["final_batch_size_sequences"], block["batch_warmup"]["schedule"])
    assert sum(n for _, n in phases) == ramp["steps"]


def _run(arm: str, seed: int, losses: list[float], batch: int) -> dict:
    tokens = [1000 * (i + 1) for i in range(len(losses))]
    return {
        "arm": arm,
        "seed": seed,
        "val_loss": losses[-1],
        "milestones": list(zip(tokens, losses)),
        "steps": tokens[-1] // batch,
        "tokens_seen": tokens[-1],
    }


def test_the_paired_interval_is_a_t_interval_over_seeds_and_equal_loss_steps_interpolate(bench):
    runs = [_run("r", s, [3.0, 2.5, 2.2, 2.0 + d], 4) for s, d in enumerate([0.0, 0.1, 0.3])]
    runs += [_run("f", s, [3.0, 2.4, 2.1, 2.1 + d], 2) for s, d in enumerate([0.0, 0.0, 0.1])]
    p = bench.paired(runs, "r", "f")
    half = 4.302652729749462 * 0.1 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n), diffs -0.1, 0, 0.1
    assert p["diff_mean"] == pytest.approx(0.0, abs=1e-12)
    assert p["diff_ci95"] == pytest.approx([-half, half], abs=1e-9) and not p["beyond_chance"]
    # seed 0: the ramp ends at 2.0, which f never reaches; seed 1: 2.1, reached at its 3000th token (1500 steps);
    # seed 2: 2.3, between 2000 (2.4) and 3000 tokens (2.1): 2333.3 tokens, 1166.7 steps
    assert p["fixed_steps_to_ramp_loss"][0] is None
    assert p["fixed_steps_to_ramp_loss"][1:] == pytest.approx([1500.0, 7000 / 6])
    assert p["steps_saved_at_equal_loss"] == pytest.approx(((1 - 1000 / 1500) + (1 - 1000 / (7000 / 6))) / 2)


def test_a_ramp_that_took_more_steps_at_equal_loss_says_more(bench):
    assert bench._equal_loss_words(0.27) == "27 % fewer steps at equal loss"
    assert bench._equal_loss_words(-2.47) == "247 % more steps at equal loss"
    assert bench._equal_loss_words(None) == "never"
