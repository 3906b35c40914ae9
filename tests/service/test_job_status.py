"""Reading sweeps back: honest status, trial counts, best so far, duplicates, stop, orphan runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from svc_store import seed_sweep

from sweeps.remote import (
    ReportNotReady,
    SweepExists,
    SweepJobs,
    SweepNotFound,
    mlflow_ui_links,
    staged_sweep,
)
from sweeps.spec import parse_spec
from sweeps.tracking.reader import MlflowReader

REPO = Path(__file__).resolve().parents[2]
RAY_FAILED_MSG = (
    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    "INFO starting\n\x1b[1;31msweep failed:\x1b[0m every trial failed (2 of 2)\n"
)


def spec():
    return parse_spec(
        {
            "name": "tiny",
            "data": {"path": "data/tinyshakespeare/input.txt"},
            "budget_tokens": 8192,
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context_length_tokens": 32},
            "schedule": {"warmup_tokens": 1024},
            "eval": {"milestones": 4, "eval_tokens": 1024},
            "search": {"batch_sizes_sequences": [4, 8], "base_lr": 0.003, "base_batch_size_sequences": 4},
        }
    )


def test_unknown_malformed_and_foreign_ids_are_not_found(fake_jobs, fake_ray):
    fake_ray.jobs["plain-ray-job"] = fake_ray.add("x", "RUNNING")
    fake_ray.jobs["plain-ray-job"].metadata = {}
    for sid in ("nope", "../../api/nodes", "plain-ray-job"):
        with pytest.raises(SweepNotFound):
            fake_jobs.get(sid)


def test_submit_passes_the_staged_arguments_and_refuses_a_second_job(fake_jobs, fake_ray):
    with staged_sweep(spec(), base_dir=REPO, tracking_uri="http://mlflow:5000") as st:
        state = fake_jobs.submit(st)
        assert state.status == "PENDING" and state.id == st.sweep_id
        [sub] = fake_ray.submitted
        assert sub["entrypoint"] == st.entrypoint and sub["submission_id"] == st.sweep_id
        assert sub["metadata"] == st.metadata and sub["runtime_env"] == st.runtime_env
        assert "spec.yaml" in sub["files"] and "inputs/data/input.txt" in sub["files"]
        with pytest.raises(SweepExists) as e:
            fake_jobs.submit(st)
    assert e.value.same_spec and e.value.sweep_id == st.sweep_id
    assert str(e.value).endswith("(choose another --sweep-id to run it again)")  # the CLI's option (REST: ?sweep_id=)
    assert len(fake_ray.submitted) == 1
    # the same id with a different spec is a conflict, not an idempotent resubmission
    other = parse_spec({**spec().model_dump(mode="json"), "seeds": [7]})
    with staged_sweep(other, base_dir=REPO, sweep_id=st.sweep_id) as st2, pytest.raises(SweepExists) as e2:
        fake_jobs.submit(st2)
    assert not e2.value.same_spec and len(fake_ray.submitted) == 1


def test_status_counts_and_best_so_far(make_run, fake_jobs, fake_ray, fake_reader):
    fake_ray.add("s1", "RUNNING")
    fake_reader.parents["s1"] = make_run("p", role="sweep", sweep_id="s1")
    fake_reader.trial_runs["s1"] = [
        make_run(
            "t1",
            role="trial",
            sweep_id="s1",
            status="FINISHED",
            tag_status="COMPLETED",
            metrics={"val_loss": 2.5},
            params={"batch_size_sequences": "4", "lr": "0.003", "lr_rule": "sqrt"},
        ),
        make_run(
            "t2",
            role="trial",
            sweep_id="s1",
            status="FINISHED",
            tag_status="DIVERGED",
            metrics={"val_loss": float("nan")},
        ),
        make_run(
            "t3",
            role="trial",
            sweep_id="s1",
            tag_status="RUNNING",
            metrics={"val_loss": 2.1},
            params={"batch_size_sequences": "8", "lr": "0.004"},
        ),
        make_run("t4", role="trial", sweep_id="s1", status="FAILED", tag_status="FAILED"),
        make_run("t5", role="trial", sweep_id="s1", status="FINISHED", tag_status="PRUNED", metrics={"val_loss": 3.0}),
    ]
    s = fake_jobs.get("s1")
    assert s.status == "RUNNING" and s.reason is None
    t = s.trials
    assert (t.planned, t.done, t.running, t.failed, t.diverged, t.pruned, t.stopped) == (2, 1, 1, 1, 1, 1, 0)
    assert s.best["run_id"] == "t3" and s.best["val_loss"] == 2.1 and s.best["batch_size_sequences"] == 8
    assert s.parent_run_id == "p" and s.mlflow_error is None


def test_exit_zero_is_not_enough_when_mlflow_says_failed(make_run, fake_jobs, fake_ray, fake_reader):
    fake_ray.add("a", "SUCCEEDED")
    fake_reader.parents["a"] = make_run(
        "pa",
        role="sweep",
        sweep_id="a",
        status="FAILED",
        tag_status="FAILED",
        tags={"critbatch.message": "analysis impossible: one batch size reached no target"},
    )
    s = fake_jobs.get("a")
    assert s.status == "FAILED" and s.ray_status == "SUCCEEDED"
    assert s.reason == "analysis impossible: one batch size reached no target"

    fake_ray.add("b", "SUCCEEDED")
    fake_reader.parents["b"] = make_run("pb", role="sweep", sweep_id="b", status="FINISHED", tag_status="SUCCEEDED")
    fake_reader.trial_runs["b"] = [
        make_run(f"t{i}", role="trial", sweep_id="b", status="FAILED", tag_status="FAILED") for i in range(2)
    ]
    s = fake_jobs.get("b")
    assert s.status == "FAILED" and s.reason == "every trial failed"

    fake_ray.add("c", "SUCCEEDED")
    fake_reader.parents["c"] = make_run("pc", role="sweep", sweep_id="c", status="FINISHED", tag_status="SUCCEEDED")
    fake_reader.trial_runs["c"] = [make_run("t", role="trial", sweep_id="c", status="FINISHED", tag_status="COMPLETED")]
    assert fake_jobs.get("c").status == "SUCCEEDED"


def test_failed_job_reason_comes_from_the_drivers_last_error_line(fake_jobs, fake_ray, fake_reader):
    fake_ray.add("f", "FAILED", message=RAY_FAILED_MSG, exit_code=1)
    s = fake_jobs.get("f")
    assert s.status == "FAILED" and s.reason == "exit code 1: sweep failed: every trial failed (2 of 2)"
    fake_ray.add(
        "g",
        "FAILED",
        exit_code=2,
        message=(
            "Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\n"
            "error: invalid sweep spec (1 error(s))\n  data.path: corpus not found: /x\n"
        ),
    )
    assert fake_jobs.get("g").reason == "invalid input (exit code 2): error: invalid sweep spec (1 error(s))"
    fake_ray.add("h", "FAILED", message="Job supervisor actor died: the node was lost")
    assert fake_jobs.get("h").reason == "Job supervisor actor died: the node was lost"


def test_mlflow_unreachable_keeps_rays_view(fake_jobs, fake_ray, fake_reader):
    fake_ray.add("m", "RUNNING")
    fake_reader.fail_with = ConnectionError("connection refused")
    s = fake_jobs.get("m")
    assert s.status == "RUNNING" and s.trials is None and "connection refused" in s.mlflow_error


def test_node_local_tracking_uri_is_not_read(fake_jobs, fake_ray, fake_reader, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_ray.add("n", "RUNNING", metadata={"critbatch.tracking_uri": "sqlite:///mlflow.db"})
    s = fake_jobs.get("n")
    assert s.trials is None and "cluster node" in s.mlflow_error
    assert not (tmp_path / "mlflow.db").exists()  # reading must not create a store


def test_stop_sends_once_and_reports_the_final_state(fake_jobs, fake_ray, fake_reader):
    fake_ray.add("r", "RUNNING")
    state, sent = fake_jobs.stop("r", wait_s=5, poll_s=0.01)
    assert sent and state.status == "STOPPED" and fake_ray.stop_calls == ["r"]
    state, sent = fake_jobs.stop("r", wait_s=5, poll_s=0.01)
    assert not sent and state.status == "STOPPED" and fake_ray.stop_calls == ["r"]


def test_list_is_newest_first_paged_and_only_sweeps(fake_jobs, fake_ray):
    for i in range(5):
        fake_ray.add(f"s{i}", "SUCCEEDED")
    page, total = fake_jobs.list(limit=2, offset=1, with_mlflow=False)
    assert total == 5 and [s.id for s in page] == ["s3", "s2"]


def test_report_needs_a_finished_sweep_with_cbs_json(make_run, fake_jobs, fake_ray, fake_reader):
    fake_ray.add("run", "RUNNING")
    with pytest.raises(ReportNotReady) as e:
        fake_jobs.report("run")
    assert e.value.status == "RUNNING"
    fake_ray.add("ok", "SUCCEEDED")
    fake_reader.parents["ok"] = make_run(
        "p", role="sweep", sweep_id="ok", status="FINISHED", tag_status="SUCCEEDED", metrics={"b_crit": 12.5}
    )
    fake_reader.trial_runs["ok"] = [
        make_run(
            "t1",
            role="trial",
            sweep_id="ok",
            status="FINISHED",
            tag_status="COMPLETED",
            metrics={"val_loss": 2.0},
            params={"batch_size_sequences": "4"},
        )
    ]
    with pytest.raises(ReportNotReady):
        fake_jobs.report("ok")  # no cbs.json artifact
    fake_reader.artifacts["p"] = {"b_crit": 12.5}
    rep = fake_jobs.report("ok", ui_url="http://ui:5000/")
    assert rep["cbs"] == {"b_crit": 12.5} and rep["status"] == "SUCCEEDED"
    assert rep["mlflow"]["parent_run_id"] == "p"
    assert rep["mlflow"]["links"]["parent_run"] == "http://ui:5000/#/experiments/1/runs/p"
    assert rep["mlflow"]["trial_runs"][0]["url"] == "http://ui:5000/#/experiments/1/runs/t1"


def test_ui_links_encode_the_comparison():
    links = mlflow_ui_links("http://h:5000", "3", "p", ["a", "b"])
    assert links["compare_trials"] == (
        "http://h:5000/#/compare-runs?runs=%5B%22a%22%2C%22b%22%5D&experiments=%5B%223%22%5D"
    )
    assert mlflow_ui_links(None, "3", "p", ["a"]) == {}


@pytest.mark.slow
def test_a_stopped_jobs_orphan_runs_are_closed_in_a_real_mlflow_store(fake_ray, mlflow_uri):
    """The reconciliation (``MlflowReader.close_orphans``) against real MLflow: once the job is
    STOPPED, no run of the sweep is left RUNNING; finished runs and other sweeps' runs are untouched."""
    sw = seed_sweep(
        mlflow_uri,
        "sw",
        {"a": ("FINISHED", "COMPLETED", {"val_loss": 2.0}), "b": ("RUNNING", "RUNNING", {"val_loss": 2.4})},
    )
    other = seed_sweep(mlflow_uri, "other", {"x": ("RUNNING", "RUNNING", None)})
    fake_ray.add("sw", "STOPPED", metadata={"critbatch.tracking_uri": mlflow_uri})
    jobs = SweepJobs("http://ray.invalid", client=fake_ray)  # the real MlflowReader
    s = jobs.get("sw")
    assert s.status == "STOPPED" and s.parent_run_id == sw.parent_id and s.mlflow_error is None
    assert (s.trials.done, s.trials.running, s.trials.stopped) == (1, 0, 1)
    assert s.best["val_loss"] == 2.0 and s.best["run_id"] == sw.trial_ids["a"]
    b, p, a = sw.run("b"), sw.run(), sw.run("a")
    assert (b.info.status, b.data.tags["critbatch.status"], b.data.tags["critbatch.closed_by"]) == (
        "KILLED",
        "STOPPED",
        "critbatch.jobs",
    )
    assert (p.info.status, p.data.tags["critbatch.status"]) == ("KILLED", "STOPPED")
    assert p.data.tags["critbatch.message"] == "closed after the Ray job ended (STOPPED)"
    assert (a.info.status, a.data.tags["critbatch.status"]) == ("FINISHED", "COMPLETED")
    assert "critbatch.closed_by" not in a.data.tags
    assert other.run("x").info.status == "RUNNING" and other.run().info.status == "RUNNING"
    assert [x for x in MlflowReader(mlflow_uri).trials("sw", [sw.experiment_id]) if x.info.status == "RUNNING"] == []
    # a second read finds nothing to close and changes nothing
    assert jobs.get("sw").trials == s.trials and sw.run("b").info.end_time == b.info.end_time


