"""A trial's report: the keys it sends and writes, in their order, and old report lines read back."""

from __future__ import annotations

import json
import sys

from workloads.api import MLFLOW_METRICS, TrialOutcome, TrialReport


def _report(**extra) -> TrialReport:
    return TrialReport(
        tokens_seen=64,
        step=2,
        val_loss=5.0,
        val_loss_raw=None,
        train_loss=5.5,
        flops=1e6,
        flops_measurement=1e5,
        lr=1e-3,
        beta2=0.99,
        batch_size_sequences_now=4,
        tokens_per_s=100.0,
        mfu=None,
        b_simple=None,
        grad_sq_norm_est=None,
        trace_sigma_est=None,
        grad_norm=1.0,
        status=TrialOutcome.COMPLETED,
        done=True,
        objective=5.0,
        comm_bytes_per_step=0.0,
        comm_bytes_total=0,
        comm_time_s=0.0,
        syncs=0,
        **extra,
    )


def test_the_report_keeps_the_keys_and_order_the_loop_always_sent():
    d = _report(stopped_at_loss=True, first_step_unix_s=1.5, trainable_params=10).to_dict()
    assert list(d) == [
        "tokens_seen",
        "step",
        "val_loss",
        "val_loss_raw",
        "train_loss",
        "flops",
        "flops_measurement",
        "lr",
        "beta2",
        "batch_size_sequences_now",
        "tokens_per_s",
        "mfu",
        "b_simple",
        "grad_sq_norm_est",
        "trace_sigma_est",
        "grad_norm",
        "status",
        "done",
        "objective",
        "comm_bytes_per_step",
        "comm_bytes_total",
        "comm_time_s",
        "syncs",
        "stopped_at_loss",
        "first_step_unix_s",
        "trainable_params",
    ]
    assert type(d["status"]) is str and json.dumps(d["status"]) == '"completed"'


def test_the_worker_fields_come_last_and_unset_ones_are_left_out():
    d = _report().with_worker(startup_s=3.0, worker_nodes="a,b").to_dict()
    assert list(d)[-2:] == ["startup_s", "worker_nodes"] and "worker_rss_mb" not in d


def test_an_old_report_line_with_tune_keys_reads_back():
    old = {
        "tokens_seen": 32,
        "step": 1,
        "val_loss": 6.0,
        "status": "running",
        "done": False,
        "training_iteration": 1,
        "trial_id": "abc",
        "pruned": False,
    }
    r = TrialReport.from_dict(old)
    assert (r.tokens_seen, r.val_loss, r.status, r.syncs) == (32, 6.0, TrialOutcome.RUNNING, None)


def test_the_mlflow_metrics_are_report_fields_and_need_no_torch():
    assert {"val_loss", "syncs", "startup_s", "deterministic_algorithms"} <= set(MLFLOW_METRICS)
    assert {"status", "done", "objective", "worker_nodes", "tokens_seen"}.isdisjoint(MLFLOW_METRICS)
    assert "workloads.train.report" in sys.modules
