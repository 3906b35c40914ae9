import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.analysis import (
    INTERVAL_METHOD,
    TARGET_RULE,
    TrialRecord,
    analyze_points,
    analyze_trials,
    cbs_20,
    cbs_20_interval,
    censored_points,
    choose_targets,
    finite_json,
    fit_hyperbola,
    interval_b_crit,
    steps_to_target_points,
    tokens_to_target,
)

B = np.array([4, 8, 16, 32, 64, 128, 256], dtype=float)


def test_fit_recovers_known_hyperbola_within_1_percent():
    s_min, e_min = 1000.0, 64000.0
    fit = fit_hyperbola(B, s_min + e_min / B)
    assert fit.s_min == pytest.approx(s_min, rel=0.01)
    assert fit.e_min == pytest.approx(e_min, rel=0.01)
    assert fit.b_crit == pytest.approx(64.0, rel=0.01)


def test_fit_limits_are_explicit():
    assert math.isinf(fit_hyperbola(B, 5000 / B).b_crit)  # perfect scaling: knee above the range
    assert fit_hyperbola(B, 300 + 0 * B).b_crit == 0.0  # no scaling at all: knee below


def test_cbs_20_closed_form():
    # Zhang et al. 2024 under the McCandlish model: B* = 0.2 b_crit + 1.2 B0.
    # Check it is the batch whose steps exceed linear scaling from B0 by exactly 20 %.
    s_min, e_min, b0 = 100.0, 6400.0, 16.0
    bstar = cbs_20(e_min / s_min, b0)

    def steps(b):
        return s_min + e_min / b

    assert steps(bstar) == pytest.approx(1.2 * steps(b0) * b0 / bstar)


def test_the_20_percent_batch_sizes_get_b_crit_s_interval_mapped_through_them():
    # by hand, the main job's headline (docs/results.md): b_crit_ci [1.51, 75.6] sequences, B0 = 16:
    # cbs_20 = 0.2 b + 1.2 * 16 -> [0.302 + 19.2, 15.12 + 19.2]; 0.2 b -> [0.302, 15.12]
    c20, o20 = cbs_20_interval([1.51, 75.6], 16.0)
    assert c20 == pytest.approx([19.502, 34.32]) and o20 == pytest.approx([0.302, 15.12])
    c20, o20 = cbs_20_interval([5.9, None], 16.0)  # unbounded above stays unbounded
    assert c20 == [pytest.approx(20.38), None] and o20 == [pytest.approx(1.18), None]
    # in analyze_points: the same map of its own b_crit_ci, and the point estimates lie inside
    rng = np.random.default_rng(3)
    r = analyze_points(B, (1000 + 64000 / B) * np.exp(rng.normal(0, 0.05, B.size)), 16.0)
    lo, hi = r["b_crit_ci"]
    assert r["cbs_20_ci"] == pytest.approx([0.2 * lo + 19.2, 0.2 * hi + 19.2])
    assert r["b_compute_overhead_20_ci"] == pytest.approx([0.2 * lo, 0.2 * hi])
    assert r["cbs_20_ci"][0] < r["cbs_20"] < r["cbs_20_ci"][1]
    out = analyze_points(B, 5000 / B, 16)  # a knee past the range: no number, so no interval either
    assert out["cbs_20"] is None and out["cbs_20_ci"] is None and out["b_compute_overhead_20_ci"] is None


def test_tokens_to_target_interpolates_in_log_tokens():
    tok = [1000, 2000, 4000]
    loss = [3.0, 2.0, 1.0]
    assert tokens_to_target(tok, loss, 2.0) == pytest.approx(2000)
    # halfway in loss between 2000 and 4000 tokens -> geometric mean
    assert tokens_to_target(tok, loss, 1.5) == pytest.approx(math.sqrt(2000 * 4000))
    assert tokens_to_target(tok, loss, 0.5) is None


def test_analyze_points_reports_knee_outside_range():
    r = analyze_points(B, 5000 / B, 16)
    assert r["status"] == "above_range" and r["b_crit"] is None and "above" in r["message"]
    assert r["b_crit_bound"] == "> 256"
    r = analyze_points([4, 8], [10, 5], 16)
    assert r["status"] == "no_knee" and r["b_crit"] is None and r["b_crit_ci"] is None


def test_points_all_below_the_knee_are_never_a_bare_number():
    """Points below a knee at 11131 once printed b_crit = 2560."""
    rng = np.random.default_rng(7)
    b = np.array([4, 8, 16, 32, 64, 128, 256, 512, 1024], dtype=float)
    s = 30 * (1 + 11131 / b) * np.exp(rng.normal(0, 0.05, len(b)))
    r = analyze_points(b, s, 16)
    # steps fall about 1/B over the whole range, so flat steps (b_crit -> 0) are ruled out: the interval
    # has a positive lower end (not no_knee) and the fitted knee lies past the largest batch size
    assert r["status"] == "above_range" and r["b_crit"] is None and r["b_crit_bound"] == "> 1024"
    lo, hi = r["b_crit_ci"]
    assert 0 < lo and (hi is None or hi > 1024)


