"""What the interval carries and when the model is not believed: a batch size already below a target at its first
milestone is an upper bound, several seeds combine as a random effect shared across batch sizes, points that break
the hyperbola give ``misfit``, a knee past the range says how far steps are from perfect scaling, and several sweeps
are compared at one loss (``critbatch analyze --trials A --trials B``). Each case is one that the analysis before
these rules answered wrongly."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from sweeps.analysis import analyze_trials
from sweeps.analysis.fit import analyze_points
from sweeps.analysis.targets import TrialRecord, steps_to_target_points
from tests.conftest import invoke_cli

T = 64  # tokens per sequence


def _trial(
    tid: str, b: int, steps_to_half: float, *, seed: int = 0, milestones: int = 16, spacing_tokens: float = 16384.0
) -> TrialRecord:
    """A curve ``loss = 2 + (tokens / (B T steps_to_half))^-0.5``: loss 3 at ``steps_to_half`` steps."""
    tokens = [spacing_tokens * (i + 1) for i in range(milestones)]
    loss = [2.0 + (t / (b * T * steps_to_half)) ** -0.5 for t in tokens]
    return TrialRecord(
        trial_id=tid,
        batch_size_sequences=b,
        seed=seed,
        group_id=tid,
        status="COMPLETED",
        hyperparameters={"lr": 1e-3},
        tokens=tokens,
        val_loss=loss,
        flops=tokens,
    )


def test_a_batch_size_below_the_target_at_its_first_milestone_is_an_upper_bound_not_a_point():
    """A batch size whose first milestone already lies below the target (here B = 1, first seen at 2048 steps,
    crossing the target at 680) enters the fit as 'at most 2048 steps', not as exactly 2048: read as exact it
    turned a clean hyperbola into a misfit (or, with other points, a confident wrong knee); as a bound the fit of
    the others stands and covers the truth (16)."""
    rng = np.random.default_rng(0)
    b_crit = 16.0
    trials = [_trial(f"b{b}", b, 40.0 * (1 + b_crit / b) * math.exp(rng.normal(0, 0.05))) for b in (4, 8, 16, 32, 64)]
    trials.append(_trial("b1", 1, 40.0 * (1 + b_crit), spacing_tokens=131072.0, milestones=4))
    points, _ = steps_to_target_points(trials, 3.0, T)
    bound = next(p for p in points if p["batch_size_sequences"] == 1)
    assert bound["upper_bound"] is True and bound["steps_to_target"] == 2048.0
    assert all("upper_bound" not in p for p in points if p["batch_size_sequences"] != 1)
    res = analyze_trials(trials, context_length_tokens=T, reference_batch=16, targets=[3.0])
    entry = res["targets"][0]
    assert entry["upper_bounded_in_fit"] == [1.0] and 1.0 not in entry["fitted_batch_sizes"]
    assert entry["status"] == "ok" and entry["b_crit_ci"][0] < b_crit < entry["b_crit_ci"][1]
    exact = analyze_points([p["batch_size_sequences"] for p in points], [p["steps_to_target"] for p in points], 16)
    assert exact["status"] == "misfit"  # the old reading: the bound as an exact point


def test_a_bound_that_contradicts_the_fit_widens_the_interval():
    b = [4.0, 8.0, 16.0, 32.0, 64.0]
    s = [40 * (1 + 12 / x) * f for x, f in zip(b, (1.02, 0.97, 1.03, 0.99, 1.0))]
    plain = analyze_points(b, s, 16)
    loose = analyze_points(b, s, 16, upper_bounds=[(2.0, 40 * (1 + 6) * 2)])
    tight = analyze_points(b, s, 16, upper_bounds=[(2.0, 40 * (1 + 6) * 0.5)])
    assert loose["b_crit_ci"] == pytest.approx(plain["b_crit_ci"], rel=1e-3)  # consistent: no information lost
    assert tight["b_crit_ci"][0] < plain["b_crit_ci"][0]  # it says B = 2 is faster than the fit: b_crit may be lower


def test_two_seeds_are_fitted_apart_and_combined_with_the_between_seed_variance():
    """One seed moves every batch size's steps together (a shared effect): averaging log steps per batch size
    hides the seeds' disagreement; each seed's own fit shows it, and the combined interval carries it."""
    rng = np.random.default_rng(1)
    batch_sizes = [4, 8, 16, 32, 64, 128]
    truth = {0: 10.0, 1: 20.0}  # the seeds' own knees disagree by 2x
    trials = []
    for seed, bc in truth.items():
        for b in batch_sizes:
            trials.append(_trial(f"s{seed}b{b}", b, 40.0 * (1 + bc / b) * math.exp(rng.normal(0, 0.02)), seed=seed))
    res = analyze_trials(trials, context_length_tokens=T, reference_batch=16, targets=[3.0])
    e = res["targets"][0]
    assert [f["seed"] for f in e["seed_fits"]] == [0, 1]
    assert [f["b_crit"] for f in e["seed_fits"]] == pytest.approx([10.0, 20.0], rel=0.15)
    assert e["between_seed_sd_log"] > 0.2
    lo, hi = e["b_crit_ci"]
    assert lo < 10.0 * 1.1 and hi > 20.0 / 1.1  # the interval spans both seeds' knees
    pts = steps_to_target_points(trials, 3.0, T)[0]
    pooled = analyze_points([p["batch_size_sequences"] for p in pts], [p["steps_to_target"] for p in pts], 16)
    assert pooled["b_crit_ci"][1] / pooled["b_crit_ci"][0] < hi / lo  # the old mean-of-logs interval: narrower
    one = analyze_trials([t for t in trials if t.seed == 0], context_length_tokens=T, reference_batch=16, targets=[3.0])
    assert "seed_fits" not in one["targets"][0] or one["targets"][0]["seed_fits"] is None


def test_tokens_rising_towards_small_batch_sizes_is_a_misfit_not_a_knee():
    """Under-tuned small batch sizes: B = 4 needs more tokens than B = 8 (the hyperbola allows no such thing). The
    fit still returns a knee (it did: status ok); the status now says the model does not describe the points."""
    b = [4, 8, 16, 32, 64, 128]
    s = [40 * (1 + 12 / x) for x in b]
    s[0] *= 2.0  # B = 4 at a poor LR: twice the steps
    res = analyze_points(b, s, 16)
    assert res["status"] == "misfit" and res["b_crit"] is None
    assert "tokens to the target rise towards small batch sizes" in res["message"]
    fine = analyze_points(b, [40 * (1 + 12 / x) for x in b], 16)
    assert fine["status"] == "ok"
    from sweeps.analysis.summary import headline

    assert "no critical batch size is reported" in headline({**res, "target_loss": 3.0, "targets": []})


def test_a_knee_past_the_range_says_how_far_steps_are_from_perfect_scaling():
    b = [4, 8, 16, 32]
    s = [40 * (1 + 400 / x) for x in b]  # far above: nearly perfect scaling
    far = analyze_points(b, s, 16)
    assert far["status"] == "above_range" and "almost perfectly" in far["message"]
    s = [40 * (1 + 60 / x) for x in b]  # knee just past 32: steps at 32 are 1.44x perfect scaling from 4
    near = analyze_points(b, s, 16)
    assert near["status"] == "above_range"
    assert "almost" not in near["message"] and "B=32 already needs 1.44x the steps" in near["message"]


def test_analyze_compares_several_sweeps_at_the_first_ones_targets(tmp_path):
    """``critbatch analyze --trials A --trials B``: both at A's targets (one loss), not each at its own."""
    outs = []
    for name, bc in (("a", 12.0), ("b", 24.0)):
        out = tmp_path / name
        out.mkdir()
        trials = [_trial(f"{name}{x}", x, 40.0 * (1 + bc / x)) for x in (4, 8, 16, 32, 64, 128)]
        (out / "trials.json").write_text(json.dumps([t.to_dict() for t in trials]))
        res = analyze_trials(
            trials, context_length_tokens=T, reference_batch=16, targets=[3.2, 3.0] if name == "a" else [2.9, 2.8]
        )
        (out / "cbs.json").write_text(json.dumps(res.to_json_dict()))
        outs.append(out)
    r = invoke_cli(["analyze", "--trials", str(outs[0] / "trials.json"), "--trials", str(outs[1] / "trials.json")])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["targets"] == [3.2, 3.0]
    assert [[t["target_loss"] for t in s["targets"]] for s in got["sweeps"]] == [[3.2, 3.0], [3.2, 3.0]]
    assert got["sweeps"][0]["b_crit"] == pytest.approx(12.0, rel=0.05)
    assert got["sweeps"][1]["b_crit"] == pytest.approx(24.0, rel=0.05)
    assert "At target loss 3" in r.stderr
    shutil.rmtree(outs[1])
    bad = invoke_cli(["analyze", "--trials", str(outs[0] / "trials.json"), "--trials", str(outs[1] / "trials.json")])
    assert bad.returncode == 2 and "not found" in bad.stderr


