"""``sweep.json`` as :class:`SweepState` and the one trial-status classifier, without Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps.errors import InvalidInput
from sweeps.store.migrations import SWEEP_JSON_VERSION
from sweeps.store.state import SweepState
from sweeps.tracking.schema import trial_status

STATE = {
    "sweep_id": "s-1",
    "fingerprint": "abc",
    "tracking_uri": "sqlite:////tmp/m.db",
    "experiment_id": "1",
    "parent_run_id": "r",
    "data_path": "/d.txt",
    "ray_address": None,
    "storage_root": "/out",
    "optuna_storage": "sqlite:////out/optuna.db",
    "status": "RUNNING",
    "created": 1.5,
}


def test_sweep_state_writes_the_file_it_reads(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({**STATE, "from_a_newer_version": 7}))
    state = SweepState.load(tmp_path)
    assert state.sweep_id == "s-1" and state.extra == {"from_a_newer_version": 7}
    state.status, state.mlflow_complete = "SUCCEEDED", True
    state.save(tmp_path)
    written = json.loads((tmp_path / "sweep.json").read_text())
    # its schema version first (sweeps/store/migrations.py), then the key order of every sweep.json so far
    assert list(written)[:12] == ["schema_version", *STATE]
    assert written == {
        "schema_version": SWEEP_JSON_VERSION,
        **STATE,
        "status": "SUCCEEDED",
        "mlflow_complete": True,
        "from_a_newer_version": 7,
    }
    assert "mlflow_incomplete_writes" not in written  # only when a write was lost


def test_sweep_state_fills_what_older_sweeps_lack(tmp_path):
    old = {k: v for k, v in STATE.items() if k not in ("storage_root", "optuna_storage", "fingerprint")}
    (tmp_path / "sweep.json").write_text(json.dumps(old))
    state = SweepState.load(tmp_path)
    assert state.storage_root == str(tmp_path) and state.optuna_storage.endswith("optuna.db")
    assert state.fingerprint is None


@pytest.mark.parametrize("content", [{"sweep_id": "s", "status": "STARTING"}, {"sweep_id": "s", "status": "RUNNING"}])
def test_a_sweep_that_never_started_is_refused(tmp_path, content):
    (tmp_path / "sweep.json").write_text(json.dumps(content))
    with pytest.raises(InvalidInput, match="never started"):
        SweepState.load(tmp_path)


@pytest.mark.parametrize(
    "last, failed, status",
    [
        ({"pruned": True, "done": False}, False, "PRUNED"),
        ({"pruned": True}, True, "PRUNED"),
        ({"status": "diverged"}, False, "DIVERGED"),
        ({"done": True}, False, "COMPLETED"),
        ({"done": True}, True, "FAILED"),  # an error after its last report still fails it
        ({"done": False}, True, "FAILED"),
        ({"done": False}, False, "STOPPED"),
        ({}, False, "STOPPED"),
    ],
)
def test_trial_status(last, failed, status):
    assert trial_status(last, failed=failed) == status


def test_a_resume_whose_tune_state_does_not_unpickle_changes_nothing(tmp_path):
    """A Tune state pickled by classes this critbatch lacks is refused before Ray, MLflow or sweep.json
    are touched (it used to crash in ``Tuner.restore`` and leave the sweep FAILED)."""
    import pickle
    import sys
    import types

    import yaml

    from sweeps.run.api import resume_sweep
    from sweeps.spec.loading import load_spec
    from sweeps.store.state import tune_experiment_dir

    gone = types.ModuleType("critbatch_gone_module")
    exec("class Searcher:\n    pass\n", gone.__dict__)
    gone.Searcher.__module__ = gone.__name__
    sys.modules[gone.__name__] = gone
    try:
        blob = pickle.dumps({"_tune_config": gone.Searcher()})
    finally:
        del sys.modules[gone.__name__]
    spec = load_spec("sweeps/examples/shakespeare-char.yaml")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    state = {**STATE, "status": "STOPPED", "storage_root": str(tmp_path), "sweep_id": "s-1"}
    (tmp_path / "sweep.json").write_text(json.dumps(state))
    tune_dir = tmp_path / tune_experiment_dir(str(tmp_path), "s-1").removeprefix(str(tmp_path) + "/")
    tune_dir.mkdir(parents=True)
    (tune_dir / "tuner.pkl").write_bytes(blob)
    before = (tmp_path / "sweep.json").read_text()
    with pytest.raises(InvalidInput, match=r"tuner.pkl cannot be read by this critbatch \(ModuleNotFoundError"):
        resume_sweep(tmp_path)
    assert (tmp_path / "sweep.json").read_text() == before


def test_a_trial_that_failed_before_its_first_result_is_a_failed_record(tmp_path):
    """Tune writes a trial's ``params.json`` only with its first result; a trial aborted before it (a
    reused actor Tune gave up on) was in no record. ``ReportLog`` keeps the config from the trial's start."""
    import types

    from sweeps.analysis import analyze_trials
    from sweeps.spec.loading import load_spec
    from sweeps.store.records import collect_records
    from sweeps.store.reportlog import ReportLog
    from sweeps.store.state import REPORTS_DIR, tune_experiment_dir

    spec = load_spec("sweeps/examples/shakespeare-char.yaml")
    (tmp_path / "sweep.json").write_text(json.dumps({**STATE, "storage_root": str(tmp_path)}))
    tune_dir = Path(tune_experiment_dir(str(tmp_path), "s-1"))
    log = ReportLog(tmp_path / REPORTS_DIR)
    config = {
        "batch_size_sequences": 8,
        "seed": 0,
        "group_id": "g1",
        "lr": 1e-3,
        "lr_rule": "linear",
        "lr_multiplier": 1.0,
        "beta2": 0.95,
        "beta2_half_life_tokens": 1e4,
    }
    for i, tid in enumerate(["aaaa0001", "aaaa0002"]):
        trial = types.SimpleNamespace(trial_id=tid, config={**config, "group_id": f"g{i}"})
        log.on_trial_start(0, [], trial)
        d = tune_dir / f"run_trial_{tid}_{i + 1}_batch_size_sequences=8_2026-12-02_00-00-00"
        d.mkdir(parents=True)
        if i == 0:  # ran: Tune's own files
            (d / "params.json").write_text(json.dumps(trial.config))
            row = {"trial_id": tid, "tokens_seen": 4096, "val_loss": 3.0, "done": True}
            (d / "result.json").write_text(json.dumps(row) + "\n")
            log.on_trial_result(0, [], trial, row)
        else:  # aborted before its first result: only Tune's error file
            (d / "error.txt").write_text("TuneError: reset_config timed out")
    records = {r.trial_id: r for r in collect_records(tmp_path, spec)}
    assert set(records) == {"aaaa0001", "aaaa0002"}
    assert records["aaaa0001"].status == "COMPLETED" and records["aaaa0002"].status == "FAILED"
    assert records["aaaa0002"].group_id == "g1" and records["aaaa0002"].tokens == []
    analysis = analyze_trials(
        list(records.values()), context_length_tokens=spec.model.context_length_tokens, reference_batch=16.0
    )
    assert analysis["trials"]["FAILED"] == 1 and analysis["trials"]["COMPLETED"] == 1
    assert analysis["status"] == "no_targets" and "targets" in analysis["message"]  # one point: nothing to fit


