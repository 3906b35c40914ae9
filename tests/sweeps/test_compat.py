"""Every private Ray / Optuna API that ``sweeps._compat`` wraps, exercised against the installed versions:
each test fails if an upgrade renames or changes what critbatch relies on."""

from __future__ import annotations

import pytest
import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.search_generator import SearchGenerator

from sweeps import _compat


def _trainable(config):
    return {"loss": 1.0}


def test_reattach_restored_tuner_sets_the_live_callbacks_stopper_and_scheduler(tmp_path):
    searcher = ConcurrencyLimiter(OptunaSearch(metric="loss", mode="min", space={"x": tune.uniform(0, 1)}), 1)
    tuner = tune.Tuner(
        _trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path)),
    )
    callbacks, stop, scheduler = [tune.Callback()], {"training_iteration": 3}, tune.schedulers.FIFOScheduler()
    search_alg = _compat.reattach_restored_tuner(tuner, callbacks=callbacks, stop=stop, scheduler=scheduler)
    local = tuner._local_tuner
    assert local._run_config.callbacks is callbacks and local._run_config.stop is stop
    assert local._tune_config.scheduler is scheduler and search_alg is searcher


def test_searcher_inside_unwraps_tune_wrappers():
    inner = OptunaSearch(metric="loss", mode="min", space={"x": tune.uniform(0, 1)})
    inner.exhausted = lambda: False  # the attribute BatchSizeSearcher is found by
    wrapped = SearchGenerator(ConcurrencyLimiter(inner, 1))
    assert _compat.searcher_inside(wrapped) is inner
    with pytest.raises(RuntimeError, match="no searcher"):
        _compat.searcher_inside(SearchGenerator(ConcurrencyLimiter(OptunaSearch(metric="loss", mode="min"), 1)))


def test_optuna_search_private_state_round_trips(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    import optuna

    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s", direction="minimize")
    sub = OptunaSearch(metric="loss", mode="min", space={"x": tune.uniform(0, 1)}, storage=storage, study_name="s")
    assert _compat.optuna_search_study(sub).study_name == study.study_name
    config = sub.suggest("t1")
    assert 0 <= config["x"] <= 1
    trials = _compat.optuna_search_trials(sub)
    assert list(trials) == ["t1"]
    ot_id = _compat.optuna_trial_id(trials["t1"])
    assert isinstance(ot_id, int)
    sub.on_trial_complete("t1", {"loss": 0.5})
    assert "t1" in _compat.optuna_search_completed(sub)
    fresh = OptunaSearch(metric="loss", mode="min", space={"x": tune.uniform(0, 1)}, storage=storage, study_name="s")
    fresh.suggest("t2")  # opens the study
    _compat.optuna_search_reattach(fresh, {"t1": ot_id}, {"t1"})
    assert _compat.optuna_trial_id(_compat.optuna_search_trials(fresh)["t1"]) == ot_id
    assert "t1" in _compat.optuna_search_completed(fresh)
    with pytest.raises(KeyError):
        _compat.optuna_search_reattach(fresh, {"t9": 10**6}, set())


@pytest.fixture
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_placement_group_table_and_kv_put(local_ray):
    from ray.experimental.internal_kv import _internal_kv_get
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=60)
    rows = _compat.placement_group_table()
    mine = [r for r in rows if r.placement_group_id == pg.id.binary()]
    assert len(mine) == 1
    row = mine[0]  # the fields the reaper reads
    assert row.creator_job_id.hex() == ray.get_runtime_context().get_job_id()
    assert not row.is_detached and isinstance(row.creator_actor_dead, bool)
    assert row.creator_actor_id in (b"", ray.ActorID.nil().binary())  # made by the driver, not an actor: no orphan
    remove_placement_group(pg)
    _compat.kv_put("critbatch-test/key", b"123")
    _compat.kv_put("critbatch-test/key", b"456")  # overwrites
    assert _internal_kv_get("critbatch-test/key") == b"456"


_UPLOAD_UNDER_A_FILE_SIZE_LIMIT = r"""
import json, resource, signal, sys
import pyarrow.fs
from ray.train._internal import storage
if sys.argv[1] == "critbatch":
    from sweeps._compat import whole_tune_snapshots_on_local_storage
    whole_tune_snapshots_on_local_storage()
    whole_tune_snapshots_on_local_storage()  # idempotent: wraps once
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, like ENOSPC
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
fn, kwargs = storage._FilesystemSyncer(storage_filesystem=pyarrow.fs.LocalFileSystem())._sync_up_command(
    sys.argv[2], sys.argv[3])
try:
    fn(**kwargs)
    print("copied")
except OSError as exc:
    print("raised", type(exc).__name__)
"""