def test_analyze_points_below_range_and_edge():
    r = analyze_points(B, 300 * (1 + 0.5 / B), 16)
    assert r["status"] == "below_range" and r["b_crit"] is None and r["b_crit_bound"] == "< 4"
    # knee between the two largest batch sizes: fewer than 2 batch sizes above it
    r = analyze_points(B, 100 * (1 + 200 / B), 16)
    assert r["status"] == "edge" and r["b_crit"] == pytest.approx(200, rel=0.01)


def test_interval_exact_points_and_too_few():
    lo, hi = interval_b_crit(B, 1000 + 64000 / B)
    assert lo == pytest.approx(64, rel=1e-3) and hi == pytest.approx(64, rel=1e-3)
    assert interval_b_crit([4, 8, 8], [10, 5, 5.1]) == (0.0, math.inf)


def test_interval_hand_computed_profile_threshold():
    """The interval's ends are where the profile SSE equals SSE_min (1 + F(1, n-2)/(n-2))."""
    from scipy.stats import f as f_dist

    from sweeps.analysis.fit import _profile_sse

    rng = np.random.default_rng(3)
    s = (1000 + 64000 / B) * np.exp(rng.normal(0, 0.1, len(B)))
    lo, hi = interval_b_crit(B, s)
    fit = fit_hyperbola(B, s)
    sse_min = fit.rms_log_residual**2 * len(B)
    thr = sse_min * (1 + f_dist.ppf(0.95, 1, 5) / 5)
    y = np.log(s)
    for edge in (lo, hi):
        assert float(_profile_sse(B, y, np.array([math.log(edge)]))[0][0]) == pytest.approx(thr, rel=1e-6)
    assert lo < fit.b_crit < hi


def test_s_min_and_e_min_intervals_are_the_profile_region_of_a_brute_force_grid():
    """The ends of S_min's and E_min's intervals against a dense 2-D grid of the log-space SSE."""
    from scipy.stats import f as f_dist

    from sweeps.analysis.fit import interval_s_min_e_min

    rng = np.random.default_rng(11)
    s = (1000 + 64000 / B) * np.exp(rng.normal(0, 0.1, len(B)))
    (s_lo, s_hi), (e_lo, e_hi) = interval_s_min_e_min(B, s)
    fit = fit_hyperbola(B, s)
    assert s_lo < fit.s_min < s_hi and e_lo < fit.e_min < e_hi
    y = np.log(s)
    thr = fit.rms_log_residual**2 * len(B) * (1 + f_dist.ppf(0.95, 1, 5) / 5)
    ls = np.linspace(math.log(200), math.log(5000), 1601)  # log S_min
    le = np.linspace(math.log(5e3), math.log(1e6), 1601)  # log E_min
    sse = (
        (y[None, None, :] - np.log(np.exp(ls)[:, None, None] + np.exp(le)[None, :, None] / B[None, None, :])) ** 2
    ).sum(-1)
    inside_s = ls[sse.min(axis=1) <= thr]
    inside_e = le[sse.min(axis=0) <= thr]
    step = ls[1] - ls[0], le[1] - le[0]
    assert math.log(s_lo) == pytest.approx(inside_s.min(), abs=2 * step[0])
    assert math.log(s_hi) == pytest.approx(inside_s.max(), abs=2 * step[0])
    assert math.log(e_lo) == pytest.approx(inside_e.min(), abs=2 * step[1])
    assert math.log(e_hi) == pytest.approx(inside_e.max(), abs=2 * step[1])
    # exact points: the interval is the point; fewer than 3 batch sizes: unbounded
    exact = interval_s_min_e_min(B, 1000 + 64000 / B)
    assert exact[0] == pytest.approx((1000, 1000), rel=1e-3) and exact[1] == pytest.approx((64000, 64000), rel=1e-3)
    assert interval_s_min_e_min([4, 8, 8], [10, 5, 5.1]) == ((0.0, math.inf), (0.0, math.inf))


def test_s_min_reaches_zero_when_the_points_allow_perfect_scaling():
    """Steps that halve with every doubling of B (S = E/B) are consistent with S_min = 0."""
    from sweeps.analysis.fit import interval_s_min_e_min

    rng = np.random.default_rng(2)
    (s_lo, s_hi), (e_lo, e_hi) = interval_s_min_e_min(B, 64000 / B * np.exp(rng.normal(0, 0.05, len(B))))
    assert s_lo == 0.0 and s_hi < 64000 / B.max()
    assert 0 < e_lo < 64000 < e_hi < math.inf