def test_a_failed_jobs_orphan_runs_are_closed_failed(fake_ray, mlflow_uri):
    sw = seed_sweep(mlflow_uri, "fa", {"t": ("RUNNING", "RUNNING", None)})
    fake_ray.add("fa", "FAILED", message=RAY_FAILED_MSG, exit_code=1, metadata={"critbatch.tracking_uri": mlflow_uri})
    s = SweepJobs("http://ray.invalid", client=fake_ray).get("fa")
    assert s.status == "FAILED" and (s.trials.failed, s.trials.running, s.trials.stopped) == (1, 0, 0)
    t, p = sw.run("t"), sw.run()
    assert (t.info.status, t.data.tags["critbatch.status"]) == ("FAILED", "FAILED")
    assert (p.info.status, p.data.tags["critbatch.status"]) == ("FAILED", "FAILED")


def test_a_running_jobs_runs_are_left_open(fake_ray, mlflow_uri):
    """Only an ended STOPPED or FAILED job's runs are closed: a live job's writer is still there."""
    live = seed_sweep(mlflow_uri, "live", {"t": ("RUNNING", "RUNNING", None)})
    fake_ray.add("live", "RUNNING", metadata={"critbatch.tracking_uri": mlflow_uri})
    s = SweepJobs("http://ray.invalid", client=fake_ray).get("live")
    assert s.status == "RUNNING" and s.trials.running == 1 and s.mlflow_error is None
    assert live.run("t").info.status == "RUNNING" and live.run().info.status == "RUNNING"
    assert "critbatch.closed_by" not in live.run("t").data.tags