def _tune_snapshot(tune_dir: Path, trials: list[tuple[str, str, dict]]) -> None:
    """An ``experiment_state-*.json`` as Tune writes it: ``trial_data`` of ``[JSON state, run metadata]``."""
    tune_dir.mkdir(parents=True, exist_ok=True)
    data = [[json.dumps({"trial_id": t, "status": status, "config": config}), "{}"] for t, status, config in trials]
    (tune_dir / "experiment_state-2026-12-05_00-00-00.json").write_text(json.dumps({"trial_data": data}))


def test_a_trial_retried_by_a_resume_that_completes_is_not_failed_by_its_old_error_file(tmp_path):
    """A trial whose checkpoint copy failed on a full disk (Tune's error.txt), retried by the resume
    and completed there, was FAILED in trials.json and cbs.json (Tune leaves error.txt) while MLflow said
    COMPLETED. ReportLog records how each attempt ended; the latest end decides."""
    import types

    from sweeps.spec.loading import load_spec
    from sweeps.store.records import collect_records
    from sweeps.store.reportlog import ReportLog
    from sweeps.store.state import REPORTS_DIR, tune_experiment_dir

    spec = load_spec("sweeps/examples/shakespeare-char.yaml")
    (tmp_path / "sweep.json").write_text(json.dumps({**STATE, "storage_root": str(tmp_path)}))
    tune_dir = Path(tune_experiment_dir(str(tmp_path), "s-1"))
    log = ReportLog(tmp_path / REPORTS_DIR)
    trial = types.SimpleNamespace(
        trial_id="bbbb0001",
        config={
            "batch_size_sequences": 8,
            "seed": 0,
            "group_id": "g",
            "lr": 1e-3,
            "lr_rule": "linear",
            "lr_multiplier": 1.0,
            "beta2": 0.95,
            "beta2_half_life_tokens": 1e4,
        },
    )
    d = tune_dir / "run_trial_bbbb0001_1_batch_size_sequences=8_2026-12-05_00-00-00"
    d.mkdir(parents=True)
    trial.error_file = str(d / "error.txt")  # where Tune writes a trial's error before calling back
    (d / "params.json").write_text(json.dumps(trial.config))
    log.on_trial_start(0, [], trial)
    log.on_trial_result(0, [], trial, {"trial_id": "bbbb0001", "tokens_seen": 2048, "val_loss": 4.0})
    (d / "error.txt").write_text("OSError: [Errno 28] No space left on device")  # the first attempt
    log.on_trial_error(0, [], trial)
    assert [(r.status, r.error) for r in collect_records(tmp_path, spec)] == [
        ("FAILED", "OSError: [Errno 28] No space left on device")
    ]
    log.on_trial_start(0, [], trial)  # the resume retries it: still running, not failed
    assert [r.status for r in collect_records(tmp_path, spec)] == ["STOPPED"]
    log.on_trial_result(0, [], trial, {"trial_id": "bbbb0001", "tokens_seen": 4096, "val_loss": 3.0, "done": True})
    log.on_trial_complete(0, [], trial)
    (record,) = collect_records(tmp_path, spec)
    assert record.status == "COMPLETED" and record.tokens == [2048.0, 4096.0] and record.error is None


