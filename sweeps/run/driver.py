"""Run (or resume) a sweep: Ray, the Tune + Optuna search, MLflow runs, analysis and report.

Order of events, so that bad input leaves nothing behind: validate the spec and the data and refuse
an output folder of another sweep (:func:`sweeps.run.prepare.prepare_sweep`); connect Ray and check the trial bundle fits the cluster; only
then create the output folder, the MLflow parent run and the Optuna storage. The Tune run itself is
:mod:`sweeps.run.execute`, its end :mod:`sweeps.run.finish`, the state on disk :mod:`sweeps.store.state`; what the run carries
through them, and returns, :mod:`sweeps.run.context`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from sweeps.errors import CritbatchError, InvalidInput, SweepFailed, WriteFailed
from sweeps.files import SpaceReserve, out_of_space_cause, write_atomic
from sweeps.launch.cluster import ResourcePlan, cluster_shape, plan_resources, ray_session
from sweeps.run.context import PreparedSweep, SweepResult, SweepRun
from sweeps.run.execute import check_tune_state_readable, execute_sweep
from sweeps.run.preflight import check_optuna_storage, check_output_folder, check_output_writable, resolve_data_path
from sweeps.run.prepare import prepare_sweep, resumed_sweep
from sweeps.run.signals import FORCE_QUIT_DRAIN_S, StopSignals
from sweeps.settings import Settings
from sweeps.spec import SweepSpec, parse_stored_spec
from sweeps.spec.statuses import FINISHED_STATUSES, SweepStatus
from sweeps.store.claims import claim_output_folder, lock_output_folder, write_storage_binding
from sweeps.store.inputs import check_inputs_unchanged, pin_inputs
from sweeps.store.state import SweepState, optuna_storage_url, tune_dir_of
from sweeps.tracking.base import Tracker
from sweeps.tracking.registry import SinkContext, build_tracker

__all__ = ["resume_single_sweep", "run_single_sweep"]

log = logging.getLogger(__name__)


def run_single_sweep(
    spec: SweepSpec,
    output: Path,
    *,
    tracking_uri: str | None = None,
    sweep_id: str | None = None,
    ray_address: str | None = None,
    ray_connect_timeout_s: float | None = None,
    show_progress: bool = True,
    settings: Settings | None = None,
) -> SweepResult:
    """Run a whole sweep (a spec without ``arms``: the front door, :func:`sweeps.run.api.run_sweep`, routes a
    comparison to :mod:`sweeps.run.compare`) and write ``OUT/cbs.json`` and ``OUT/report.html``.

    Ray is connected (a given address within ``ray_connect_timeout_s`` seconds: :func:`sweeps.launch.cluster.init_ray`)
    and the trial bundle fitted to it before the output folder is claimed, atomically
    (:func:`~sweeps.store.claims.claim_output_folder`): a dead address or a too-small cluster leaves nothing behind.
    SIGINT and SIGTERM stop the sweep cleanly and resumably (:class:`~sweeps.run.signals.StopSignals`).
    ``settings``: the ``CRITBATCH_*`` settings (:class:`sweeps.settings.Settings`; default: from the environment).

    Returns:
        the :class:`~sweeps.run.context.SweepResult`: ``ok`` is False when the sweep FAILED (no trial completed,
        or the analysis could not run) or was STOPPED; ``exit_code`` is ``128 + signal`` when a signal stopped
        it, else None.

    Raises:
        InvalidInput: see :func:`sweeps.run.prepare.prepare_sweep`; also an output folder that cannot be created,
            resources that cannot fit the cluster. Nothing was created.
        RayUnreachable: the given Ray address did not answer within ``ray_connect_timeout_s``
            (:mod:`sweeps.launch.reach`); nothing was created.
        CritbatchError: MLflow unreachable when the sweep starts (nothing is left behind either).
    """
    settings = settings or Settings.from_env()
    prepared = prepare_sweep(spec, output, tracking_uri=tracking_uri, sweep_id=sweep_id, settings=settings)
    output, sweep_id = prepared.output, prepared.sweep_id
    timeout_s = ray_connect_timeout_s if ray_connect_timeout_s is not None else settings.ray_connect_timeout_s
    with StopSignals() as stop:
        claim = None
        started = False
        tracker = None
        try:
            with ray_session(ray_address, prepared.spec, connect_timeout_s=timeout_s):
                stop.install()  # ray.init replaced the SIGTERM handler
                plan = _resource_plan(prepared.spec)
                claim = claim_output_folder(output, sweep_id, _fingerprint(prepared))  # exclusive: a second run exits 2
                from sweeps.launch.launcher import sweep_runners

                # the runners' hosts import (seconds) while MLflow is set up; stopped when the sweep ends
                with sweep_runners(
                    prepared.spec,
                    sweep_id,
                    concurrency=plan.concurrency,
                    storage_path=prepared.storage_root + "/train",
                    settings=settings,
                ):
                    resume = prepared.shared_storage and _tune_state_exists(prepared)
                    if resume:  # a retried job (e.g. a KubeRay RayJob) finds its own sweep's state on shared storage
                        tracker, state = _attach_shared(prepared, ray_address, settings)
                        log.warning("resuming sweep %s from %s", sweep_id, prepared.storage_root)
                    else:
                        tracker = _tracker(
                            prepared.tracking_uri, prepared.spec, sweep_id, prepared.fingerprint, settings
                        )
                        state = _start(prepared, tracker, ray_address=ray_address, settings=settings)
                    started = True
                    return _execute_guarded(
                        SweepRun(
                            prepared=prepared,
                            tracker=tracker,
                            state=state,
                            stop=stop,
                            concurrency=plan.concurrency,
                            show_progress=show_progress,
                            resume=resume,
                        )
                    )
        except KeyboardInterrupt:
            if started:
                raise
            # stopped before the sweep started: nothing to resume, so nothing is left behind
            return SweepResult.stopped(
                sweep_id, output, "stopped before the sweep started; nothing was kept", stop.exit_code
            )
        finally:
            if claim is not None:  # none: Ray, the cluster's size or the claim itself refused the sweep
                if not started:
                    _discard(output, tracker)
                claim.release(remove=not started)


def _resource_plan(spec: SweepSpec) -> ResourcePlan:
    """:func:`~sweeps.launch.cluster.plan_resources` on the connected cluster; its warning logged."""
    total, largest = cluster_shape()
    plan = plan_resources(spec, total, largest)
    if plan.warning:
        log.warning(plan.warning)
    return plan


def _tune_state_exists(prepared: PreparedSweep) -> bool:
    """Whether the sweep's storage root already holds its Tune experiment."""
    from ray import tune

    return tune.Tuner.can_restore(tune_dir_of(prepared.storage_root, prepared.sweep_id))


