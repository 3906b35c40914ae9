"""``sweep.json`` as :class:`SweepState` and the one trial-status classifier, without Ray."""

from __future__ import annotations

import json

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