def test_seeds_of_one_batch_size_are_one_point():
    """Duplicating every point (a second seed that agrees exactly) must not narrow the interval."""
    rng = np.random.default_rng(5)
    s = (1000 + 64000 / B) * np.exp(rng.normal(0, 0.1, len(B)))
    one = interval_b_crit(B, s)
    two = interval_b_crit(np.repeat(B, 2), np.repeat(s, 2))
    assert two == pytest.approx(one)


def test_interval_covers_truth_with_shared_batch_errors():
    """Shared per-batch-size errors plus seed noise, 2 seeds: coverage near nominal (the full check,
    1 and 2 seeds x 5 and 7 batch sizes, is benchmarks/ci_coverage.py). Pooling the seeds as
    independent points covered about 73-78 % in this setting."""
    rng = np.random.default_rng(123)
    b = np.repeat(B, 2)
    covered = 0
    for _ in range(300):
        truth = float(np.exp(rng.uniform(math.log(8), math.log(128))))
        shared = np.repeat(rng.normal(0, 0.12, len(B)), 2)
        s = 200 * (1 + truth / b) * np.exp(shared + rng.normal(0, 0.05, len(b)))
        lo, hi = interval_b_crit(b, s)
        covered += lo <= truth <= hi
    assert covered >= 0.9 * 300


def _synthetic_trials(b_crit_true=32.0, seeds=(0, 1), T=64):
    """Loss curves whose tokens-to-target follow E = E_min (1 + B/b_crit) for every target."""
    trials = []
    milestones = np.geomspace(2e3, 2e6, 40)
    for b in [4, 8, 16, 32, 64, 128, 256]:
        for seed in seeds:
            # loss(tokens) = 1 + 100 / (tokens_eff)^0.5 with tokens_eff = tokens / (1 + B/b_crit)
            eff = milestones / (1 + b / b_crit_true)
            loss = 1.0 + 30.0 / np.sqrt(eff) * (1 + 0.002 * seed)
            trials.append(
                TrialRecord(
                    trial_id=f"t{b}-{seed}",
                    batch_size_sequences=b,
                    seed=seed,
                    group_id=f"g{b}",
                    status="COMPLETED",
                    hyperparameters={"lr": 1e-3 * math.sqrt(b), "lr_rule": "sqrt"},
                    tokens=list(milestones),
                    val_loss=list(loss),
                    flops=list(milestones * 10.0),
                    b_simple=[1.0] * len(milestones),
                )
            )
    return trials


def test_analyze_trials_finds_the_planted_b_crit():
    res = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16, flops_per_token=10.0)
    assert res["status"] == "ok"
    assert 3 <= len(res["targets"]) <= 5
    # tokens = sequences * T: E(B) in sequences is E_min_tok/T (1 + B/b_crit) -> b_crit in sequences is 32
    assert res["b_crit"] == pytest.approx(32.0, rel=0.05)
    assert res["b_crit_tokens"] == pytest.approx(32.0 * 64, rel=0.05)
    for t in res["targets"]:
        assert t["b_crit_ci"][0] <= t["b_crit"] <= (t["b_crit_ci"][1] or math.inf)
    assert {p["batch_size_sequences"] for p in res["per_batch"]} == {4, 8, 16, 32, 64, 128, 256}
    assert res["lr_scaling_exponent_fit"] == pytest.approx(0.5, abs=1e-6)
    # one trial per batch size: random picks give exactly the same exponent (no spread to beat)
    assert res["lr_scaling_exponent_by_chance"]["mean"] == pytest.approx(0.5, abs=1e-6)
    assert res["target_rule"] == TARGET_RULE and res["interval_method"] == INTERVAL_METHOD


def test_cbs_json_opens_with_the_headline_and_keeps_every_key():
    """``cbs.json`` put ``trials`` first and ``headline`` near the end: the answer comes first now, with every
    other key still there (as written: finite_json, then JSON, keep the order)."""
    for trials in (_synthetic_trials(), []):  # a fit, and nothing to fit
        res = analyze_trials(trials, context_length_tokens=64, reference_batch=16, flops_per_token=10.0)
        keys = list(json.loads(json.dumps(finite_json(res))))
        assert keys[0] == "headline" and keys.count("headline") == 1
        assert {"trials", "b_crit", "b_crit_ci", "status", "per_batch", "targets", "caveats"} <= set(keys)
    assert res["headline"] and keys[1] == "trials"  # the rest in the order the analysis made them


def test_padded_rows_count_their_real_tokens_per_sequence():
    """Fine-tuning: a row of a 64-token context holding 40 real tokens is a 40-token sequence: the
    same token curves give 64/40 times more steps, the same knee in sequences, and b_crit in tokens
    is that knee times 40, not 64."""
    packed = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16)
    padded = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16, tokens_per_sequence=40.0)
    assert padded["tokens_per_sequence"] == 40.0 and packed["tokens_per_sequence"] == 64
    assert padded["b_crit"] == pytest.approx(packed["b_crit"], rel=1e-6)
    assert padded["s_min"] == pytest.approx(packed["s_min"] * 64 / 40, rel=1e-6)
    assert padded["b_crit_tokens"] == pytest.approx(padded["b_crit"] * 40.0)