def _start(prepared: PreparedSweep, tracker: Tracker, *, ray_address: str | None, settings: Settings) -> SweepState:
    """Create the sweep's MLflow parent run, bind a shared storage root to the sweep, write ``spec.yaml``
    and ``sweep.json``.

    Raises:
        CritbatchError: MLflow refused the parent run.
    """
    spec, output, root = prepared.spec, prepared.output, prepared.storage_root
    try:
        tracker.start_parent()
    except Exception as exc:  # noqa: BLE001
        raise CritbatchError(f"cannot create the sweep's MLflow run at {prepared.tracking_uri}: {exc}") from None
    experiment_id, parent_run_id = tracker.experiment_id, tracker.parent_run_id
    if experiment_id is None or parent_run_id is None:
        raise CritbatchError("the sweep's first tracking sink recorded no parent run: sweep.json needs its ids")
    if prepared.shared_storage:  # a retried job is checked against these (sweeps.run.prepare)
        write_storage_binding(root, prepared.sweep_id, _fingerprint(prepared), prepared.inputs)
    state = SweepState(
        sweep_id=prepared.sweep_id,
        fingerprint=prepared.fingerprint,
        tracking_uri=prepared.tracking_uri,
        experiment_id=experiment_id,
        parent_run_id=parent_run_id,
        data_path=resolve_data_path(spec),
        ray_address=ray_address,
        storage_root=root,
        optuna_storage=optuna_storage_url(output, settings),
        inputs=prepared.inputs,
    )
    SpaceReserve(output).keep()  # room to record a crash on a full disk
    _write_spec(output, spec)
    state.save(output)
    return state


def _fingerprint(prepared: PreparedSweep) -> str:
    """The fingerprint a new sweep's id is bound to (:func:`~sweeps.run.prepare.prepare_sweep` always sets one).

    Raises:
        CritbatchError: none was set (a resumed sweep's :class:`PreparedSweep` started as new).
    """
    if prepared.fingerprint is None:
        raise CritbatchError(f"sweep '{prepared.sweep_id}' has no spec fingerprint to bind its id to")
    return prepared.fingerprint


def _discard(output: Path, tracker: Tracker | None) -> None:
    """Remove what a sweep that did not start made: its MLflow parent run and ``spec.yaml``."""
    if tracker is not None:
        tracker.discard()
    (output / "spec.yaml").unlink(missing_ok=True)
    SpaceReserve(output).release()


