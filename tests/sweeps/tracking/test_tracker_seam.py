"""The tracker seam (sweeps/tracking/base.py, registry.py): a second sink beside MLflow, through the
CompositeTracker, receives the same events as MLflow on a short synthetic sweep (real MLflow on a SQLite store,
no Ray); the sweep is complete only when every sink is; sinks are chosen by name."""

from __future__ import annotations

from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from sweeps.errors import InvalidInput
from sweeps.spec import parse_spec
from sweeps.tracking import registry
from sweeps.tracking.base import CompositeTracker, Tracker
from sweeps.tracking.registry import SinkContext, build_tracker
from sweeps.tracking.writer import MlflowTracker

CONFIG = {
    "batch_size_sequences": 8,
    "seed": 0,
    "lr": 1e-3,
    "lr_rule": "sqrt",
    "lr_multiplier": 1.0,
    "beta2": 0.99,
    "beta2_half_life_tokens": 2048.0,
}


class EventLog(Tracker):
    """A sink that keeps every event it receives, in order (what a JSON-lines sink would write)."""

    def __init__(self, complete: bool = True):
        self.events: list[tuple[str, Any]] = []
        self.complete = complete

    def start_parent(self) -> str | None:
        self.events.append(("start_parent", None))
        return None

    def attach_parent(self, experiment_id: str, parent_run_id: str) -> None:
        self.events.append(("attach_parent", (experiment_id, parent_run_id)))

    def trial_started(self, trial_id: str, config: dict[str, Any], extra_params: dict[str, Any]) -> None:
        self.events.append(("trial_started", (trial_id, config["batch_size_sequences"], extra_params)))

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.events.append(("trial_result", (trial_id, result["tokens_seen"], result["val_loss"])))

    def trial_ended(self, trial_id: str, status: str, error: str | None = None) -> None:
        self.events.append(("trial_ended", (trial_id, status, error)))

    def log_trial_tag(self, trial_id: str, key: str, value: str) -> None:
        self.events.append(("log_trial_tag", (trial_id, key, value)))

    def settle_children(self, statuses: dict[str, str]) -> None:
        self.events.append(("settle_children", statuses))

    def finish(
        self,
        status: str,
        summary: dict[str, float],
        artifacts_dir: str | None,
        message: str = "",
        drain_s: float | None = None,
        analysis: dict[str, Any] | None = None,
    ) -> bool:
        self.events.append(("finish", (status, summary, message)))
        return self.complete


def _sweep(tracker: Tracker) -> bool:
    """A two-trial sweep's events: one trial completes, one is still running when the sweep ends."""
    tracker.start_parent()
    tracker.trial_started("t1", CONFIG, {"flops_per_token": 100.0})
    for tokens, loss in ((2048, 3.0), (4096, 2.5)):
        tracker.trial_result("t1", {"tokens_seen": tokens, "val_loss": loss, "flops": 100.0 * tokens})
    tracker.log_trial_tag("t1", "critbatch.scheduler.rung", "1")
    tracker.trial_ended("t1", "COMPLETED")
    tracker.trial_restored("t2", {**CONFIG, "batch_size_sequences": 16}, {})
    tracker.trial_result("t2", {"tokens_seen": 2048, "val_loss": 3.1})
    tracker.flush()
    tracker.settle_children({"t1": "COMPLETED"})
    return tracker.finish("SUCCEEDED", {"b_crit": 12.0}, None, message="ok", drain_s=5)


def test_a_second_sink_receives_the_events_mlflow_records(tiny_spec_dict, mlflow_uri):
    spec = parse_spec(tiny_spec_dict)
    mlflow = MlflowTracker(MlflowClient(mlflow_uri), spec, "seam-sweep")
    log = EventLog()
    tracker = CompositeTracker([mlflow, log])
    assert _sweep(tracker)
    assert tracker.experiment_id == mlflow.experiment_id and tracker.parent_run_id == mlflow.parent_run_id
    assert tracker.pending_writes() == []

    assert log.events == [
        ("start_parent", None),
        ("trial_started", ("t1", 8, {"flops_per_token": 100.0})),
        ("trial_result", ("t1", 2048, 3.0)),
        ("trial_result", ("t1", 4096, 2.5)),
        ("log_trial_tag", ("t1", "critbatch.scheduler.rung", "1")),
        ("trial_ended", ("t1", "COMPLETED", None)),
        ("trial_started", ("t2", 16, {})),
        ("trial_result", ("t2", 2048, 3.1)),
        ("settle_children", {"t1": "COMPLETED"}),
        ("finish", ("SUCCEEDED", {"b_crit": 12.0}, "ok")),
    ]
    c = mlflow.client
    runs = tracker.trial_run_ids()
    assert sorted(runs) == ["t1", "t2"]
    t1, t2 = c.get_run(runs["t1"]), c.get_run(runs["t2"])
    assert [(m.step, m.value) for m in c.get_metric_history(runs["t1"], "val_loss")] == [(2048, 3.0), (4096, 2.5)]
    assert t1.data.params["flops_per_token"] == "100.0" and t1.data.tags["critbatch.scheduler.rung"] == "1"
    assert (t1.info.status, t1.data.tags["critbatch.status"]) == ("FINISHED", "COMPLETED")
    # open when the sweep ended: STOPPED, as MLflow alone records it
    assert (t2.info.status, t2.data.tags["critbatch.status"]) == ("KILLED", "STOPPED")
    parent = c.get_run(mlflow.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["b_crit"] == 12.0
    assert parent.data.tags["critbatch.status"] == "SUCCEEDED"


def test_the_sweep_is_complete_only_when_every_sink_is(tiny_spec_dict, mlflow_uri):
    mlflow = MlflowTracker(MlflowClient(mlflow_uri), parse_spec(tiny_spec_dict), "seam-incomplete")
    lagging = EventLog(complete=False)
    assert not _sweep(CompositeTracker([mlflow, lagging]))
    assert lagging.events[-1][0] == "finish"  # every sink ended, the primary's parent run too
    assert mlflow.client.get_run(mlflow.parent_run_id).info.status == "FINISHED"


def test_sinks_are_chosen_by_name(tiny_spec_dict, mlflow_uri, monkeypatch):
    ctx = SinkContext(
        tracking_uri=mlflow_uri,
        spec=parse_spec(tiny_spec_dict),
        sweep_id="seam-names",
        fingerprint="f" * 16,
        drain_s=7.0,
    )
    one = build_tracker(ctx)
    assert isinstance(one, MlflowTracker) and (one.drain_s, one.fingerprint) == (7.0, "f" * 16)
    monkeypatch.setitem(registry.SINKS, "events", lambda ctx: EventLog())
    both = build_tracker(ctx, ("mlflow", "events"))
    assert isinstance(both, CompositeTracker)
    assert [type(t) for t in both.trackers] == [MlflowTracker, EventLog]
    with pytest.raises(InvalidInput, match=r"CRITBATCH_TRACKING_SINKS: unknown tracking sink\(s\) \['wandb'\]"):
        build_tracker(ctx, ("mlflow", "wandb"))
    with pytest.raises(ValueError):
        CompositeTracker([])