def test_a_dropped_connection_is_retried_and_a_lost_answer_is_not_a_duplicate(fake_jobs, fake_ray, monkeypatch):
    import sweeps.remote.jobs as jobs_mod

    monkeypatch.setattr(jobs_mod.time, "sleep", lambda s: None)
    real = fake_ray.submit_job
    calls = []

    def flaky(**kw):
        calls.append(kw["submission_id"])
        if len(calls) == 1:
            raise ConnectionError("Connection aborted: RemoteDisconnected")  # nothing reached the server
        if len(calls) == 2:
            real(**kw)
            raise ConnectionError("Connection aborted: RemoteDisconnected")  # submitted, answer lost
        return real(**kw)  # -> "already exists": ours

    monkeypatch.setattr(fake_ray, "submit_job", flaky)
    with staged_sweep(spec(), base_dir=REPO, tracking_uri="http://mlflow:5000") as st:
        state = fake_jobs.submit(st)
    assert state.status == "PENDING" and len(calls) == 3 and len(fake_ray.submitted) == 1


def test_wait_rides_out_a_few_unreachable_reads(fake_jobs, fake_ray, monkeypatch):
    from sweeps.remote import ClusterUnavailable

    fake_ray.add("w", "SUCCEEDED")
    real = fake_ray.get_job_info
    n = {"calls": 0}

    def flaky(job_id):
        n["calls"] += 1
        if n["calls"] <= 2:
            raise ConnectionError("dropped")
        return real(job_id)

    monkeypatch.setattr(fake_ray, "get_job_info", flaky)
    assert fake_jobs.wait("w", poll_s=0.0).status == "SUCCEEDED"
    monkeypatch.setattr(fake_ray, "get_job_info", lambda job_id: (_ for _ in ()).throw(ConnectionError("down")))
    with pytest.raises(ClusterUnavailable):
        fake_jobs.wait("w", poll_s=0.0)


