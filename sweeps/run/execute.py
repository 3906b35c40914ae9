"""The Tune run of a sweep: the trainable, the searcher, the pruning scheduler, the callbacks and the
stopper built from the spec and the sweep's state, a new ``Tuner`` or a restored one, ``fit()``, and
the trials read back for :func:`sweeps.run.finish.finish_sweep`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeps._compat import (
    quiet_metrics_of_trials_without_results,
    quiet_slow_result_processing,
    reattach_restored_tuner,
    searcher_inside,
    snapshot_when_a_trial_ends,
    whole_tune_snapshots_on_local_storage,
)
from sweeps.errors import InvalidInput
from sweeps.launch.workload import with_inputs
from sweeps.run.context import SweepResult, SweepRun
from sweeps.run.finish import finish_sweep
from sweeps.spec import SweepSpec
from sweeps.spec.statuses import ENDED_TRIAL_STATUSES, TrialStatus
from sweeps.store.migrations import load_old_pickle, migrate_tune_state, tune_state_files
from sweeps.store.records import collect_records, records_from_grid
from sweeps.store.state import PRUNED_WHILE_PAUSED, REPORTS_DIR, optuna_storage_url, tune_dir_of, write_json

__all__ = ["execute_sweep"]

#: statuses of past trials that report nothing more (a resumed scheduler sees them as ended)
_ENDED = ENDED_TRIAL_STATUSES


@dataclass
class _Parts:
    """What one Tune run is made of."""

    trainable: Any
    scheduler: Any  # EqualComputeScheduler | None
    stopper: Any  # SweepBudgetStopper | None
    progress: Any  # ProgressCallback
    callbacks: list
    report_log: Any  # ReportLog
    runners: Any = None  # TrialRunners | None (sweeps.launch.runners), started by execute_sweep
    runners_shared: bool = False  # a RunnerPool's (a comparison's): left running for the next arm


def execute_sweep(run: SweepRun) -> SweepResult:
    """Run (or continue, ``run.resume``) the sweep's Tune run to its end, then finish the sweep.

    Returns:
        :func:`sweeps.run.finish.finish_sweep`'s result.
    """
    from ray import tune

    spec, output, state, stop = run.spec, run.output, run.state, run.stop
    parts = _build_parts(run)
    if run.resume and run.local:  # Tune's state is in OUT (else on shared storage)
        _replay_past_trials(run, parts)
    t0 = time.monotonic()
    # StopSignals turns SIGINT into Tune's interrupt itself; Tune's SIGINT handler would hide it (fit() returns)
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    grid = None
    tune_dir = tune_dir_of(state.storage_root, state.sweep_id)
    quiet_metrics_of_trials_without_results()  # Tune reads every trial's results in restore() and fit()
    quiet_slow_result_processing()  # Tune's "process_trial_result ... bottleneck" warnings, not the others
    whole_tune_snapshots_on_local_storage()  # a full disk must not cut Tune's snapshot in OUT short
    snapshot_when_a_trial_ends()  # a driver killed just after a trial ended must not run it again
    try:
        if parts.runners is not None:
            parts.runners.start()  # their workers start (imports, corpus) while Tune sets up
        if run.resume and tune.Tuner.can_restore(tune_dir):
            tuner = _restored_tuner(tune_dir, run, parts)
        else:
            tuner = _new_tuner(run, parts)
        stop.tune_running = True
        grid = tuner.fit()
    except Exception as exc:
        # a report that could not be logged ends Tune's run; Tune keeps only the text of the error
        if parts.report_log.write_error is not None:
            raise parts.report_log.write_error from exc
        raise
    finally:
        stop.tune_running = False
        parts.progress.close()
        if parts.runners is not None and (stop.forced or not parts.runners_shared):
            parts.runners.stop(forced=stop.forced)  # a force-quit does not wait for trials to reach a report

    records = collect_records(output, spec, sweep_id=state.sweep_id) if run.local else records_from_grid(grid)
    note = ""
    if parts.stopper is not None and parts.stopper.exhausted:
        note = f"the sweep's FLOP budget ({spec.budget.sweep_flops:.3g}) ran out"
    elif spec.budget.wall_clock_s is not None and time.monotonic() - t0 >= spec.budget.wall_clock_s:
        note = f"the sweep's wall-clock budget ({spec.budget.wall_clock_s:g} s) ran out"
    return finish_sweep(run, records, stopped=stop.signum is not None, budget_note=note)


def _build_parts(run: SweepRun) -> _Parts:
    from sweeps.launch.launcher import launcher_for
    from sweeps.launch.reaper import PlacementGroupReaper
    from sweeps.launch.trainable import batch_plan_params, make_trainable, training_params
    from sweeps.run.progress import ProgressCallback
    from sweeps.store.reportlog import ReportLog
    from sweeps.tracking.writer import MlflowTrialCallback

    spec, output, state, concurrency = run.spec, run.output, run.state, run.concurrency
    root, local = state.storage_root, run.local
    keep_checkpoints = spec.tracking.checkpoint_artifact_max_mb > 0
    save_root = (str(output / "checkpoints") if local else root + "/checkpoints") if keep_checkpoints else None
    pause_mode = spec.pruning.enabled and spec.pruning.mode == "pause"
    gate_prefix = f"critbatch-rung-gate/{state.sweep_id}" if pause_mode else None
    # A trial that Tune stops before its end (paused or pruned at a rung, cut by a budget) is still inside
    # TorchTrainer.fit() (in mode pause its workers wait at the rung gate): Tune's graceful stop waits up to
    # TUNE_FORCE_TRIAL_CLEANUP_S (600 s) before killing its actor, which holds its CPUs meanwhile, and the
    # next trials wait for them (seen: a 7-batch-size pause-mode sweep stalled). Kill it within seconds.
    os.environ.setdefault("TUNE_FORCE_TRIAL_CLEANUP_S", "5")
    from sweeps.run.dataprep import prepared_shards

    launcher = launcher_for(spec, run.prepared.settings)  # resources.launcher (sweeps/launch/launcher.py)
    runners, shared = launcher.trial_runners(
        sweep_id=state.sweep_id, count=min(concurrency, spec.max_trials), storage_path=root + "/train"
    )
    workload = with_inputs(run.prepared.workload, data_path=state.data_path, shards=prepared_shards(spec, output, root))
    trainable = make_trainable(
        spec,
        workload=workload,
        storage_path=root + "/train",
        save_dir_root=save_root,
        rung_gate_prefix=gate_prefix,
        exchange=runners.name if runners is not None else None,
        launcher=launcher.name,
    )
    progress = ProgressCallback(
        spec.n_trials, list(spec.search.batch_sizes_sequences), concurrency, enabled=run.show_progress
    )
    c_tok, convention = run.prepared.facts.flops()
    tracker_cb = MlflowTrialCallback(
        run.tracker,
        lambda cfg: {
            **batch_plan_params(spec, int(cfg["batch_size_sequences"])),
            **training_params(spec),
            "flops_per_token": c_tok,
            "flops_convention": convention,
        },
    )
    scheduler = _scheduler(spec, output, gate_prefix=gate_prefix, local=local, resume=run.resume)
    callbacks = [tracker_cb, progress]
    if scheduler is not None:
        callbacks.insert(0, scheduler.annotator())  # first: writes decisions into each result
    callbacks.append(PlacementGroupReaper())  # frees the workers of trials stopped mid-fit (pruned, budget, stop)
    if runners is not None:  # a trial Tune pauses or ends frees its runner
        from sweeps.launch.runners import RunnerCancels

        callbacks.append(RunnerCancels(runners.name))
    report_log = ReportLog(output / REPORTS_DIR)
    callbacks.append(report_log)  # last: sees each result as annotated by the others
    stopper = None
    if spec.budget.sweep_flops is not None:
        from sweeps.search.budget import SweepBudgetStopper

        stopper = SweepBudgetStopper(spec.budget.sweep_flops)
    return _Parts(
        trainable=trainable,
        scheduler=scheduler,
        stopper=stopper,
        progress=progress,
        callbacks=callbacks,
        report_log=report_log,
        runners=runners,
        runners_shared=shared,
    )


def _scheduler(spec: SweepSpec, output: Path, *, gate_prefix: str | None, local: bool, resume: bool):
    """The equal-compute pruning scheduler (None without pruning), with the trials a resumed sweep
    pruned while they were paused (``OUT/pruned_while_paused.json``, kept only when Tune's state is in OUT)."""
    if not spec.pruning.enabled:
        return None
    from sweeps.pruning.scheduler import EqualComputeScheduler

    path = output / PRUNED_WHILE_PAUSED
    pruned = json.loads(path.read_text()) if local and resume and path.is_file() else None
    return EqualComputeScheduler.from_spec(
        spec, gate_prefix=gate_prefix, state_path=str(path) if local else None, pruned_while_paused=pruned
    )


def _replay_past_trials(run: SweepRun, parts: _Parts) -> None:
    """Give the scheduler and the budget stopper the trials so far: neither is in Tune's experiment checkpoint."""
    past = collect_records(run.output, run.spec, sweep_id=run.state.sweep_id)
    scheduler = parts.scheduler
    if scheduler is not None:
        for r in past:
            scheduler.observe(
                r.trial_id,
                r.batch_size_sequences,
                r.tokens,
                r.flops,
                r.val_loss,
                ended=r.status in _ENDED,
                pruning=r.pruning,
            )
        if scheduler.mode == "pause":
            scheduler.restore_decisions()
            for r in past:
                if r.status == TrialStatus.FAILED:  # Tune.restore(resume_errored=True) retries it
                    scheduler.reopen(r.trial_id)
    parts.progress.replay(past)
    if parts.stopper is not None:
        parts.stopper.add_spent({r.trial_id: r.flops[-1] for r in past if r.flops})


def check_tune_state_readable(tune_dir: str) -> None:
    """Refuse a resume whose Tune state (``tuner.pkl``, and the searcher's ``searcher-state-*.pkl``) this
    critbatch cannot unpickle, before anything changes.

    Tune pickles the run's searcher, callbacks and scheduler by their class paths; a class that moved since
    the sweep started is read from where it is now (:data:`sweeps.store.migrations.PICKLE_RENAMES`, the
    files rewritten by :func:`sweeps.store.migrations.migrate_tune_state` before ``Tuner.restore``). Any
    other would crash inside ``Tuner.restore`` after the sweep's status and MLflow runs were already set
    to running. A state on remote storage is not checked here.

    Raises:
        InvalidInput: a file exists and does not unpickle (the exception's text is in the message).
    """
    for path in tune_state_files(tune_dir):
        try:
            load_old_pickle(path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - any unpickling error means the same thing here
            raise InvalidInput(
                f"the Tune state {path} cannot be read by this critbatch ({type(exc).__name__}: {exc}); it was "
                "probably written by another version: resume with the version that started the sweep. "
                "Nothing was changed"
            ) from None


def _restored_tuner(tune_dir: str, run: SweepRun, parts: _Parts):
    from ray import tune

    migrate_tune_state(tune_dir)  # older class paths, before Tune unpickles them
    tuner = tune.Tuner.restore(tune_dir, trainable=parts.trainable, resume_unfinished=True, resume_errored=True)
    # callbacks hold live clients, and the scheduler is the one its annotator is bound to: re-attach them
    search_alg = reattach_restored_tuner(
        tuner, callbacks=parts.callbacks, stop=parts.stopper, scheduler=parts.scheduler
    )
    if parts.scheduler is not None and parts.scheduler.mode == "pause":
        searcher_inside(search_alg).attach_scheduler(parts.scheduler)
    _attach_precision(searcher_inside(search_alg), run, parts)
    return tuner


def _attach_precision(searcher: Any, run: SweepRun, parts: _Parts) -> None:
    """Give the searcher what it reads from the sweep's records (the driver's report log, ``OUT/reports/``):
    the trials of a batch size, so its study is told tokens to a target loss and, under ``transfer``, its best
    LR is the one fastest at the fit's target losses; with ``search.precision`` the sweep's analysis after each wave (as ``cbs.json`` has it, at the
    targets the first wave declared) and a report that writes ``OUT/precision.json`` (waves, outcome,
    targets) and prints the wave's interval."""
    from sweeps.run.finish import PRECISION_FILE, sweep_analysis
    from sweeps.store.records import records_from_reports

    spec, output = run.spec, run.output  # the closures below must not hold the run (live clients): plain values
    searcher.attach_records(lambda: records_from_reports(output))  # tokens to a target, as the fit reads it
    precision = spec.search.precision
    if precision is None:
        return

    c_tok, _ = run.prepared.facts.flops()
    try:
        tps = run.prepared.facts.tokens_per_sequence()  # counted once, for every wave and cbs.json
    except Exception:  # noqa: BLE001 - the analysis counts it again, and fails as an analysis does
        tps = None
    progress = parts.progress  # the closures below are pickled with the Tuner's searcher: nothing live beyond it

    def analyse(targets: list[float] | None) -> tuple[dict[str, Any], list]:
        records = records_from_reports(output)
        return sweep_analysis(spec, records, c_tok, targets=targets, tokens_per_seq=tps).to_json_dict(), records

    def report(
        waves: list[dict[str, Any]], outcome: dict[str, Any] | None, planned_trials: int, targets: list[float] | None
    ) -> None:
        write_json(output / PRECISION_FILE, {"waves": waves, "outcome": outcome, "targets": targets})
        if waves:  # none when the first wave's analysis failed (outcome analysis_failed)
            progress.wave(waves[-1], outcome, precision.b_crit_ratio, planned_trials)

    searcher.attach_precision(analyse, report)


def _new_tuner(run: SweepRun, parts: _Parts):
    from ray import tune

    from sweeps.launch.launcher import reuse_trial_actors
    from sweeps.search.searcher import BatchSizeSearcher

    spec, output, state = run.spec, run.output, run.state
    pause = parts.scheduler is not None and parts.scheduler.mode == "pause"
    # in mode pause the scheduler gates new trials: Tune's limiter would count the paused ones and deadlock
    searcher = BatchSizeSearcher(
        spec,
        storage_url=state.optuna_storage or optuna_storage_url(output),
        study_prefix=state.sweep_id,
        fingerprint=state.fingerprint,
        scheduler=parts.scheduler if pause else None,
    )
    _attach_precision(searcher, run, parts)
    return tune.Tuner(
        parts.trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=parts.scheduler,
            num_samples=spec.max_tune_trials,  # search.precision may add trials after the planned ones
            max_concurrent_trials=None if pause else run.concurrency,
            reuse_actors=reuse_trial_actors(spec, run.prepared.settings),
            time_budget_s=spec.budget.wall_clock_s,
        ),
        run_config=tune.RunConfig(
            name=state.sweep_id,
            storage_path=state.storage_root + "/tune",  # tune_experiment_dir
            callbacks=parts.callbacks,
            verbose=0,
            stop=parts.stopper,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