def test_an_open_bracket_left_at_the_end_widens_the_interval_by_how_far_it_could_move_the_estimate():
    """B = 4's fastest trial ran at the highest LR it tried (3x slower an octave lower): its optimum may lie beyond,
    its point overstate the tuned steps, so ``b_crit`` may be lower. The interval's lower end moves down by the
    factor that point, as fast as an optimum up to an octave beyond could make it, moves the estimate; with the
    bracket closed it stays as fitted."""
    rng = np.random.default_rng(2)

    def trials_for(closed: bool):
        out = []
        for b in (4, 8, 16, 32, 64, 128):
            base = 40.0 * (1 + 12.0 / b) * math.exp(rng.normal(0, 0.04))
            lrs = {1e-3: 1.25, 2e-3: 1.0, 4e-3: 1.25} if b != 4 or closed else {1e-3: 3.0, 2e-3: 1.0}
            for lr, slow in lrs.items():
                t = _trial(f"b{b}-{lr}", b, base * slow)
                t.hyperparameters = {"lr": lr}
                out.append(t)
        return out

    open_ = analyze_trials(trials_for(False), context_length_tokens=T, reference_batch=16, targets=[3.0])["targets"][0]
    assert open_["open_bracket_gains"] == {"4": pytest.approx(min(math.log(3.0) / 3, 0.2))}
    lo, hi = open_["b_crit_ci"]
    u_lo, u_hi = open_["b_crit_ci_unwidened"]
    assert lo < u_lo and hi == pytest.approx(u_hi)  # lower: B = 4 faster means a smaller E_min, a smaller b_crit
    closed = analyze_trials(trials_for(True), context_length_tokens=T, reference_batch=16, targets=[3.0])["targets"][0]
    assert closed.get("b_crit_ci_unwidened") is None