def test_a_finished_sweeps_counts_come_from_the_drivers_summary(make_run, fake_jobs, fake_ray, fake_reader):
    """The parent run's trials_* metrics are the driver's final word, even if a child run went missing."""
    fake_ray.add("fin", "FAILED", exit_code=1)
    fake_reader.parents["fin"] = make_run(
        "p",
        role="sweep",
        sweep_id="fin",
        status="FAILED",
        tag_status="FAILED",
        metrics={
            "trials_completed": 0.0,
            "trials_failed": 2.0,
            "trials_diverged": 0.0,
            "trials_pruned": 0.0,
            "trials_stopped": 0.0,
        },
    )
    fake_reader.trial_runs["fin"] = []
    t = fake_jobs.get("fin").trials
    assert (t.planned, t.done, t.failed, t.running) == (2, 0, 2, 0)
    fake_ray.add("live", "RUNNING")  # while running, the child runs are counted
    fake_reader.parents["live"] = make_run("q", role="sweep", sweep_id="live", metrics={"trials_completed": 9.0})
    fake_reader.trial_runs["live"] = [make_run("t", role="trial", sweep_id="live")]
    assert fake_jobs.get("live").trials.running == 1


def test_job_counts_take_a_paused_trial_as_live():
    """A trial waiting at a rung (tag PAUSED, run still RUNNING) counts as running."""
    from types import SimpleNamespace

    from sweeps.remote.status import trial_counts

    def run(tag, status="RUNNING"):
        return SimpleNamespace(
            data=SimpleNamespace(tags={"critbatch.status": tag}), info=SimpleNamespace(status=status)
        )

    c = trial_counts(
        [run("PAUSED"), run("RUNNING"), run("PRUNED", "FINISHED"), run("COMPLETED", "FINISHED")], planned=4
    )
    assert (c.running, c.pruned, c.done) == (2, 1, 1)