def test_analyze_trials_without_completed_trials():
    res = analyze_trials([], context_length_tokens=64, reference_batch=16)
    assert res["status"] == "no_completed_trials" and res["b_crit"] is None


def test_cli_analyze_csv(tmp_path):
    p = tmp_path / "points.csv"
    rows = ["batch_size,steps_to_target"] + [f"{int(b)},{1000 + 64000 / b}" for b in B]
    p.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "16"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["s_min"] == pytest.approx(1000, rel=0.01)
    assert out["e_min"] == pytest.approx(64000, rel=0.01)
    assert out["b_crit"] == pytest.approx(64, rel=0.01)
    assert out["cbs_20"] == pytest.approx(0.2 * 64 + 1.2 * 16, rel=0.01)
    assert out["status"] == "ok" and out["b_crit_ci"][0] == pytest.approx(64, rel=0.01)


def test_cli_analyze_csv_repeated_batch_sizes_with_seed_column(tmp_path):
    rng = np.random.default_rng(0)
    p = tmp_path / "points.csv"
    rows = ["batch_size,steps_to_target,seed"] + [
        f"{int(b)},{(1000 + 64000 / b) * math.exp(rng.normal(0, 0.05))},{seed}" for b in B for seed in (0, 1)
    ]
    p.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "16"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["n_points"] == 14 and out["n_batch_sizes"] == 7 and out["seeds"] == ["0", "1"]
    assert out["status"] == "ok" and out["b_crit_ci"][0] < out["b_crit"] < out["b_crit_ci"][1]


def test_cli_analyze_csv_knee_above_range_prints_status_and_interval(tmp_path):
    p = tmp_path / "points.csv"
    rows = ["batch_size,steps_to_target"] + [f"{int(b)},{5000 / b * (1 + 0.01 * (i % 2))}" for i, b in enumerate(B)]
    p.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "16"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # S = 5000/B (1 % alternating noise): perfect scaling, so the knee lies above the range and the
    # interval is unbounded above but bounded below, past the largest batch size (flat steps are ruled out)
    assert out["b_crit"] is None and out["status"] == "above_range" and out["b_crit_bound"] == "> 256"
    assert out["b_crit_ci"][0] > 256 and out["b_crit_ci"][1] is None


def test_cli_analyze_csv_groups(tmp_path):
    p = tmp_path / "points.csv"
    rows = ["batch_size,steps_to_target,group"]
    rows += [f"{int(b)},{1000 + 64000 / b},a" for b in B] + [f"{int(b)},{10 + 80 / b},b" for b in B]
    p.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "8"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["a"]["b_crit"] == pytest.approx(64, rel=0.01)
    assert out["b"]["b_crit"] == pytest.approx(8, rel=0.01)


@pytest.mark.parametrize(
    "content,msg",
    [
        ("batch,steps\n1,2\n", "missing column"),
        ("batch_size,steps_to_target\n4,abc\n", "must be numbers"),
        ("batch_size,steps_to_target\n4,-1\n8,3\n", "positive"),
        ("batch_size,steps_to_target\n4,10\n", "at least 2 distinct"),
        ("batch_size,steps_to_target\n4,10\n4,11\n", "at least 2 distinct"),
    ],
)
def test_cli_analyze_bad_csv_exits_2(tmp_path, content, msg):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "16"])
    assert r.exit_code == 2
    assert msg in r.output


def test_cli_analyze_missing_file_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["analyze", "--csv", str(tmp_path / "nope.csv"), "--reference-batch", "16"])
    assert r.exit_code == 2 and "not found" in r.output


def _rec(tid, b, tokens, loss, *, seed=0, status="COMPLETED", lr=1e-3):
    return TrialRecord(
        trial_id=tid,
        batch_size_sequences=b,
        seed=seed,
        group_id=tid,
        status=status,
        hyperparameters={"lr": lr},
        tokens=[float(t) for t in tokens],
        val_loss=[float(v) for v in loss],
        flops=[float(t) * 10 for t in tokens],
    )


