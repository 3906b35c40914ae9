"""``benchmarks/search_placement.py`` places trials as its docstring says (the numbers it prints are in
docs/benchmarks.md; this checks the placements, not the figures)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("search_placement", ROOT / "benchmarks" / "search_placement.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_transfer_starts_at_the_base_batch_size_and_centres_each_next_one_on_its_neighbours_best_lr(bench):
    sweep = bench.Sweep(np.random.default_rng(3), sd_batch=0.05, sd_trial=0.04)
    trials = bench.transfer(sweep)
    lrs = {}
    for t in trials:
        lrs.setdefault(t.batch_size_sequences, []).append(t.hyperparameters["lr"])
    assert [t.batch_size_sequences for t in trials[::2]] == bench.TRANSFER_ORDER
    assert lrs[16] == pytest.approx([sweep.start_lr * 2 ** -0.5, sweep.start_lr * 2 ** 0.5])
    for b, lo_hi in lrs.items():  # two trials an octave apart, around the centre
        assert lo_hi[1] / lo_hi[0] == pytest.approx(2.0)
    # B = 8 is centred on B = 16's faster trial, scaled by the square-root rule (fewer than 3 finished)
    # (the curves of one batch size never cross: the faster trial has the lower final loss)
    fast16 = min((t for t in trials if t.batch_size_sequences == 16), key=lambda t: t.val_loss[-1])
    assert math.sqrt(lrs[8][0] * lrs[8][1]) == pytest.approx(fast16.hyperparameters["lr"] * (8 / 16) ** 0.5, rel=1e-9)


def test_both_placements_spend_the_same_trials_and_the_scores_repeat_with_the_seed(bench):
    for name in ("independent", "transfer"):
        trials = bench.STRATEGIES[name](bench.Sweep(np.random.default_rng(0), 0.05, 0.04))
        assert len(trials) == 14 and sorted({t.batch_size_sequences for t in trials}) == bench.BATCH_SIZES
    first = bench.score("transfer", 8, 1, 0.95, 0.05, 0.04)
    assert first == bench.score("transfer", 8, 1, 0.95, 0.05, 0.04)
    assert set(first) == {"coverage", "median_width_ratio", "median_log2_bias", "ok", "mean_trials", "mean_compute",
                          "contradicted",
                          "coverage_contradicted", "coverage_consistent", "median_log2_bias_contradicted",
                          "median_log2_bias_consistent"}
    assert 0.0 <= first["contradicted"] <= 1.0


def test_the_precision_placement_starts_as_transfer_and_stops_at_its_cap(bench):
    planned = bench.transfer(bench.Sweep(np.random.default_rng(5), 0.1, 0.1))
    trials = bench.transfer_until_precise(bench.Sweep(np.random.default_rng(5), 0.1, 0.1), ratio=1.0001, max_trials=20)
    assert [(t.batch_size_sequences, t.hyperparameters["lr"]) for t in trials[:14]] == [
        (t.batch_size_sequences, t.hyperparameters["lr"]) for t in planned]
    assert 14 < len(trials) <= 20
    loose = bench.transfer_until_precise(bench.Sweep(np.random.default_rng(5), 0.1, 0.1), ratio=1e6)
    assert len(loose) == 14


def test_the_reallocation_placement_stops_later_trials_at_the_lowest_target_and_reruns_the_censored(bench):
    sweep = bench.Sweep(np.random.default_rng(5), 0.1, 0.1)
    trials = bench.transfer_until_precise_reallocated(sweep, ratio=1.0001, max_trials=20)
    planned = bench.transfer(bench.Sweep(np.random.default_rng(5), 0.1, 0.1))
    assert [t.val_loss for t in trials[:14]] == [t.val_loss for t in planned]  # the first wave is untouched
    lowest, later = min(sweep.targets), trials[14:]
    assert later and bench._compute(trials, sweep.budget) <= 20 + 1e-9
    for t in later:  # each ends at its first milestone at or below the lowest target, or at its budget
        assert all(x > lowest for x in t.val_loss[:-1])
    reruns = [t for t in later if max(t.tokens) > sweep.budget * 1.001 or t.val_loss[-1] <= lowest
              and t.batch_size_sequences in (128, 256) and t.hyperparameters["lr"] in
              [p.hyperparameters["lr"] for p in planned if p.batch_size_sequences == t.batch_size_sequences]]
    assert reruns
    for t in reruns:  # the same curve as the trial it repeats, as far as that one went
        first = next(p for p in planned if p.hyperparameters["lr"] == t.hyperparameters["lr"])
        n = min(len(first.val_loss), len(t.val_loss))
        assert t.val_loss[:n] == pytest.approx(first.val_loss[:n])