def test_the_names_read_back_are_the_ones_the_writer_uses():
    """tracking.schema is the one owner: the reader's filters and the status counts use its names."""
    from sweeps.tracking import schema

    assert (schema.TAG_SWEEP_ID, schema.TAG_ROLE, schema.TAG_STATUS) == (
        "critbatch.sweep_id",
        "critbatch.role",
        "critbatch.status",
    )
    assert schema.trial_count_metric(schema.TRIAL_COMPLETED) == "trials_completed"
    assert schema.scheduler_tag("pruned_rung") == "critbatch.pruned_rung"
    assert set(schema.SCHEDULER_TAG_KEYS) == {"pruned_at_flops", "pruned_rung", "rung_decisions"}


def test_a_finished_sweep_whose_experiment_was_deleted_says_so(fake_ray, mlflow_uri):
    """A SUCCEEDED job whose MLflow experiment was deleted used to read as SUCCEEDED with
    ``done: 0`` of 2, no parent run and no ``mlflow_error``; the status now says what happened."""
    from sweeps.remote.staging import META_EXPERIMENT

    sw = seed_sweep(
        mlflow_uri,
        "gone",
        {"a": ("FINISHED", "COMPLETED", {"val_loss": 2.0}), "b": ("FINISHED", "COMPLETED", {"val_loss": 2.1})},
        experiment="exp-gone",
        parent=("FINISHED", "SUCCEEDED"),
    )
    fake_ray.add("gone", "SUCCEEDED", metadata={"critbatch.tracking_uri": mlflow_uri, META_EXPERIMENT: "exp-gone"})
    jobs = SweepJobs("http://ray.invalid", client=fake_ray)
    assert jobs.get("gone").mlflow_error is None and jobs.get("gone").trials.done == 2
    sw.client.delete_experiment(sw.experiment_id)
    s = jobs.get("gone")
    assert s.status == "SUCCEEDED" and s.parent_run_id is None
    assert s.mlflow_error is not None and "experiment 'exp-gone'" in s.mlflow_error and "deleted" in s.mlflow_error, s