def test_steps_to_target_is_the_minimum_over_trials_per_target():
    """The trial with the best final loss is not the first to every target.

    B = 8, T = 16 (128 tokens a step). Trial a (a high LR) falls fast, then flattens; trial b (a low
    LR) is slow but ends lower. Target 3.0: a crosses between 1000 and 2000 tokens (loss 3.5 -> 2.5,
    halfway in loss = the geometric mean sqrt(1000 * 2000)), b only at 4000. Target 2.2: only b,
    between 4000 (3.0) and 8000 (2.0) at 0.8 of the way in loss: 4000 * 2 ** 0.8 tokens."""
    tok = [1000, 2000, 4000, 8000, 16000]
    a = _rec("a", 8, tok, [3.5, 2.5, 2.4, 2.35, 2.3])
    b = _rec("b", 8, tok, [4.5, 4.0, 3.0, 2.0, 1.9])
    pts, excluded = steps_to_target_points([a, b], 3.0, 16)
    assert excluded == [] and len(pts) == 1
    assert pts[0]["trial_id"] == "a"
    assert pts[0]["tokens_to_target"] == pytest.approx(math.sqrt(1000 * 2000))
    assert pts[0]["steps_to_target"] == pytest.approx(math.sqrt(1000 * 2000) / (8 * 16))
    pts, _ = steps_to_target_points([a, b], 2.2, 16)
    assert pts[0]["trial_id"] == "b" and pts[0]["tokens_to_target"] == pytest.approx(4000 * 2**0.8)


def test_a_pruned_trials_curve_counts_up_to_its_rung():
    tok = [1000, 2000, 4000, 8000]
    full = _rec("full", 4, tok, [4.0, 3.6, 3.2, 2.8])
    pruned = _rec("pruned", 4, tok[:2], [3.4, 2.9], status="PRUNED")
    pts, _ = steps_to_target_points([full, pruned], 3.0, 16)
    assert pts[0]["trial_id"] == "pruned"
    assert pts[0]["tokens_to_target"] == pytest.approx(1000 * 2**0.8)


def test_a_crossing_at_the_last_milestone_counts():
    """A batch size that reaches a target only at its last milestone (the budget) is a point like any
    other (the analysis once left it out, to keep it from dropping in and out of the fit with noise; since batch sizes
    short of a target enter the fit as censored points, it no longer drops out either way)."""
    tok = [1000, 2000, 4000]
    t = _rec("x", 16, tok, [3.0, 2.6, 2.4])
    pts, excluded = steps_to_target_points([t], 2.5, 16)
    assert excluded == [] and pts[0]["tokens_to_target"] == pytest.approx(2000 * 2**0.5)
    pts, excluded = steps_to_target_points([t], 2.3, 16)
    assert pts == [] and excluded == [16]


def test_choose_targets_are_reached_before_the_last_milestone():
    trials = _synthetic_trials(seeds=(0,))
    targets = choose_targets(trials)
    last = {t.batch_size_sequences: t.tokens[-1] for t in trials}
    lowest = min(targets)
    reaching = [
        t.batch_size_sequences
        for t in trials
        if any(loss <= lowest for tok, loss in zip(t.tokens, t.val_loss) if tok < last[t.batch_size_sequences])
    ]
    assert len(reaching) >= math.ceil(0.7 * 7)
    res = analyze_trials(trials, context_length_tokens=64, reference_batch=16, targets=targets)
    for entry in res["targets"]:
        for p in entry["points"]:
            tr = next(t for t in trials if t.trial_id == p["trial_id"])
            assert p["tokens_to_target"] < tr.tokens[-1]


def test_seeds_give_one_point_each_and_per_batch_records_the_winning_trials():
    trials = _synthetic_trials(seeds=(0, 1))
    res = analyze_trials(trials, context_length_tokens=64, reference_batch=16)
    primary = next(t for t in res["targets"] if t["target_loss"] == res["target_loss"])
    keys = [(p["batch_size_sequences"], p["seed"]) for p in primary["points"]]
    assert len(keys) == len(set(keys)) and len(keys) >= 2 * 5
    assert {b for b, s in keys if s == 0} == {b for b, s in keys if s == 1}
    row = res["per_batch"][0]
    assert set(row["trial_ids_to_target"]) == {f"t{row['batch_size_sequences']}-0", f"t{row['batch_size_sequences']}-1"}
    assert row["best_config_at_budget"]["lr_rule"] == "sqrt"


def test_lr_exponent_by_chance_spreads_when_configs_are_random():
    """A random LR per trial: the fitted exponent is no evidence, and the chance spread says so."""
    rng = np.random.default_rng(1)
    trials = []
    tok = np.geomspace(1e3, 1e6, 20)
    for b in (4, 8, 16, 32, 64, 128, 256):
        for k in range(3):
            lr = 1e-3 * 2 ** rng.uniform(-2, 2) * (b / 16) ** 0.5
            trials.append(_rec(f"{b}-{k}", b, tok, 1 + 30 / np.sqrt(tok / (1 + b / 32)) * (1 + 0.01 * k), lr=lr))
    # at a target every batch size reaches (the headline's lowest target leaves B = 256 censored, and the slope
    # of random picks over the six others' 18 drawn LRs happens to average 0.33)
    res = analyze_trials(trials, context_length_tokens=64, reference_batch=16, targets=[1.3])
    chance = res["lr_scaling_exponent_by_chance"]
    assert chance["mean"] == pytest.approx(0.5, abs=0.15) and chance["sd"] > 0.05


