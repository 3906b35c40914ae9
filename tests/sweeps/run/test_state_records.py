"""``sweep.json`` as :class:`SweepState` and the one trial-status classifier, without Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps.errors import InvalidInput
from sweeps.tracking.schema import trial_status
from sweeps.run.state import SweepState

STATE = {"sweep_id": "s-1", "fingerprint": "abc", "tracking_uri": "sqlite:////tmp/m.db", "experiment_id": "1",
         "parent_run_id": "r", "data_path": "/d.txt", "ray_address": None, "storage_root": "/out",
         "optuna_storage": "sqlite:////out/optuna.db", "status": "RUNNING", "created": 1.5}


def test_sweep_state_writes_the_file_it_reads(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({**STATE, "from_a_newer_version": 7}))
    state = SweepState.load(tmp_path)
    assert state.sweep_id == "s-1" and state.extra == {"from_a_newer_version": 7}
    state.status, state.mlflow_complete = "SUCCEEDED", True
    state.save(tmp_path)
    written = json.loads((tmp_path / "sweep.json").read_text())
    assert list(written)[:11] == list(STATE)  # the key order of every sweep.json so far
    assert written == {**STATE, "status": "SUCCEEDED", "mlflow_complete": True, "from_a_newer_version": 7}
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


@pytest.mark.parametrize("last, failed, status", [
    ({"pruned": True, "done": False}, False, "PRUNED"),
    ({"pruned": True}, True, "PRUNED"),
    ({"status": "diverged"}, False, "DIVERGED"),
    ({"done": True}, False, "COMPLETED"),
    ({"done": True}, True, "FAILED"),  # an error after its last report still fails it
    ({"done": False}, True, "FAILED"),
    ({"done": False}, False, "STOPPED"),
    ({}, False, "STOPPED"),
])
def test_trial_status(last, failed, status):
    assert trial_status(last, failed=failed) == status


def test_a_resume_whose_tune_state_does_not_unpickle_changes_nothing(tmp_path):
    """A Tune state pickled by classes this critbatch lacks is refused before Ray, MLflow or sweep.json
    are touched (it used to crash in ``Tuner.restore`` and leave the sweep FAILED)."""
    import pickle
    import sys
    import types

    import yaml

    from sweeps.run.driver import resume_sweep
    from sweeps.run.state import tune_experiment_dir
    from sweeps.spec.loading import load_spec

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
    from sweeps.run.records import collect_records
    from sweeps.run.state import REPORTS_DIR, tune_experiment_dir
    from sweeps.spec.loading import load_spec
    from sweeps.tracking.writer import ReportLog

    spec = load_spec("sweeps/examples/shakespeare-char.yaml")
    (tmp_path / "sweep.json").write_text(json.dumps({**STATE, "storage_root": str(tmp_path)}))
    tune_dir = Path(tune_experiment_dir(str(tmp_path), "s-1"))
    log = ReportLog(tmp_path / REPORTS_DIR)
    config = {"batch_size_sequences": 8, "seed": 0, "group_id": "g1", "lr": 1e-3, "lr_rule": "linear",
              "lr_multiplier": 1.0, "beta2": 0.95, "beta2_half_life_tokens": 1e4}
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
    analysis = analyze_trials(list(records.values()), context_length_tokens=spec.model.context_length_tokens,
                              reference_batch=16.0)
    assert analysis["trials"]["FAILED"] == 1 and analysis["trials"]["COMPLETED"] == 1
    assert analysis["status"] == "no_targets" and "targets" in analysis["message"]  # one point: nothing to fit
