"""Every use of a private Ray Tune, Ray core or Optuna-integration API by the driver side of critbatch, in
one place, each with the reason it is needed and a test (tests/sweeps/test_compat.py) that fails when
the installed version changes it. Pinned against Ray 2.60 and Optuna 4.x.

Used by the driver (Tune, Optuna), the pruning scheduler (Ray's KV store), the reaper (placement
groups) and the Ray Jobs client of :mod:`sweeps.remote` (``JobSubmissionClient``). The worker side
(Ray Train sessions) has its own module, :mod:`workloads.ray.compat`, because
``workloads`` never imports ``sweeps``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = [
    "actor_is_dead",
    "is_job_not_found",
    "job_submission_client",
    "kv_put",
    "optuna_search_completed",
    "optuna_search_reattach",
    "optuna_search_study",
    "optuna_search_trials",
    "optuna_trial_id",
    "placement_group_table",
    "quiet_metrics_of_trials_without_results",
    "quiet_slow_result_processing",
    "reattach_restored_tuner",
    "searcher_inside",
    "snapshot_when_a_trial_ends",
    "whole_tune_snapshots_on_local_storage",
    "without_idle_train_helpers",
]


#: the logger of Tune's ``ExperimentAnalysis``, which ``Tuner.restore()`` and the end of ``Tuner.fit()`` build
_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"


class _TrialsWithoutResults:
    """Drops Tune's "Failed to fetch metrics for N trial(s)" warning when every failure it lists is a
    trial with no ``result.json`` yet (``FileNotFoundError('Could not fetch metrics ...')``)."""

    def filter(self, record) -> bool:
        lines = str(record.getMessage()).splitlines()
        if not lines or not lines[0].startswith("Failed to fetch metrics for"):
            return True
        return not all("FileNotFoundError('Could not fetch metrics for" in line for line in lines[1:])


def quiet_metrics_of_trials_without_results() -> None:
    """Silence Tune's warning about trials that have no results, in ``Tuner.restore()`` and when ``fit()``
    returns.

    A sweep stopped (or resumed) while a trial had not reported yet printed
    ``FileNotFoundError('Could not fetch metrics for run_trial_...')``: Tune's ``ExperimentAnalysis``
    reads every trial's ``result.json``, which Tune writes only with the first result. The driver does
    not read those metrics (``sweeps.store.records.collect_records`` lists such a trial with no curve);
    any other failure to read a trial's metrics is still logged. Idempotent.
    """
    import logging

    log = logging.getLogger(_ANALYSIS_LOGGER)
    if not any(isinstance(f, _TrialsWithoutResults) for f in log.filters):
        log.addFilter(_TrialsWithoutResults())


#: the logger of Tune's ``warn_if_slow`` (``ray.tune.utils.util``), which times every step of the controller
_SLOW_LOGGER = "ray.tune.utils.util"


class _SlowResultProcessing:
    """Drops Tune's ``warn_if_slow`` warnings about processing a trial's results: "The `process_trial_result`
    operation took ... s, which may be a performance bottleneck." and "Processing trial results took ... s".
    Every other ``warn_if_slow`` warning (a slow scheduler, searcher or callback step) passes."""

    def filter(self, record) -> bool:
        msg = str(record.getMessage())
        return not msg.startswith(
            (
                "The `process_trial_result` operation took",
                "The `process_trial_results` operation took",
                "Processing trial results took",
            )
        )


def quiet_slow_result_processing() -> None:
    """Silence Tune's "process_trial_result ... may be a performance bottleneck" warnings (idempotent; only
    this process, the driver, where Tune's controller runs).

    Why: ``critbatch run`` printed them in the terminal between its progress lines. The time they measure is
    the whole handling of one result (the scheduler's, the searcher's and the callbacks' work on it, and the
    trial's checkpoint bookkeeping); each of those steps still warns under its own name
    (``callbacks.on_trial_result``, ...) when it alone is slow. Reporting less often, which the warning
    suggests, would cost milestones. Ray 2.60 has no setting for this one warning: ``TUNE_WARN_THRESHOLD_S``
    (read once, when ``ray.tune.utils.util`` is imported) is the threshold of every ``warn_if_slow``
    operation and would hide the others too. So a filter on ``warn_if_slow``'s logger drops just these.
    """
    import logging

    log = logging.getLogger(_SLOW_LOGGER)
    if not any(isinstance(f, _SlowResultProcessing) for f in log.filters):
        log.addFilter(_SlowResultProcessing())


def whole_tune_snapshots_on_local_storage() -> None:
    """Make Tune's copy of its experiment snapshot into a local storage folder keep the last whole
    snapshot when a write fails (idempotent; only this process).

    Why: Tune writes its snapshot (``experiment_state-*.json``, the searcher's and the callbacks' state)
    into a staging folder under Ray's temp dir, then a background syncer copies that folder into the
    storage folder (``OUT/tune/<sweep id>``) file by file, in place (``_upload_to_fs_path``, Ray 2.60).
    A full disk (or a kill) during that copy left ``experiment_state-*.json`` cut short, and
    ``critbatch resume`` then failed inside ``Tuner.restore`` with ``JSONDecodeError`` (CI, 2026-12-05,
    ``test_disk_full_mid_sweep_then_resume_every_record_agrees``). The private ``_upload_to_fs_path`` of
    ``ray.train._internal.storage`` is wrapped: to a ``pyarrow.fs.LocalFileSystem`` destination each file
    is written beside its target and renamed over it, the experiment snapshot last, so a failed copy
    leaves the previous whole file (and no temporary one) and raises as before. Other destinations
    (remote storage) go to Ray's function unchanged.
    """
    from ray.train._internal import storage

    if getattr(storage._upload_to_fs_path, "critbatch_whole_files", False):
        return
    ray_upload = storage._upload_to_fs_path

    def upload(local_path: str, fs: Any, fs_path: str, exclude: list | None = None) -> None:
        import pyarrow.fs

        if type(fs) is not pyarrow.fs.LocalFileSystem or exclude or not os.path.isdir(local_path):
            return ray_upload(local_path, fs, fs_path, exclude)
        _copy_tree_by_whole_files(local_path, fs_path)

    upload.critbatch_whole_files = True
    storage._upload_to_fs_path = upload


def snapshot_when_a_trial_ends() -> None:
    """Make Tune save its experiment snapshot as soon as a trial has ended (or a new one was created), not up
    to ``TUNE_GLOBAL_CHECKPOINT_S`` later (idempotent; only this process, the driver).

    Why: a driver killed within those seconds of a trial's end left the trial ``RUNNING`` in the last
    snapshot, and the resume (or a retried job) ran it again from its last checkpoint: a trial that had
    COMPLETED trained its last milestone twice, and a retried job whose model had changed meanwhile
    restarted it three times into a size mismatch and ended it FAILED (2026-12, an operator's RayJob
    retry). Tune's controller calls its private ``TuneController.checkpoint(force=False)`` after every
    step and skips the save until the period has passed (Ray 2.60); it is wrapped to pass ``force=True``
    when the trials (``self._trials``: how many, how many ``TERMINATED`` or ``ERROR``) changed since its
    last call, so the snapshot that records a trial's end is written (and its copy to the storage
    launched) in the step that ended it. A trial created next is saved in the step that created it too:
    else a kill before the next periodic save left it out of the snapshot while its folder and report
    log existed, the restored searcher asked for it again, and the sweep listed one trial more than
    planned. A kill between a trial's end and that save (the same step) still re-runs it.
    """
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment.trial import Trial

    if getattr(TuneController.checkpoint, "critbatch_on_trial_end", False):
        return
    tune_checkpoint = TuneController.checkpoint

    def checkpoint(self, force: bool = False, wait: bool = False):
        trials = (len(self._trials), sum(1 for t in self._trials if t.status in (Trial.TERMINATED, Trial.ERROR)))
        if trials != getattr(self, "_critbatch_trials", trials):
            force = True
        self._critbatch_trials = trials
        return tune_checkpoint(self, force=force, wait=wait)

    checkpoint.critbatch_on_trial_end = True
    TuneController.checkpoint = checkpoint


def _copy_tree_by_whole_files(source: str, target: str) -> None:
    """Copy every file under ``source`` to the same relative path under ``target``, each one written to
    ``.<name>.tmp`` and renamed over its target; Tune's ``experiment_state-*.json`` files go last (a whole
    new one means every other file of that snapshot arrived).

    Raises:
        OSError: a file could not be written (its temporary file is removed; the target is untouched).
    """
    import shutil
    from pathlib import Path

    entries = list(Path(source).rglob("*"))
    for d in (p for p in entries if p.is_dir()):  # empty folders too, as Ray's copy makes them
        (Path(target) / d.relative_to(source)).mkdir(parents=True, exist_ok=True)
    files = sorted((p for p in entries if p.is_file()), key=lambda p: (p.name.startswith("experiment_state-"), str(p)))
    for src in files:
        dest = Path(target) / src.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def reattach_restored_tuner(tuner: Any, *, callbacks: list, stop: Any, scheduler: Any) -> Any:
    """Give a ``Tuner.restore``-d tuner live callbacks, stopper and scheduler; return its search algorithm.

    Why: ``Tuner.restore`` unpickles the run and tune configs of the interrupted run, whose callbacks
    hold clients (MLflow) and whose scheduler is bound to its annotator; ``restore()`` takes neither as
    an argument (Ray 2.60), so they are set on the private ``_local_tuner``.
    """
    local = tuner._local_tuner
    local._run_config.callbacks = callbacks
    local._run_config.stop = stop
    local._tune_config.scheduler = scheduler
    return local._tune_config.search_alg


def searcher_inside(search_alg: Any, *, has: str = "exhausted") -> Any:
    """The innermost searcher of Tune's wrappers (``SearchGenerator``, ``ConcurrencyLimiter``): the first
    object along ``.searcher`` that has attribute ``has``.

    Raises:
        RuntimeError: none has it.
    """
    s = search_alg
    while s is not None and not hasattr(s, has):
        s = getattr(s, "searcher", None)
    if s is None:
        raise RuntimeError(f"no searcher with {has!r} inside {search_alg!r}")
    return s


def without_idle_train_helpers(callbacks: list, *, has_datasets: bool) -> list:
    """Ray Train's default controller callbacks less the two whose helper process a critbatch trial does
    not need.

    Why: every trial is a fresh Ray Train run, and each of these callbacks starts one more Ray actor, a
    fresh Python process of ~200 MB, before the trial's first step (docs/benchmarks.md, "Per-trial
    start-up"):

    - ``DatasetsCallback`` creates a ``DatasetManager`` (importing ``ray.data``) in
      ``before_init_train_context`` even when the trainer has no datasets; critbatch's workers read their
      own memory-mapped shards. Kept when ``has_datasets``.
    - ``PlacementGroupCleanerCallback`` starts a detached ``PlacementGroupCleaner`` that removes the
      workers' placement group if the controller dies without doing so. The sweep's
      :class:`sweeps.launch.reaper.PlacementGroupReaper` does that job for every trial (and also finds the
      groups the cleaner never hears of).

    Args:
        callbacks: the list ``DataParallelTrainer._create_default_callbacks`` returned (Ray 2.60, Train V2).
        has_datasets: whether the trainer was given Ray Datasets.

    Returns:
        The same callbacks in the same order, without those two.
    """
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    drop: tuple[type, ...] = (
        (PlacementGroupCleanerCallback,) if has_datasets else (PlacementGroupCleanerCallback, DatasetsCallback)
    )
    return [c for c in callbacks if not isinstance(c, drop)]


def placement_group_table() -> list:
    """Every placement group of the cluster as ``gcs_pb2.PlacementGroupTableData`` (with creator actor
    and job, which ``ray.util.placement_group_table()`` does not give).

    Why: finding the placement groups whose creating Train controller died (:mod:`sweeps.launch.reaper`).
    """
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    # protobuf makes its message classes at import: no attribute a type checker can see
    table = gcs_pb2.PlacementGroupTableData  # pyright: ignore[reportAttributeAccessIssue]
    return [table.FromString(raw) for raw in state._connect_and_get_accessor().get_placement_group_table()]


def actor_is_dead(actor_id: bytes) -> bool:
    """Whether the GCS actor table has the actor ``actor_id`` (binary id) as ``DEAD`` (False if unknown).

    Why: a placement group's ``creator_actor_dead`` flag is not always set when its creator dies. In
    Ray 2.60 a Ray Train controller killed because Tune removed its trial's placement group (a paused
    or stopped trial) leaves the groups it created with ``creator_actor_dead = False`` although its
    actor row reads ``DEAD`` (seen 2026-12-02 in a pause-mode sweep that then waited forever for
    those CPUs); :mod:`sweeps.launch.reaper` asks the actor table too.
    """
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    raw = state._connect_and_get_accessor().get_actor_info(ray.ActorID(actor_id))
    # protobuf makes its message classes at import: no attribute a type checker can see
    row = gcs_pb2.ActorTableData  # pyright: ignore[reportAttributeAccessIssue]
    return raw is not None and row.FromString(raw).state == row.DEAD


def kv_put(key: str, value: bytes) -> None:
    """Set a key of Ray's internal key-value store (overwriting).

    Why: the pause-mode rung gate (:mod:`sweeps.pruning.scheduler`) tells a waiting worker it may go on;
    Ray has no public KV store reachable from both the driver and the workers.
    """
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, value, overwrite=True)


def optuna_search_trials(sub: Any) -> dict[str, Any]:
    """``{Tune trial id: optuna.Trial}`` of a Ray ``OptunaSearch`` (its private ``_ot_trials``).

    Why: saving and restoring the searcher keeps the Optuna trials asked before an interruption.
    """
    return sub._ot_trials


def optuna_trial_id(trial: Any) -> int:
    """The storage id of an ``optuna.Trial`` (its private ``_trial_id``; ``number`` is per study, not unique)."""
    return trial._trial_id


def optuna_search_completed(sub: Any) -> set:
    """The Tune trial ids a Ray ``OptunaSearch`` has told Optuna about (its private ``_completed_trials``)."""
    return sub._completed_trials


def optuna_search_study(sub: Any) -> Any:
    """The ``optuna.Study`` of a Ray ``OptunaSearch`` (its private ``_ot_study``)."""
    return sub._ot_study


def optuna_search_reattach(sub: Any, trial_ids: dict[str, int], completed: set) -> None:
    """Re-attach the Optuna trials (by Optuna trial id, as stored in the RDB) asked before an interruption.

    Raises:
        KeyError: an Optuna trial id the study's storage does not hold (``get_trial_number_from_id``).
    """
    import optuna

    study = sub._ot_study
    for tune_id, ot_id in trial_ids.items():
        study._storage.get_trial_number_from_id(ot_id)  # raises if the storage lost it
        sub._ot_trials[tune_id] = optuna.Trial(study, ot_id)
    sub._completed_trials.update(completed)


_ENV_LOCK = threading.Lock()


def job_submission_client(address: str | None, headers: dict[str, str] | None, timeout_s: float | None = None) -> Any:
    """A ``JobSubmissionClient`` for exactly ``address``; with ``timeout_s``, every HTTP request it
    makes (the version check in its constructor included) gives up after that long.

    Why private: Ray's job client takes no timeout (Ray 2.60), so its private ``_do_request`` is
    overridden to add one (a frozen dashboard must not hang the service).

    Ray lets ``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS`` override the ``address`` argument; an
    explicit address must win, so they are hidden while the client resolves its address.
    """
    from ray.job_submission import JobSubmissionClient

    if timeout_s is not None:

        class _TimedClient(JobSubmissionClient):
            def _do_request(self, method, endpoint, **kwargs):
                kwargs.setdefault("timeout", timeout_s)
                return super()._do_request(method, endpoint, **kwargs)

        JobSubmissionClient = _TimedClient

    if address is None:
        return JobSubmissionClient(None, headers=headers)
    keys = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
    if all(os.environ.get(k) in (None, address) for k in keys):
        return JobSubmissionClient(address, headers=headers)
    with _ENV_LOCK:
        saved = {k: os.environ.pop(k) for k in keys if k in os.environ}
        try:
            return JobSubmissionClient(address, headers=headers)
        finally:
            os.environ.update(saved)


def is_job_not_found(exc: Exception) -> bool:
    """Whether a ``RuntimeError`` of Ray's job client says the job does not exist."""
    s = str(exc)
    return "status code 404" in s or "does not exist" in s