def test_analyze_trials_file_reproduces_cbs_json(tmp_path):
    trials = _synthetic_trials()
    cbs = finite_json(analyze_trials(trials, context_length_tokens=64, reference_batch=16, flops_per_token=10.0))
    cbs |= {"sweep_id": "s1", "flops_per_token": 10.0, "trials_planned": 14}
    (tmp_path / "cbs.json").write_text(json.dumps(cbs))
    (tmp_path / "trials.json").write_text(json.dumps(finite_json([t.to_dict() for t in trials])))
    r = CliRunner().invoke(app, ["analyze", "--trials", str(tmp_path / "trials.json")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == json.loads(json.dumps(cbs))
    r = CliRunner().invoke(app, ["analyze", "--trials", str(tmp_path / "trials.json"), "--target", "1.5"])
    out = json.loads(r.stdout)
    assert r.exit_code == 0 and [t["target_loss"] for t in out["targets"]] == [1.5]
    # loss 1.5 at 30 / sqrt(eff) = 0.5 (x 1.002 for seed 1): tokens = 3600 (1 + B/32) x 1.002 ** (2 seed), so
    # steps = tokens / (64 B) = S_min (1 + 32/B) with S_min = 3600 / (32 x 64) x 1.002 (the seeds' geometric
    # mean): every batch size 4-256 reaches it, at least 2 on each side of the knee at 32, and the points lie
    # so close to the hyperbola that the interval stays inside the swept range -> ok
    assert out["status"] == "ok" and out["b_crit"] == pytest.approx(32.0, rel=0.01)
    assert out["s_min"] == pytest.approx(3600 / (32 * 64) * 1.002, rel=0.01)
    assert 4 <= out["b_crit_ci"][0] < out["b_crit"] < out["b_crit_ci"][1] <= 256


def test_analyze_trials_file_uses_the_targets_the_sweeps_spec_fixed(tmp_path):
    """A sweep whose spec fixes its target losses was analysed at them: its re-analysis is too (it chose others
    from the curves, and gave another b_crit than ``cbs.json``'s)."""
    from sweeps.analysis.targets import TARGET_RULE_GIVEN

    trials = _synthetic_trials()
    cbs = finite_json(
        analyze_trials(trials, context_length_tokens=64, reference_batch=16, flops_per_token=10.0, targets=[1.6, 1.5])
    )
    cbs |= {"sweep_id": "s1", "flops_per_token": 10.0, "trials_planned": 14}
    assert cbs["target_rule"] == TARGET_RULE_GIVEN != TARGET_RULE
    (tmp_path / "cbs.json").write_text(json.dumps(cbs))
    (tmp_path / "trials.json").write_text(json.dumps(finite_json([t.to_dict() for t in trials])))
    (tmp_path / "spec.yaml").write_text("name: s\ntargets: [1.5, 1.6]\n")
    r = CliRunner().invoke(app, ["analyze", "--trials", str(tmp_path / "trials.json")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == json.loads(json.dumps(cbs))
    (tmp_path / "spec.yaml").write_text("name: s\ntargets: null\n")  # no fixed targets: chosen from the curves
    auto = json.loads(CliRunner().invoke(app, ["analyze", "--trials", str(tmp_path / "trials.json")]).stdout)
    assert [t["target_loss"] for t in auto["targets"]] != [1.6, 1.5] and auto["target_rule"] == TARGET_RULE


@pytest.mark.parametrize(
    "args,msg",
    [
        ([], "exactly one of --csv, --trials or --comparison"),
        (["--trials", "nope.json"], "not found"),
        (["--comparison", "nope", "--target", "2"], "takes no --target"),
        (["--comparison", "nope"], "holds no comparison"),
        (["--csv", "x.csv"], "needs --reference-batch"),
    ],
)
def test_cli_analyze_bad_flags_exit_2(tmp_path, args, msg):
    r = CliRunner().invoke(
        app, ["analyze", *[str(tmp_path / a) if a.endswith((".json", ".csv")) or a == "nope" else a for a in args]]
    )
    assert r.exit_code == 2 and msg in r.output


def test_an_interval_past_the_swept_range_is_edge_not_ok():
    """Five noisy batch sizes (the main job's situation): the knee's estimate lies inside the range
    but its interval reaches below the smallest batch size, so the status is edge, with the reason."""
    b = np.array([4, 8, 16, 32, 64], dtype=float)
    s = 50 * (1 + 13 / b) * np.exp(np.array([0.25, -0.2, 0.1, -0.15, 0.2]))
    r = analyze_points(b, s, 16)
    assert r["b_crit_ci"][0] < 4 and 4 <= r["b_crit"] <= 64
    assert r["status"] == "edge" and "below the smallest" in r["message"]
    # the range it speaks of is the batch sizes in the fit (those that reached the target), said so
    assert "of the fitted batch sizes (4 to 64, those that reached this target): they do not pin" in r["message"]


def test_lr_exponent_by_chance_does_not_depend_on_the_order_of_the_trials():
    from sweeps.analysis.lr_scaling import lr_exponent_by_chance as _lr_exponent_by_chance

    trials = [
        TrialRecord(
            trial_id=f"t{b}-{i}",
            batch_size_sequences=b,
            seed=0,
            group_id=f"t{b}-{i}",
            status="COMPLETED",
            hyperparameters={"lr": 1e-3 * (b**0.5) * m},
            tokens=[1.0],
            val_loss=[1.0],
            flops=[1.0],
            b_simple=[None],
        )
        for b in (4, 8, 16, 32)
        for i, m in enumerate((0.5, 1.0, 2.0))
    ]
    forward = _lr_exponent_by_chance(trials, {4, 8, 16, 32})
    assert forward == _lr_exponent_by_chance(list(reversed(trials)), {4, 8, 16, 32})
    assert forward["mean"] == pytest.approx(0.5, abs=0.05)  # multipliers spread evenly around the sqrt rule


def test_a_comparison_row_gives_steps_tokens_and_synchronizations_to_target_each_with_an_interval():
    from sweeps.analysis.compare import compare_arms

    rng = np.random.default_rng(4)
    noisy = _synthetic_trials()
    for t in noisy:  # a per-batch-size error, so that the intervals have a width
        t.val_loss = list(np.asarray(t.val_loss) * math.exp(rng.normal(0, 0.01)))
    ref = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16)
    targets = [t["target_loss"] for t in ref["targets"]]
    local = analyze_trials(noisy, context_length_tokens=64, reference_batch=16, targets=targets)
    info = {"sync": "ddp", "sync_every_steps": 1, "replicas": 1, "optimizer": "adamw", "status": "SUCCEEDED"}
    out = compare_arms(
        [("ddp", info, ref), ("local", {**info, "sync": "local_sgd", "sync_every_steps": 4, "replicas": 4}, local)]
    )
    row = next(r for r in out["arms"][1]["targets"] if r["s_min"] is not None and r["s_min_ci"][1] is not None)
    lo, hi = row["s_min_ci"]
    assert lo < row["s_min"] < hi
    assert row["syncs_min"] == pytest.approx(row["s_min"] / 4)
    assert row["syncs_min_ci"] == pytest.approx([lo / 4, hi / 4])
    assert row["e_min_tokens_ci"] == pytest.approx([x * 64 for x in row["e_min_ci"]])
    assert all(p["syncs_to_target"] == pytest.approx(p["steps_to_target"] / 4) for p in row["points"])


def test_a_batch_size_short_of_the_target_is_a_censored_point_with_the_steps_it_needs_more_than():
    """A batch size with no crossing enters cbs.json as a censored point, not only as an excluded
    number. Its bound is the minimum over its trials of the tokens each is known to be above the target: the
    budget for one that ended above it, its last milestone for a pruned one; a diverged trial sets none. A trial
    that crosses at the last milestone is a point."""
    tok = [1000, 2000, 4000]
    above = _rec("above", 16, tok, [3.0, 2.8, 2.6])  # ends above 2.5: needs more than 4000 tokens
    slow = _rec("slow", 32, tok, [3.0, 2.8, 2.7])  # ends above it: more than 4000...
    pruned = _rec(
        "pruned", 32, tok[:1], [3.1], status="PRUNED"
    )  # ...but this one stopped at 1000: the bound falls to 1000
    at_last = _rec("at_last", 128, tok, [3.0, 2.8, 2.4])  # crosses at the last milestone: a point, not censored
    diverged = _rec("diverged", 64, tok[:2], [3.0, float("nan")], status="DIVERGED")
    fast = _rec("fast", 64, tok, [3.0, 2.9, 2.7])  # B = 64's bound comes from this one: 4000
    reached = _rec("reached", 8, tok, [2.9, 2.4, 2.2])  # crosses at 2000: a point, not censored
    cens = censored_points([above, slow, pruned, diverged, fast, reached, at_last], 2.5, 16)
    assert [(c["batch_size_sequences"], c["tokens_lower_bound"], c["trial_id"]) for c in cens] == [
        (16, 4000.0, "above"),
        (32, 1000.0, "pruned"),
        (64, 4000.0, "fast"),
    ]
    assert cens[0]["steps_lower_bound"] == pytest.approx(4000 / (16 * 16))
    alone = censored_points([diverged], 2.5, 16)
    assert alone == [
        {
            "batch_size_sequences": 64,
            "seed": 0,
            "tokens_lower_bound": None,
            "steps_lower_bound": None,
            "trial_id": "diverged",
        }
    ]
    assert censored_points([at_last], 2.9, 16) == []  # crosses 2.9 at 2000 tokens


def test_cbs_json_names_its_censored_points_and_whether_the_fit_agrees_with_them():
    """The largest batch sizes are cut at a budget too short for the lowest target: cbs.json lists them as
    censored with the steps they needed more than and the fit's steps there; per_batch gives each batch
    size's token budget and the tokens its trials used. A censored point the fit says should have crossed
    (fit steps below its bound) is a contradiction, said in the target's message."""
    trials = _synthetic_trials(seeds=(0,))
    cut = []
    for t in trials:  # B = 128 and 256 get a quarter of the tokens: they miss the lowest targets
        if t.batch_size_sequences >= 128:
            keep = len(t.tokens) // 4
            t.tokens, t.val_loss, t.flops, t.b_simple = (
                t.tokens[:keep],
                t.val_loss[:keep],
                t.flops[:keep],
                t.b_simple[:keep],
            )
        cut.append(t)
    res = analyze_trials(cut, context_length_tokens=64, reference_batch=16)
    primary = next(t for t in res["targets"] if t["target_loss"] == res["target_loss"])
    censored = {c["batch_size_sequences"] for c in primary["censored_points"]}
    assert censored == set(primary["excluded_batch_sizes"]) and censored, primary["excluded_batch_sizes"]
    assert res["censored_points"] == primary["censored_points"]
    for c in primary["censored_points"]:
        assert c["steps_lower_bound"] == pytest.approx(c["tokens_lower_bound"] / (c["batch_size_sequences"] * 64))
        assert c["fit_steps"] == pytest.approx(res["s_min"] + res["e_min"] / c["batch_size_sequences"])
        assert c["fit_consistent"] is True  # the planted curves obey the hyperbola past the budget too
    rows = {r["batch_size_sequences"]: r for r in res["per_batch"]}
    assert rows[256]["budget_tokens"] == pytest.approx(cut[-1].tokens[-1])
    assert rows[256]["budget_tokens"] < rows[4]["budget_tokens"]
    assert rows[4]["tokens_trained"] == pytest.approx(max(cut[0].tokens)) and rows[4]["trials"] == 1

    assert primary["censored_in_fit"] == sorted(float(b) for b in censored)  # they are in the fit, as bounds

    # the same curves, B = 256 given 4x the tokens and slower than the hyperbola allows (it needs more steps than the
    # fit gives it): its bound enters the fit and pulls S_min up
    slow = [t for t in cut if t.batch_size_sequences != 256]
    t256 = next(t for t in cut if t.batch_size_sequences == 256)
    slow.append(
        TrialRecord(
            trial_id="slow",
            batch_size_sequences=256,
            seed=0,
            group_id="slow",
            status="COMPLETED",
            hyperparameters=t256.hyperparameters,
            tokens=[4 * x for x in trials[0].tokens],
            val_loss=[v + 5.0 for v in trials[0].val_loss],
            flops=list(trials[0].flops),
        )
    )
    res2 = analyze_trials(slow, context_length_tokens=64, reference_batch=16, targets=[res["target_loss"]])
    c256 = next(c for c in res2["censored_points"] if c["batch_size_sequences"] == 256)
    assert c256["steps_lower_bound"] > res["s_min"] + res["e_min"] / 256  # more than the first fit gave it
    assert res2["s_min"] > res["s_min"] and res2["b_crit"] < res["b_crit"]
    assert res2["b_crit_ci"][1] / res2["b_crit_ci"][0] > res["b_crit_ci"][1] / res["b_crit_ci"][0]  # and less sure
    # five points on a hyperbola outweigh one bound: the fit still gives B = 256 fewer steps than it needed, and says so
    assert c256["fit_consistent"] is False and c256["fit_steps"] < c256["steps_lower_bound"]
    msg = res2["targets"][0]["message"]
    assert "256 did not reach this target" in msg and "overstated (above the knee)" in msg, msg


def test_a_contradicting_censored_point_says_which_way_b_crit_would_move():
    """Above the knee, more steps than the fit allows raise S_min (b_crit reads high); below it they raise E_min
    (it reads low); with no b_crit (a knee outside the range) no direction; each batch size named once."""
    from sweeps.analysis.sweep import _contradiction_note

    def cell(b, ok):
        return {"batch_size_sequences": b, "fit_consistent": ok}

    assert _contradiction_note([cell(128, True)], 17.0) == ""
    above = _contradiction_note([cell(256, False), cell(256, False)], 17.0)
    assert "size(s) 256 did" in above and "overstated (above the knee)" in above and "understated" not in above
    below = _contradiction_note([cell(4, False)], 17.0)
    assert "understated (below the knee)" in below and "overstated" not in below
    none = _contradiction_note([cell(4, False)], None)
    assert "stated" not in none and none.endswith("unless their trials' learning rates were poor")
