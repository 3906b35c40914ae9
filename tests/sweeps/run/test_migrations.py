"""A sweep's state written by an older critbatch reads as the current one (``sweeps/store/migrations.py``):
``sweep.json`` upgraded by version, a newer one refused; Tune's pickles read and rewritten with the
current class paths, their originals kept beside them."""

from __future__ import annotations

import importlib
import json
import pickle
import shutil
from pathlib import Path

import pytest

from sweeps.errors import InvalidInput
from sweeps.run.execute import check_tune_state_readable
from sweeps.store.migrations import (
    BACKUP_SUFFIX,
    PICKLE_RENAMES,
    SWEEP_JSON_VERSION,
    load_old_pickle,
    migrate_tune_state,
    read_sweep_json,
)
from sweeps.store.state import SweepState
from tests.conftest import ROOT, invoke_cli

OLD_TUNE_STATE = Path(__file__).parent / "data" / "tune_state_e6ea0bf"

#: ``sweep.json`` of a sweep stopped by the code before the version key (version 1), as it wrote it
V1 = {
    "sweep_id": "tiny-20261205-213124-ddb5c4",
    "fingerprint": "32bf3579dd",
    "tracking_uri": "file:///tmp/mlruns",
    "experiment_id": "1",
    "parent_run_id": "abc",
    "data_path": "/data/input.txt",
    "ray_address": None,
    "storage_root": "/tmp/out",
    "optuna_storage": "sqlite:////tmp/out/optuna.db",
    "status": "STOPPED",
    "created": 1764970284.5,
    "mlflow_complete": True,
    "inputs": {"data.path": {"path": "/data/input.txt", "sha256": "00"}},
    "pinned_by": "a key of a later version, kept",
}


def test_a_version_1_sweep_json_reads_as_the_current_version_and_is_written_back_with_it(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps(V1, indent=2))
    state = SweepState.load(tmp_path)
    assert state.to_dict() == {"schema_version": SWEEP_JSON_VERSION, **V1}
    assert state.extra == {"pinned_by": "a key of a later version, kept"}
    state.save(tmp_path)
    written = json.loads((tmp_path / "sweep.json").read_text())
    assert next(iter(written)) == "schema_version" and written == {"schema_version": 2, **V1}
    assert SweepState.load(tmp_path) == state  # the current version reads back unchanged


def test_a_version_1_sweep_json_from_before_shared_storage_roots_reads_as_today(tmp_path):
    old = {k: v for k, v in V1.items() if k not in ("storage_root", "optuna_storage", "fingerprint", "ray_address")}
    (tmp_path / "sweep.json").write_text(json.dumps(old))
    state = SweepState.load(tmp_path)
    assert (state.storage_root, state.fingerprint, state.ray_address) == (str(tmp_path), None, None)


def test_a_newer_sweep_json_is_refused_in_one_line_naming_the_file_and_both_versions(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({**V1, "schema_version": SWEEP_JSON_VERSION + 1}))
    with pytest.raises(InvalidInput) as err:
        SweepState.load(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "sweep.json") in message
    assert f"schema version {SWEEP_JSON_VERSION + 1}" in message and f"the {SWEEP_JSON_VERSION} this" in message
    with pytest.raises(InvalidInput, match="not a version"):
        (tmp_path / "sweep.json").write_text(json.dumps({**V1, "schema_version": "2"}))
        read_sweep_json(tmp_path / "sweep.json")


def test_the_cli_refuses_to_resume_a_newer_sweep_json_with_exit_2(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({**V1, "schema_version": SWEEP_JSON_VERSION + 1}))
    before = (tmp_path / "sweep.json").read_bytes()
    r = invoke_cli(["resume", str(tmp_path), "--no-progress", "--address", "127.0.0.1:9"])  # refused before Ray
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"schema version {SWEEP_JSON_VERSION + 1}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "sweep.json").read_bytes() == before


def _old_global(module: str, name: str) -> bytes:
    """A pickle (protocol 0 ``GLOBAL``) of ``module.name`` by reference, as an old ``tuner.pkl`` holds it."""
    return f"c{module}\n{name}\n.".encode()


@pytest.mark.parametrize("old, new", sorted(PICKLE_RENAMES.items()))
def test_every_old_pickle_path_loads_as_what_is_there_now_and_the_old_one_is_gone(old, new):
    old_module, _, old_name = old.partition(":")
    new_module, _, new_name = new.partition(":")
    name = old_name or "__name__"
    obj, renamed = load_old_pickle(_old_global(old_module, name))
    assert obj is getattr(importlib.import_module(new_module), new_name or name) and renamed == [(old_module, name)]
    if old == "sweeps.tracking.writer:Tracker":  # the name is the tracker base class's now (writer imports it)
        from sweeps.tracking.base import Tracker

        assert importlib.import_module(old_module).Tracker is Tracker and issubclass(obj, Tracker)
    elif old_name:  # gone from the old module, or (``Outbox``, which ``writer`` uses) the same object
        assert getattr(importlib.import_module(old_module), old_name, obj) is obj
    else:
        assert not (ROOT / (old_module.replace(".", "/") + ".py")).exists()  # a file there would be a second copy
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old_module)