def resume_single_sweep(
    output: Path,
    *,
    ray_address: str | None = None,
    ray_connect_timeout_s: float | None = None,
    show_progress: bool = True,
    settings: Settings | None = None,
) -> SweepResult:
    """Resume an interrupted sweep from ``OUT`` (``Tuner.restore``; Optuna study and MLflow runs kept); not a
    comparison (the front door, :func:`sweeps.run.api.resume_sweep`, routes one to :mod:`sweeps.run.compare`).

    Unfinished trials continue from their last checkpoint (every report it holds is sent again,
    so no milestone is lost); finished ones are not rerun. The inputs are checked against those ``sweep.json``
    pinned (:func:`sweeps.store.inputs.check_inputs_unchanged`, the gate a retried job goes through too); a
    sweep started before inputs were pinned is resumed unchecked and pinned now. ``settings``: as for
    :func:`run_single_sweep`.

    Raises:
        InvalidInput: ``OUT`` holds no sweep, one that never started or already finished, its spec
            no longer validates, it is not writable, an input it started with changed or is gone
            (:func:`sweeps.store.inputs.check_inputs_unchanged`), or another driver is running there.
        RayUnreachable: the Ray address (given, else the one the sweep ran on) did not answer within
            ``ray_connect_timeout_s`` (:mod:`sweeps.launch.reach`); ``sweep.json`` is left as it was.
    """
    settings = settings or Settings.from_env()
    timeout_s = ray_connect_timeout_s if ray_connect_timeout_s is not None else settings.ray_connect_timeout_s
    output = Path(output).expanduser().resolve()
    check_output_folder(output, resuming=True)
    state = SweepState.load(output)
    spec = parse_stored_spec(yaml.safe_load((output / "spec.yaml").read_text()))
    if state.status in FINISHED_STATUSES and (output / "cbs.json").is_file() and not state.error:
        raise InvalidInput(f"sweep '{state.sweep_id}' in {output} already finished ({state.status})")
    check_output_writable(output)  # before Ray: its lock, state and records are written there
    inputs = pin_inputs(spec, hf_config_from=str(output / "spec.yaml"), missing_ok=True)
    check_inputs_unchanged(state.inputs, inputs, since=f"the sweep in {output} started")
    if state.inputs is None and not any(r.get("missing") for r in inputs.values()):
        state.inputs = inputs  # from here on, a resume (or a retried job) is checked against these
    check_tune_state_readable(tune_dir_of(state.storage_root, state.sweep_id))
    check_optuna_storage(state.optuna_storage or optuna_storage_url(output, settings), source=f"resume of {output}")
    prepared = resumed_sweep(spec, output, state, settings)
    with StopSignals() as stop:
        claim = lock_output_folder(output, state.sweep_id)  # a second driver on one folder exits 2
        try:
            with ray_session(ray_address or state.ray_address, spec, connect_timeout_s=timeout_s):
                stop.install()  # ray.init replaced the SIGTERM handler
                total, largest = cluster_shape()
                plan = plan_resources(spec, total, largest)
                from sweeps.launch.launcher import sweep_runners

                with sweep_runners(
                    spec,
                    state.sweep_id,
                    concurrency=plan.concurrency,
                    storage_path=state.storage_root + "/train",
                    settings=settings,
                ):
                    tracker = _tracker(state.tracking_uri, spec, state.sweep_id, state.fingerprint, settings)
                    SpaceReserve(output).keep()  # a full disk refuses the resume here, before anything changes
                    tracker.attach_parent(state.experiment_id, state.parent_run_id)
                    state.status, state.error = SweepStatus.RUNNING, None
                    state.save(output)
                    return _execute_guarded(
                        SweepRun(
                            prepared=prepared,
                            tracker=tracker,
                            state=state,
                            stop=stop,
                            concurrency=plan.concurrency,
                            show_progress=show_progress,
                            resume=True,
                        )
                    )
        except KeyboardInterrupt:  # stopped before the resume began: the sweep is as it was
            return SweepResult.stopped(state.sweep_id, output, "stopped before the resume began", stop.exit_code)
        finally:
            claim.release()


