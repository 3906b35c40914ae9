import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from sweeps.analysis import (
    TrialRecord,
    analyze_points,
    analyze_trials,
    bootstrap_b_crit,
    cbs_20,
    fit_hyperbola,
    tokens_to_target,
)
from sweeps.cli import app

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
    steps = lambda b: s_min + e_min / b  # noqa: E731
    assert steps(bstar) == pytest.approx(1.2 * steps(b0) * b0 / bstar)


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
    r = analyze_points([4, 8], [10, 5], 16)
    assert r["status"] == "too_few_points"


def test_bootstrap_ci_covers_truth_in_at_least_90_of_100_repetitions():
    """Curves from a known S_min, E_min plus 10 % log-normal noise, 2 seeds per batch size."""
    rng = np.random.default_rng(123)
    b = np.repeat(B, 2)
    truth = 64.0
    covered = 0
    for rep in range(100):
        s = (1000 + 64000 / b) * np.exp(rng.normal(0, 0.1, len(b)))
        lo, hi = bootstrap_b_crit(b, s, n_boot=1000, seed=rep)
        covered += lo <= truth <= hi
    assert covered >= 90


def _synthetic_trials(b_crit_true=32.0, seeds=(0, 1), T=64):
    """Loss curves whose tokens-to-target follow E = E_min (1 + B/b_crit) for every target."""
    trials = []
    milestones = np.geomspace(2e3, 2e6, 40)
    for b in [4, 8, 16, 32, 64, 128, 256]:
        for seed in seeds:
            # loss(tokens) = 1 + 100 / (tokens_eff)^0.5 with tokens_eff = tokens / (1 + B/b_crit)
            eff = milestones / (1 + b / b_crit_true)
            loss = 1.0 + 30.0 / np.sqrt(eff) * (1 + 0.002 * seed)
            trials.append(TrialRecord(
                trial_id=f"t{b}-{seed}", batch_size_sequences=b, seed=seed, group_id=f"g{b}", status="COMPLETED",
                hyperparameters={"lr": 1e-3 * math.sqrt(b), "lr_rule": "sqrt"}, tokens=list(milestones),
                val_loss=list(loss), flops=list(milestones * 10.0), b_simple=[1.0] * len(milestones)))
    return trials


def test_analyze_trials_finds_the_planted_b_crit():
    res = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16, flops_per_token=10.0, n_boot=200)
    assert res["status"] == "ok"
    assert 3 <= len(res["targets"]) <= 5
    # tokens = sequences * T: E(B) in sequences is E_min_tok/T (1 + B/b_crit) -> b_crit in sequences is 32
    assert res["b_crit"] == pytest.approx(32.0, rel=0.05)
    assert res["b_crit_tokens"] == pytest.approx(32.0 * 64, rel=0.05)
    for t in res["targets"]:
        assert t["b_crit_ci"][0] <= t["b_crit"] <= (t["b_crit_ci"][1] or math.inf)
    assert {p["batch_size_sequences"] for p in res["per_batch"]} == {4, 8, 16, 32, 64, 128, 256}
    assert res["lr_scaling_exponent_fit"] == pytest.approx(0.5, abs=1e-6)


def test_padded_rows_count_their_real_tokens_per_sequence():
    """Fine-tuning: a row of a 64-token context holding 40 real tokens is a 40-token sequence: the
    same token curves give 64/40 times more steps, the same knee in sequences, and b_crit in tokens
    is that knee times 40, not 64."""
    packed = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16, n_boot=50)
    padded = analyze_trials(_synthetic_trials(), context_length_tokens=64, reference_batch=16, n_boot=50,
                            tokens_per_sequence=40.0)
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
    out = json.loads(r.output)
    assert out["s_min"] == pytest.approx(1000, rel=0.01)
    assert out["e_min"] == pytest.approx(64000, rel=0.01)
    assert out["b_crit"] == pytest.approx(64, rel=0.01)
    assert out["cbs_20"] == pytest.approx(0.2 * 64 + 1.2 * 16, rel=0.01)


def test_cli_analyze_csv_groups(tmp_path):
    p = tmp_path / "points.csv"
    rows = ["batch_size,steps_to_target,group"]
    rows += [f"{int(b)},{1000 + 64000 / b},a" for b in B] + [f"{int(b)},{10 + 80 / b},b" for b in B]
    p.write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "8"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["a"]["b_crit"] == pytest.approx(64, rel=0.01)
    assert out["b"]["b_crit"] == pytest.approx(8, rel=0.01)


@pytest.mark.parametrize("content,msg", [
    ("batch,steps\n1,2\n", "missing column"),
    ("batch_size,steps_to_target\n4,abc\n", "must be numbers"),
    ("batch_size,steps_to_target\n4,-1\n8,3\n", "positive"),
    ("batch_size,steps_to_target\n4,10\n", "at least 2 distinct"),
])
def test_cli_analyze_bad_csv_exits_2(tmp_path, content, msg):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    r = CliRunner().invoke(app, ["analyze", "--csv", str(p), "--reference-batch", "16"])
    assert r.exit_code == 2
    assert msg in r.output


def test_cli_analyze_missing_file_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["analyze", "--csv", str(tmp_path / "nope.csv"), "--reference-batch", "16"])
    assert r.exit_code == 2 and "not found" in r.output