def test_a_trial_stopped_before_its_first_report_is_listed_without_a_curve(tmp_path):
    """A trial stopped before its first report (started, or created and waiting to start)
    had no config in OUT/tune and could be missing from trials.json while the sweep was STOPPED. It is one
    of Tune's trials (its snapshot lists it, with its config): listed STOPPED, with no curve. A trial Tune
    never recorded (a driver killed before the snapshot) is not."""
    import types

    from sweeps.spec.loading import load_spec
    from sweeps.store.records import collect_records
    from sweeps.store.reportlog import ReportLog
    from sweeps.store.state import REPORTS_DIR, tune_experiment_dir

    spec = load_spec("sweeps/examples/shakespeare-char.yaml")
    (tmp_path / "sweep.json").write_text(json.dumps({**STATE, "storage_root": str(tmp_path)}))
    tune_dir = Path(tune_experiment_dir(str(tmp_path), "s-1"))
    log = ReportLog(tmp_path / REPORTS_DIR)
    config = {
        "batch_size_sequences": 16,
        "seed": 0,
        "group_id": "g",
        "lr": 1e-3,
        "lr_rule": "linear",
        "lr_multiplier": 1.0,
        "beta2": 0.95,
        "beta2_half_life_tokens": 1e4,
    }
    for tid in ("cccc0001", "cccc0002"):
        log.on_trial_start(0, [], types.SimpleNamespace(trial_id=tid, config=config))
    # cccc0002 started after Tune's last snapshot; cccc0003 was created by the searcher, not started yet
    # (PENDING: no folder, no config in OUT/reports)
    _tune_snapshot(
        tune_dir, [("cccc0001", "RUNNING", config), ("cccc0003", "PENDING", {**config, "batch_size_sequences": 32})]
    )
    records = {r.trial_id: r for r in collect_records(tmp_path, spec)}
    assert sorted(records) == ["cccc0001", "cccc0003"]
    assert [(r.status, r.batch_size_sequences, r.tokens, r.val_loss) for r in records.values()] == [
        ("STOPPED", 16, [], []),
        ("STOPPED", 32, [], []),
    ]


def test_tunes_warning_about_trials_without_results_is_silenced_and_others_are_not():
    """A stop or resume printed Tune's "Failed to fetch metrics" warning with
    ``FileNotFoundError('Could not fetch metrics for run_trial_...')`` for a trial that had not reported."""
    import logging

    from sweeps._compat import quiet_metrics_of_trials_without_results

    quiet_metrics_of_trials_without_results()
    quiet_metrics_of_trials_without_results()
    logger = logging.getLogger("ray.tune.analysis.experiment_analysis")
    assert len(logger.filters) == 1

    def passes(msg: str) -> bool:
        return all(
            f.filter(logging.LogRecord(logger.name, logging.WARNING, __file__, 1, msg, None, None))
            for f in logger.filters
        )

    no_result = (
        "- run_trial_ab12cd34: FileNotFoundError('Could not fetch metrics for run_trial_ab12cd34: both "
        "result.json and progress.csv were not found at /o/tune/s/run_trial_ab12cd34')"
    )
    assert not passes(f"Failed to fetch metrics for 1 trial(s):\n{no_result}")
    assert passes(f"Failed to fetch metrics for 2 trial(s):\n{no_result}\n- run_trial_x: ValueError('bad json')")
    assert passes("another warning")