def _attach_shared(prepared: PreparedSweep, ray_address: str | None, settings: Settings) -> tuple[Tracker, SweepState]:
    """The tracker and state of a sweep whose Tune state lives on shared storage (found by its sweep id).

    Raises:
        InvalidInput: MLflow has no parent run for it.
    """
    spec, output, sweep_id, uri = prepared.spec, prepared.output, prepared.sweep_id, prepared.tracking_uri
    tracker = _tracker(uri, spec, sweep_id, prepared.fingerprint, settings)
    found = tracker.find_sweep()
    if found is None:
        raise InvalidInput(
            f"shared storage {prepared.storage_root} holds sweep '{sweep_id}' but MLflow at {uri} has no "
            "parent run for it"
        )
    experiment_id, parent_run_id = found
    tracker.attach_parent(experiment_id, parent_run_id)
    # the inputs were checked against the storage root's (sweeps.run.prepare): the same, or none recorded
    # there yet (a sweep started before they were), which are recorded now
    write_storage_binding(prepared.storage_root, sweep_id, _fingerprint(prepared), prepared.inputs)
    state = SweepState(
        sweep_id=sweep_id,
        fingerprint=prepared.fingerprint,
        tracking_uri=uri,
        experiment_id=experiment_id,
        parent_run_id=parent_run_id,
        data_path=resolve_data_path(spec),
        ray_address=ray_address,
        storage_root=prepared.storage_root,
        optuna_storage=optuna_storage_url(output, settings),
        inputs=prepared.inputs,
    )
    SpaceReserve(output).keep()
    _write_spec(output, spec)
    state.save(output)
    return tracker, state


def _execute_guarded(run: SweepRun) -> SweepResult:
    """:func:`~sweeps.run.execute.execute_sweep`, ending every MLflow run as FAILED if the sweep machinery
    itself crashes, and as STOPPED on a force-quit (see :class:`~sweeps.run.signals.StopSignals`)."""
    try:
        return execute_sweep(run)
    except KeyboardInterrupt:
        return _force_quit(run)
    except Exception as exc:
        error = _record_crash(run, exc)
        raise SweepFailed(error) from exc


def _record_crash(run: SweepRun, exc: Exception) -> str:
    """End the MLflow runs FAILED and write ``sweep.json`` FAILED with ``error`` (resumable); the error's line.

    A full disk (:func:`sweeps.files.out_of_space_cause`) is one line, not a traceback, and the output
    folder's :class:`~sweeps.files.SpaceReserve` is released first so that ``sweep.json`` can still say so.
    """
    output, state = run.output, run.state
    error = out_of_space_cause(exc, output)
    if error is None:
        log.exception("sweep crashed")
        error = f"sweep crashed: {type(exc).__name__}: {exc}"
    else:
        log.error("%s", error)
    SpaceReserve(output).release()
    try:
        run.tracker.finish(SweepStatus.FAILED, {}, None, message=error)
    except Exception as mlflow_exc:  # noqa: BLE001 - the crash is what must be recorded
        log.warning("could not end the MLflow runs: %s", mlflow_exc)
    state.status, state.error = SweepStatus.FAILED, error
    try:
        state.save(output)
    except WriteFailed as write_exc:
        log.error("could not record the crash in sweep.json: %s", write_exc)
    return error


def _force_quit(run: SweepRun) -> SweepResult:
    """End a sweep stopped by a second signal (or before Tune ran): every open MLflow run STOPPED,
    ``sweep.json`` STOPPED, no analysis; Tune's last snapshot and the trials' checkpoints stay for
    ``critbatch resume``."""
    run.stop.forced = True  # later signals are ignored while it quits
    message = "the sweep was force-quit before all trials finished: `critbatch resume` continues it"
    complete = run.tracker.finish(SweepStatus.STOPPED, {}, None, message=message, drain_s=FORCE_QUIT_DRAIN_S)
    run.state.status = SweepStatus.STOPPED
    run.state.mlflow_complete = complete
    run.state.save(run.output)
    return SweepResult.stopped(run.state.sweep_id, run.output, message, run.stop.exit_code or 130)


def _tracker(uri: str, spec: SweepSpec, sweep_id: str, fingerprint: str | None, settings: Settings) -> Tracker:
    """The sweep's :class:`~sweeps.tracking.base.Tracker` (MLflow on ``uri``, and any other sink ``settings``
    names; no run started yet)."""
    return build_tracker(
        SinkContext(
            tracking_uri=uri, spec=spec, sweep_id=sweep_id, fingerprint=fingerprint, drain_s=settings.mlflow_drain_s
        ),
        settings.tracking_sinks,
    )


def _write_spec(output: Path, spec: SweepSpec) -> None:
    """``OUT/spec.yaml``: the resolved spec a resume reads back (whole or not at all)."""
    write_atomic(output / "spec.yaml", yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
