"""The output-folder claim and the sweep-id binding, without Ray (the racing runs are in test_sweep_claims.py)."""

from __future__ import annotations

import json

import pytest

from sweeps.errors import InvalidInput
from sweeps.run.preflight import check_output_folder
from sweeps.store.claims import (
    LOCK_FILE,
    check_sweep_id_binding,
    claim_output_folder,
    lock_output_folder,
    read_storage_binding,
    write_storage_binding,
)


def test_a_claimed_folder_refuses_a_second_claim_and_a_resume_naming_the_holder(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    first = claim_output_folder(out, "sweep-a", "f1")
    assert json.loads((out / "sweep.json").read_text())["status"] == "STARTING"
    check_output_folder(out)  # a claim is not refused by the quick look: the lock decides
    with pytest.raises(InvalidInput, match=r"is in use by sweep 'sweep-a' \(pid \d+"):
        claim_output_folder(out, "sweep-b", "f2")  # another open file description: the flock refuses it
    with pytest.raises(InvalidInput, match="sweep 'sweep-a'.* is running there"):
        lock_output_folder(out, "sweep-a")
    (out / "sweep.json").write_text(json.dumps({"sweep_id": "sweep-a", "status": "RUNNING"}))
    first.release()
    assert (out / "sweep.json").is_file() and not (out / LOCK_FILE).exists()
    with pytest.raises(InvalidInput, match="already holds sweep 'sweep-a'.*critbatch resume"):
        claim_output_folder(out, "sweep-b", "f2")
    lock_output_folder(out, "sweep-a").release()  # a resume takes it once the run is gone


def test_a_claim_released_before_the_sweep_started_removes_what_it_made(tmp_path):
    out = tmp_path / "x" / "y" / "out"
    claim = claim_output_folder(out, "s", "f")
    claim.release(remove=True)
    assert not (tmp_path / "x").exists()
    existing = tmp_path / "given"
    existing.mkdir()
    claim_output_folder(existing, "s", "f").release(remove=True)
    assert existing.is_dir() and not any(existing.iterdir())  # a folder the user made stays


def test_an_abandoned_claim_is_taken_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"sweep_id": "dead", "status": "STARTING", "pid": 1}))
    claim = claim_output_folder(out, "alive", "f")  # its driver died while starting: the lock is free
    assert json.loads((out / "sweep.json").read_text())["sweep_id"] == "alive"
    claim.release()


def test_the_storage_binding_refuses_another_fingerprint(tmp_path):
    root = str(tmp_path / "storage" / "sw")
    assert read_storage_binding(root) is None
    check_sweep_id_binding("sw", "f1", storage_root=root)  # nothing bound yet
    write_storage_binding(root, "sw", "f1")
    check_sweep_id_binding("sw", "f1", storage_root=root)  # the same spec: a retried job
    with pytest.raises(InvalidInput, match="--sweep-id 'sw' already runs another spec \\(fingerprint f1"):
        check_sweep_id_binding("sw", "f2", storage_root=root)
    with pytest.raises(InvalidInput, match="MLflow parent run r1"):
        check_sweep_id_binding("sw", "f2", mlflow_parents=[("r0", None), ("r1", "f1")])


def test_a_shared_optuna_storage_binds_the_sweep_id_too(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(study_name="sw-B4", storage=url).set_user_attr("critbatch.fingerprint", "f1")
    optuna.create_study(study_name="other-B4", storage=url).set_user_attr("critbatch.fingerprint", "zz")
    check_sweep_id_binding("sw", "f1", optuna_storage=url)
    with pytest.raises(InvalidInput, match="Optuna study sw-B4"):
        check_sweep_id_binding("sw", "f2", optuna_storage=url)