@pytest.mark.parametrize("upload", ["ray", "critbatch"])
def test_a_failed_snapshot_copy_to_local_storage_keeps_the_last_whole_snapshot(tmp_path, upload):
    """Tune's syncer copies its staged snapshot into the storage folder through the private
    ``ray.train._internal.storage._upload_to_fs_path``. A write that fails mid-file (a per-process file
    size limit stands in for a full disk) cuts Ray's in-place copy short; with
    :func:`sweeps._compat.whole_tune_snapshots_on_local_storage` the previous whole file stays, with no
    temporary file, and the error is still raised. The small files of the snapshot are copied."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    staged, stored = tmp_path / "staged", tmp_path / "stored"
    (staged / "trial_0").mkdir(parents=True)
    new_state = {"trial_data": [["x" * 100, "{}"]] * 100}  # about 11 kB: past the 4 kB limit
    (staged / "experiment_state-2026-12-05_06-00-00.json").write_text(json.dumps(new_state))
    (staged / "searcher-state-2026-12-05_06-00-00.pkl").write_bytes(b"searcher")
    stored.mkdir()
    old = json.dumps({"trial_data": []})
    (stored / "experiment_state-2026-12-05_06-00-00.json").write_text(old)

    r = subprocess.run(
        [sys.executable, "-c", _UPLOAD_UNDER_A_FILE_SIZE_LIMIT, upload, str(staged), str(stored)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "raised", r.stdout
    text = (stored / "experiment_state-2026-12-05_06-00-00.json").read_text()
    if upload == "ray":  # why the wrapper exists: Ray's copy leaves a torn snapshot
        assert text != old and len(text) <= 4096
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    else:
        assert text == old
        assert (stored / "searcher-state-2026-12-05_06-00-00.pkl").read_bytes() == b"searcher"
        assert (stored / "trial_0").is_dir()
        assert not [p.name for p in stored.iterdir() if p.name.endswith(".tmp")]


def test_the_trial_trainer_starts_no_dataset_manager_or_placement_group_cleaner(tmp_path):
    """Ray 2.60's default controller callbacks include the two helpers (the private API this pins), and
    the trial's trainer keeps every other callback, in order, without them."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from sweeps.launch.trainable import TrialTorchTrainer

    def kinds(trainer) -> list[type]:
        return [type(c) for c in trainer._create_default_callbacks()]

    args = dict(scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(storage_path=str(tmp_path)))
    ray_default = kinds(TorchTrainer(lambda: None, **args))
    assert PlacementGroupCleanerCallback in ray_default and DatasetsCallback in ray_default
    ours = kinds(TrialTorchTrainer(lambda: None, **args))
    assert ours == [k for k in ray_default if k not in (PlacementGroupCleanerCallback, DatasetsCallback)]
    assert len(ours) == len(ray_default) - 2

    with_data = kinds(TrialTorchTrainer(lambda: None, datasets={"train": lambda: None}, **args))
    assert DatasetsCallback in with_data and PlacementGroupCleanerCallback not in with_data


def test_tunes_slow_result_processing_warnings_are_dropped_and_every_other_slow_warning_kept(monkeypatch):
    """``critbatch run`` printed "The `process_trial_result` operation took 0.6 s, which may be a performance
    bottleneck." in the terminal: dropped; the same warning for any other step still reaches the log."""
    import inspect
    import logging
    import time

    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.utils import util

    # the controller still times these two under these names and this message (else the filter is stale)
    src = inspect.getsource(TuneController._on_training_result) + inspect.getsource(
        TuneController._process_trial_results
    )
    assert 'warn_if_slow("process_trial_result")' in src and '"Processing trial results took {duration:.3f} s, "' in src
    monkeypatch.setattr(util, "START_OF_TIME", time.time() - 120)  # Tune is quiet in a process's first minute
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log = logging.getLogger(_compat._SLOW_LOGGER)
    assert util.logger is log
    log.addHandler(handler)
    try:
        _compat.quiet_slow_result_processing()
        _compat.quiet_slow_result_processing()  # idempotent
        assert sum(isinstance(f, _compat._SlowResultProcessing) for f in log.filters) == 1
        for name, message in (
            ("process_trial_result", None),
            (
                "process_trial_results",
                "Processing trial results took {duration:.3f} s, which may be a "
                "performance bottleneck. Please consider reporting results "
                "less frequently to Ray Tune.",
            ),
            ("callbacks.on_trial_result", None),
            ("on_step_begin", None),
        ):
            with util.warn_if_slow(name, threshold=1e-6, message=message):
                time.sleep(0.01)
    finally:
        log.removeHandler(handler)
    assert [m.split(" operation")[0] for m in seen] == ["The `callbacks.on_trial_result`", "The `on_step_begin`"]


def test_tunes_snapshot_is_forced_in_the_step_a_trial_ends(monkeypatch):
    """A driver killed within ``TUNE_GLOBAL_CHECKPOINT_S`` of a trial's end left it RUNNING in the snapshot, and
    a resume ran it again: the wrapped ``TuneController.checkpoint`` forces the save when a trial ended or was
    created, and leaves Tune's throttle alone otherwise."""
    import inspect
    from types import SimpleNamespace

    from ray.tune.execution.tune_controller import TuneController

    src = inspect.getsource(TuneController)
    assert "self._trials: List[Trial] = []" in src and "self.checkpoint()" in inspect.getsource(TuneController.step)
    assert list(inspect.signature(TuneController.checkpoint).parameters) == ["self", "force", "wait"]
    forced: list[bool] = []

    class Manager:
        def sync_up_experiment_state(self, save_fn, force, wait):
            forced.append(force)

    monkeypatch.setattr(TuneController, "checkpoint", TuneController.checkpoint)  # restored after the test
    _compat.snapshot_when_a_trial_ends()
    _compat.snapshot_when_a_trial_ends()  # idempotent
    assert TuneController.checkpoint.critbatch_on_trial_end
    trials = [SimpleNamespace(status="TERMINATED"), SimpleNamespace(status="RUNNING")]
    controller = SimpleNamespace(_trials=trials, _checkpoint_manager=Manager(), save_to_dir=lambda: None)
    step = TuneController.checkpoint
    step(controller)  # the first step (a restored run: its ended trials are the baseline)
    step(controller)
    trials[1].status = "TERMINATED"
    step(controller)
    step(controller)
    trials.append(SimpleNamespace(status="PENDING"))  # created
    step(controller)
    trials[2].status = "RUNNING"  # started: saved when Tune's period has passed
    step(controller)
    trials[2].status = "ERROR"
    step(controller)
    step(controller, force=True)  # Tune's own forced saves pass through
    assert forced == [False, False, True, False, True, False, True, True]