def test_the_three_names_the_main_jobs_tune_state_holds_load_as_the_moved_functions():
    from workloads.ray.adapter import train_fn_per_worker
    from workloads.ray.compat import drain_report_queue
    from workloads.train.determinism import torch_threads_per_worker

    blob = (
        b"("
        + b"".join(
            _old_global(m, n)[:-1]
            for m, n in [
                ("workloads._ray_adapter", "train_fn_per_worker"),
                ("workloads._ray_compat", "drain_report_queue"),
                ("workloads.determinism", "torch_threads_per_worker"),
            ]
        )
        + b"t."
    )
    assert load_old_pickle(blob)[0] == (train_fn_per_worker, drain_report_queue, torch_threads_per_worker)


def test_a_function_by_value_that_uses_a_moved_module_loads_with_the_module_now():
    import struct

    from ray import cloudpickle

    from workloads.train import determinism

    def uses_module():
        return determinism

    # protocol 2: no frames, each string after its 4-byte length; the module is cloudpickle's subimport(path)
    blob = cloudpickle.dumps(uses_module, protocol=2)
    new, old = b"workloads.train.determinism", b"workloads.determinism"
    assert b"subimport" in blob and blob.count(new) == 1
    blob = blob.replace(struct.pack("<I", len(new)) + new, struct.pack("<I", len(old)) + old)
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(blob)
    fn, renamed = load_old_pickle(blob)
    assert fn() is determinism and renamed == [("workloads.determinism", "")]


def _old_searcher_state() -> bytes:
    """The fixture's searcher state with its spec's globals under the paths an older critbatch used."""
    state = pickle.loads((OLD_TUNE_STATE / "searcher-state.pkl").read_bytes())
    state["tracking_class"] = importlib.import_module("sweeps.spec.tracking").TrackingSpec
    state["train_fn"] = importlib.import_module("workloads.ray.adapter").train_fn_per_worker
    blob = pickle.dumps(state, protocol=2)  # GLOBAL opcodes: their paths are lines, safe to replace
    for new, old in [
        (b"csweeps.spec.tracking\nTrackingSpec\n", b"csweeps.spec.sections\nTrackingSpec\n"),
        (b"cworkloads.ray.adapter\n", b"cworkloads._ray_adapter\n"),
    ]:
        assert new in blob
        blob = blob.replace(new, old)
    return blob


def test_an_old_tune_folder_is_rewritten_with_the_current_paths_and_its_originals_kept(tmp_path):
    shutil.copy(OLD_TUNE_STATE / "tuner.pkl", tmp_path / "tuner.pkl")
    searcher_file = tmp_path / "searcher-state-2026-12-05_00-00-00.pkl"
    searcher_file.write_bytes(old := _old_searcher_state())
    with pytest.raises(AttributeError, match="TrackingSpec"):  # sweeps.spec.sections no longer has it
        pickle.loads(old)
    check_tune_state_readable(str(tmp_path))  # read through the table

    assert migrate_tune_state(tmp_path) == [tmp_path / "tuner.pkl", searcher_file]
    assert (tmp_path / ("tuner.pkl" + BACKUP_SUFFIX)).read_bytes() == (OLD_TUNE_STATE / "tuner.pkl").read_bytes()
    assert Path(str(searcher_file) + BACKUP_SUFFIX).read_bytes() == old
    state = pickle.loads(searcher_file.read_bytes())  # no table needed any more
    assert state["train_fn"].__module__ == "workloads.ray.adapter" and state["spec"].search.batch_sizes_sequences == [
        4,
        8,
    ]
    # tuner.pkl's searcher had none of the attributes added since e6ea0bf: it has them now, at their defaults
    searcher = pickle.loads((tmp_path / "tuner.pkl").read_bytes())["_tune_config"].search_alg
    assert (
        searcher.objectives == {} and searcher.wave_policy.extra_budget_multiples == {} and searcher.trials_for(8) == 1
    )
    assert not hasattr(searcher, "transfer")  # the old layout, composed into a strategy and a wave policy
    assert migrate_tune_state(tmp_path) == []  # once is enough
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["tuner.pkl", "tuner.pkl" + BACKUP_SUFFIX, searcher_file.name, searcher_file.name + BACKUP_SUFFIX]
    )


def test_a_pickle_naming_a_path_nobody_knows_is_refused_and_nothing_is_changed(tmp_path):
    shutil.copy(OLD_TUNE_STATE / "tuner.pkl", tmp_path / "tuner.pkl")
    (tmp_path / "searcher-state-x.pkl").write_bytes(_old_global("sweeps.no_such_module", "Gone"))
    with pytest.raises(InvalidInput, match="searcher-state-x.pkl cannot be read by this critbatch"):
        check_tune_state_readable(str(tmp_path))
    with pytest.raises(ModuleNotFoundError):
        migrate_tune_state(tmp_path)
    assert (tmp_path / "tuner.pkl").read_bytes() == (OLD_TUNE_STATE / "tuner.pkl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["searcher-state-x.pkl", "tuner.pkl"]
