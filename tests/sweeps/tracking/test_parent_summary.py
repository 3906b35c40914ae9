"""What the MLflow parent run says at the end of a sweep, and which trial metrics are worth a chart, on a real
SQLite store (sweeps/tracking/writer.py): the interval's ends and the headline target loss as metrics, the fit's
status beside the sweep's, the headline sentence as the run's description; a once-per-attempt value logged once,
a lone ddp worker's zero communication counters not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.analysis.summary import headline
from sweeps.spec import parse_spec
from sweeps.tracking.writer import MlflowTracker

FIXTURE = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "wikitext_cbs.json"


def _tracker(mlflow_uri: str, spec_dict: dict, sweep_id: str) -> MlflowTracker:
    tracker = MlflowTracker(MlflowClient(mlflow_uri), parse_spec(spec_dict), sweep_id)
    tracker.start_parent()
    return tracker


def test_the_parent_run_holds_the_interval_the_fit_status_and_the_headline(tiny_spec_dict, mlflow_uri):
    cbs = json.loads(FIXTURE.read_text())
    tracker = _tracker(mlflow_uri, tiny_spec_dict, "summary-sweep")
    summary = {"b_crit": cbs["b_crit"], "cbs_20": cbs["cbs_20"], "trials_completed": 12}
    assert tracker.finish("SUCCEEDED", summary, None, message=cbs["message"], drain_s=5, analysis=cbs)
    run = tracker.client.get_run(tracker.parent_run_id)
    m, tags = run.data.metrics, run.data.tags
    assert m["b_crit_ci_low"] == pytest.approx(cbs["b_crit_ci"][0])
    assert m["b_crit_ci_high"] == pytest.approx(cbs["b_crit_ci"][1])
    assert m["target_loss"] == pytest.approx(6.370682103729248)
    assert m["b_crit"] == pytest.approx(cbs["b_crit"]) and m["trials_completed"] == 12
    assert tags["critbatch.status"] == "SUCCEEDED"  # the sweep's state
    assert tags["critbatch.fit_status"] == "edge"  # the fit's
    assert tags["mlflow.note.content"] == headline(cbs)
    assert tags["critbatch.message"] == cbs["message"]
    assert run.info.status == "FINISHED"


def test_the_parent_reads_cbs_json_from_its_artifacts_and_logs_no_open_end(tiny_spec_dict, mlflow_uri, tmp_path):
    above = json.loads(FIXTURE.read_text())["targets"][0]  # above_range: interval [34.9, open]
    art = tmp_path / "art"
    art.mkdir()
    (art / "cbs.json").write_text(json.dumps(above))
    tracker = _tracker(mlflow_uri, tiny_spec_dict, "summary-above")
    assert tracker.finish("SUCCEEDED", {"target_loss": above["target_loss"]}, str(art), drain_s=5)
    run = tracker.client.get_run(tracker.parent_run_id)
    assert run.data.metrics["b_crit_ci_low"] == pytest.approx(34.93125322309322)
    assert "b_crit_ci_high" not in run.data.metrics and "b_crit" not in run.data.metrics
    assert run.data.tags["critbatch.fit_status"] == "above_range"
    assert run.data.tags["mlflow.note.content"].startswith("At target loss 6.656, the knee lies above the largest")


def test_the_parent_run_holds_the_measured_lr_exponent_and_the_rules_its_interval_holds(tiny_spec_dict, mlflow_uri):
    cbs = json.loads(FIXTURE.read_text()) | {
        "lr_scaling_exponent_fit": 0.42,
        "lr_scaling_exponent_ci": [0.1, 0.74],
        "lr_scaling_rules_in_interval": ["sqrt"],
    }
    tracker = _tracker(mlflow_uri, tiny_spec_dict, "summary-lr")
    assert tracker.finish("SUCCEEDED", {}, None, drain_s=5, analysis=cbs)
    run = tracker.client.get_run(tracker.parent_run_id)
    assert run.data.metrics["lr_scaling_exponent"] == pytest.approx(0.42)
    assert run.data.metrics["lr_scaling_exponent_ci_low"] == pytest.approx(0.1)
    assert run.data.metrics["lr_scaling_exponent_ci_high"] == pytest.approx(0.74)
    assert run.data.tags["critbatch.lr_scaling_rules_in_interval"] == "sqrt"


def test_a_crashed_sweep_is_described_by_its_message(tiny_spec_dict, mlflow_uri):
    tracker = _tracker(mlflow_uri, tiny_spec_dict, "summary-crash")
    assert tracker.finish("FAILED", {}, None, message="sweep crashed: boom", drain_s=5)
    tags = tracker.client.get_run(tracker.parent_run_id).data.tags
    assert tags["mlflow.note.content"] == "Sweep failed: sweep crashed: boom"
    assert "critbatch.fit_status" not in tags and tags["critbatch.status"] == "FAILED"


def _report(tokens: int, **extra) -> dict:
    return {
        "tokens_seen": tokens,
        "val_loss": 3.0 - tokens / 1e5,
        "flops": 10.0 * tokens,
        "syncs": 0,
        "comm_bytes_per_step": 0.0,
        "comm_bytes_total": 0,
        "comm_time_s": 0.0,
        **extra,
    }


def _run_trial(tracker: MlflowTracker, reports: list[dict]) -> str:
    config = {
        "batch_size_sequences": 8,
        "seed": 0,
        "lr": 1e-3,
        "lr_rule": "sqrt",
        "lr_multiplier": 1.0,
        "beta2": 0.99,
        "beta2_half_life_tokens": 2048.0,
    }
    tracker.trial_started("t1", config, {})
    for r in reports:
        tracker.trial_result("t1", r)
    assert tracker.outbox.drain(timeout_s=5)
    return tracker._run_id("t1")


def test_once_per_attempt_values_are_logged_when_they_change_and_lone_ddp_workers_log_no_sync(
    tiny_spec_dict, mlflow_uri
):
    tracker = _tracker(mlflow_uri, tiny_spec_dict, "metrics-ddp1")
    first = dict(startup_s=12.5, startup_ray_s=3.0, trainable_params=29792, optimizer_state_bytes_per_param=8.0)
    # a worker-group restart at 4096 tokens: a new start-up time, the same model
    reports = [
        _report(2048, **first),
        _report(4096, startup_s=7.0, startup_ray_s=2.0, trainable_params=29792),
        _report(6144, trainable_params=29792),
        _report(8192),
    ]
    rid = _run_trial(tracker, reports)
    c = tracker.client
    assert [m.step for m in c.get_metric_history(rid, "val_loss")] == [2048, 4096, 6144, 8192]
    assert [(m.step, m.value) for m in c.get_metric_history(rid, "trainable_params")] == [(2048, 29792)]
    assert sorted((m.step, m.value) for m in c.get_metric_history(rid, "startup_s")) == [(2048, 12.5), (4096, 7.0)]
    assert c.get_run(rid).data.metrics["startup_s"] == 7.0  # the latest attempt's, what readers see
    assert c.get_run(rid).data.metrics["optimizer_state_bytes_per_param"] == 8.0
    for key in ("syncs", "comm_bytes_per_step", "comm_bytes_total", "comm_time_s"):
        assert c.get_metric_history(rid, key) == [], key  # one ddp worker communicates nothing


def test_replicas_that_synchronise_log_their_counters_at_every_milestone(tiny_spec_dict, mlflow_uri):
    spec = {
        **tiny_spec_dict,
        "resources": {
            **tiny_spec_dict["resources"],
            "workers_per_trial": 2,
            "sync": {"mode": "local_sgd", "every_steps": 4},
        },
    }
    tracker = _tracker(mlflow_uri, spec, "metrics-local")
    rid = _run_trial(tracker, [_report(2048, syncs=2), _report(4096, syncs=4)])
    assert [m.value for m in sorted(tracker.client.get_metric_history(rid, "syncs"), key=lambda m: m.step)] == [2, 4]
    assert len(tracker.client.get_metric_history(rid, "comm_time_s")) == 2


def test_precision_reaches_the_parent_as_tags_only_when_asked_for():
    from sweeps.tracking import schema

    assert schema.precision_tags({"b_crit": 3.0}) == {}
    tags = schema.precision_tags({"precision": {"stopped_because": "max_trials", "b_crit_ratio_requested": 3.0}})
    assert tags == {
        "critbatch.precision.stopped_because": "max_trials",
        "critbatch.precision.b_crit_ratio_requested": "3.0",
    }
