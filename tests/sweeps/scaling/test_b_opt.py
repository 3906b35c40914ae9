"""B_opt, the batch size of lowest loss at a fixed budget: the per-batch-size best loss at D read from trials, the
parabola's vertex recovered with an interval that covers at its level, the edge and flat statuses, its power law
across synthetic members with a known exponent, and its section of scale.json and of the MLflow metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from sweeps.errors import InvalidInput
from sweeps.scaling import (
    BestBatch,
    StudyMember,
    b_opt_from_losses,
    b_opt_member,
    b_opt_result,
    member_from_cbs,
    scale_result,
)
from sweeps.scaling.b_opt import LR_CAVEAT, best_loss_at_budget

SIZES = (2, 4, 8, 16, 32, 64, 128, 256)


def _parabola_losses(rng, b_opt: float, noise: float, curvature: float = 0.05) -> dict[int, float]:
    """``2 + curvature (log2 B - log2 b_opt)^2`` plus normal noise of sd ``noise`` (nats per token)."""
    return {b: 2.0 + curvature * (math.log2(b) - math.log2(b_opt)) ** 2 + float(rng.normal(0, noise)) for b in SIZES}


def test_the_best_loss_at_the_budget_counts_only_trials_that_reached_it():
    trials = [
        {"batch_size_sequences": 8, "tokens": [100.0, 200.0], "val_loss": [3.0, 2.5]},
        {"batch_size_sequences": 8, "tokens": [100.0, 200.0], "val_loss": [3.1, 2.4]},
        {"batch_size_sequences": 16, "tokens": [100.0], "val_loss": [2.0]},  # stopped before D: no loss at D
        {"batch_size_sequences": 32, "tokens": [100.0, 200.0, 300.0], "val_loss": [3.0, 2.9, 2.8]},
    ]
    losses, counts = best_loss_at_budget(trials, 200.0)
    assert losses == {8: 2.4, 32: 2.9} and counts == {8: (2, 0), 16: (0, 1), 32: (1, 0)}


def test_a_known_minimum_is_recovered_and_its_interval_covers_at_its_level():
    """Under the model the method assumes (a parabola in log2 B, normal noise), Fieller's set is exact: 95 %
    intervals must cover the true B_opt in about 95 % of 400 studies (binomial sd 1.1 %)."""
    rng = np.random.default_rng(0)
    fit = b_opt_from_losses(_parabola_losses(rng, 12.0, 0.005), 1e6)
    assert fit.status == "ok" and fit.batch_size_sequences == pytest.approx(12.0, rel=0.1)
    covered = 0
    for _ in range(400):
        fit = b_opt_from_losses(_parabola_losses(rng, 12.0, 0.02), 1e6)
        assert fit.status in ("ok", "flat")
        covered += fit.interval_sequences is not None and fit.interval_sequences[0] < 12.0 < fit.interval_sequences[1]
    assert 0.92 <= covered / 400 <= 0.98


def test_a_minimum_at_the_smallest_batch_size_is_an_edge_with_a_one_sided_bound():
    fit = b_opt_from_losses(_parabola_losses(np.random.default_rng(1), 1.0, 0.005), 1e6)
    assert fit.status == "edge" and fit.batch_size_sequences is None and fit.interval_sequences is None
    assert fit.bound is not None and fit.bound["side"] == "below"
    assert "smallest batch size swept (2)" in fit.message
    top = b_opt_from_losses(_parabola_losses(np.random.default_rng(1), 1000.0, 0.005), 1e6)
    assert top.status == "edge" and top.bound is not None and top.bound["side"] == "above"


def test_a_flat_curve_and_too_few_batch_sizes_give_no_interval():
    flat = b_opt_from_losses({4: 2.0, 8: 1.9, 16: 2.1, 32: 2.0, 64: 1.95, 128: 2.05}, 1e6)
    assert flat.status == "flat" and flat.interval_sequences is None
    few = b_opt_from_losses({4: 2.0, 8: 1.9, 16: 2.1}, 1e6)
    assert few.status == "too_few_batch_sizes"
    with pytest.raises(InvalidInput, match="confidence level"):
        b_opt_from_losses({4: 2.0, 8: 1.9, 16: 2.1, 32: 2.2}, 1e6, level=1.5)


def _write_sweep(folder: Path, budget: float, losses: dict[int, float], b_crit: float = 20.0) -> Path:
    """A sweep folder with what the study reads: one finished trial per batch size (its last milestone at the
    budget) and one stopped at half the budget; a cbs.json and a spec.yaml."""
    folder.mkdir(parents=True)
    trials = [
        {"batch_size_sequences": b, "tokens": [budget / 2, budget], "val_loss": [loss + 0.5, loss]}
        for b, loss in losses.items()
    ] + [{"batch_size_sequences": 4, "tokens": [budget / 2], "val_loss": [1.0]}]
    (folder / "trials.json").write_text(json.dumps(trials))
    cbs = {"b_crit": b_crit, "b_crit_ci": [b_crit / 1.5, b_crit * 1.5], "status": "ok", "tokens_per_sequence": 64}
    (folder / "cbs.json").write_text(json.dumps(cbs))
    (folder / "spec.yaml").write_text(yaml.safe_dump({"budget_tokens": budget}))
    return folder


def _synthetic_study(tmp_path: Path, gamma: float = 0.5) -> list[tuple[StudyMember, BestBatch]]:
    rng = np.random.default_rng(3)
    out = []
    for d in (1e6, 2e6, 4e6, 8e6):
        folder = _write_sweep(tmp_path / f"d{d:.0f}", d, _parabola_losses(rng, 8.0 * (d / 1e6) ** gamma, 0.002))
        out.append(b_opt_member(folder, d))
    return out


def test_the_law_of_b_opt_recovers_a_known_exponent(tmp_path):
    measured = _synthetic_study(tmp_path)
    assert all(d.status == "ok" and d.trials_stopped_early == 1 for _, d in measured)
    section = b_opt_result(measured, predict_tokens=1e9, tokens_per_sequence=64)
    assert section["gamma"] == pytest.approx(0.5, abs=0.1)
    assert section["gamma_ci"][0] < 0.5 < section["gamma_ci"][1]
    assert section["status"] == "ok" and section["absent"] is None and section["caveats"][0] == LR_CAVEAT
    assert section["caveats"][1].startswith("4 of 36 trials: trials stopped before D")
    assert section["members"][0]["trials_by_batch_size"]["4"] == [1, 1]
    pred = section["prediction"]
    assert pred["interval"][0] < pred["b_opt"] < pred["interval"][1]
    assert pred["b_opt"] == pytest.approx(8.0 * 1e3**0.5, rel=0.5)
    assert {p["name"] for p in pred["published"]} == {"Power Lines b_opt", "Step Law b_opt"}
    assert all(m["log_residual"] is not None for m in section["members"])


def test_scale_json_has_the_b_opt_section_or_says_why_not(tmp_path):
    measured = _synthetic_study(tmp_path)
    b_crit = [member_from_cbs(Path(m.label)) for m, _ in measured]  # 20 sequences at every budget
    result = scale_result(b_crit, predict_tokens=1e9, b_opt_members=measured)
    assert result["b_opt"]["gamma"] == pytest.approx(0.5, abs=0.1) and "b_opt is most likely" in result["answer"]
    assert result["quantity"] == "b_crit" and result["gamma"] == pytest.approx(0.0, abs=1e-9)  # b_crit's own
    tables = [StudyMember(d, 20.0, (10.0, 40.0)) for d in (1e6, 4e6)]
    result = scale_result(tables)
    assert result["b_opt"]["gamma"] is None and "steps-to-target tables" in result["b_opt"]["absent"]
    assert result["answer"].endswith(result["b_opt"]["answer"])
    mixed = scale_result(tables + b_crit, b_opt_members=measured)
    assert mixed["b_opt"]["gamma"] is not None
    assert mixed["b_opt"]["caveats"][-1].startswith("2 member(s) are steps-to-target tables")


def test_the_study_run_logs_b_opts_exponent_and_prediction(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from sweeps.scaling.tracking import log_study

    measured = _synthetic_study(tmp_path)
    client = MlflowClient(mlflow_uri)
    exp_id = client.create_experiment("study")
    for m, _ in measured:  # each member's cbs.json names its sweep's MLflow store
        cbs_path = Path(m.label) / "cbs.json"
        cbs = json.loads(cbs_path.read_text())
        cbs["mlflow"] = {"tracking_uri": mlflow_uri, "experiment_id": exp_id}
        cbs_path.write_text(json.dumps(cbs))
    result = scale_result(
        [member_from_cbs(Path(m.label)) for m, _ in measured], predict_tokens=1e9, b_opt_members=measured
    )
    logged = log_study("synthetic", result, [Path(m.label) for m, _ in measured], [])
    assert logged is not None
    run = client.get_run(logged["study_run_id"])
    metrics = run.data.metrics
    assert metrics["b_opt_gamma"] == pytest.approx(result["b_opt"]["gamma"])
    assert metrics["b_opt_gamma_ci_low"] < metrics["b_opt_gamma"] < metrics["b_opt_gamma_ci_high"]
    assert metrics["predicted_b_opt_low"] < metrics["predicted_b_opt"] < metrics["predicted_b_opt_high"]
    assert metrics["predicted_b_opt"] == pytest.approx(result["b_opt"]["prediction"]["b_opt"])
    assert run.data.tags["critbatch.b_opt_status"] == "ok" and metrics["gamma"] == pytest.approx(0.0, abs=1e-9)


def test_malformed_trials_cbs_or_a_far_prediction_are_named_not_a_traceback(tmp_path):
    folder = _write_sweep(tmp_path / "d", 1e6, {4: 2.0, 8: 1.9, 16: 2.0})
    (folder / "trials.json").write_text(json.dumps([{"tokens": [1e6], "val_loss": [2.0]}]))
    _, details = b_opt_member(folder, 1e6)
    assert details.status == "no_trials" and "a trial has no 'batch_size_sequences'" in details.message
    (folder / "cbs.json").write_text("[1]")
    with pytest.raises(InvalidInput, match="not a sweep's cbs.json"):
        member_from_cbs(folder)
    members = [StudyMember(d, 8 * (d / 1e6) ** 1.5, (6 * (d / 1e6) ** 1.5, 11 * (d / 1e6) ** 1.5)) for d in (1e6, 4e6)]
    assert scale_result(members, predict_tokens=1e30)["prediction"]["interval"][1] < math.inf
    with pytest.raises(InvalidInput, match="overflows a float"):
        scale_result(members, predict_tokens=1e300)
