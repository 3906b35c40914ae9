"""Run (or resume) a sweep: Ray, the Tune + Optuna search, MLflow runs, analysis and report.

Order of events, so that bad input leaves nothing behind: validate the spec and the data; refuse
an output folder of another sweep; connect Ray and check the trial bundle fits the cluster; only
then create the output folder, the MLflow parent run and the Optuna storage. The Tune run itself is
:mod:`sweeps.run.execute`, its end :mod:`sweeps.run.finish`, the state on disk :mod:`sweeps.run.state`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

from sweeps.errors import CritbatchError, InvalidInput, SweepFailed, WriteFailed
from sweeps.files import SpaceReserve, out_of_space_cause, write_atomic
from sweeps.run.claims import check_sweep_id_binding, claim_output_folder, lock_output_folder, write_storage_binding
from sweeps.run.cluster import cluster_shape, plan_resources, ray_session
from sweeps.run.execute import check_tune_state_readable, execute_sweep
from sweeps.run.preflight import (
    check_data_files,
    check_milestones,
    check_output_folder,
    check_optuna_storage,
    check_tracking_uri,
    resolve_data_path,
    resolve_paths,
    spec_warnings,
    window_warnings,
)
from sweeps.run.inputs import check_inputs_unchanged, pin_inputs
from sweeps.run.records import collect_records
from sweeps.run.signals import FORCE_QUIT_DRAIN_S, StopSignals
from sweeps.run.state import SweepState, optuna_storage_url, storage_root, tune_dir_of
from sweeps.run.workload import flops_accounting
from sweeps.spec import SweepSpec, parse_stored_spec
from sweeps.tracking import schema
from sweeps.spec.identity import is_valid_sweep_id, local_tracking_uri, run_sweep_id, tracking_uri_source
from sweeps.spec.statuses import FINISHED_STATUSES

__all__ = ["run_single_sweep", "resume_single_sweep", "prepare_sweep", "collect_records"]

log = logging.getLogger(__name__)


def run_single_sweep(
    spec: SweepSpec,
    output: Path,
    *,
    tracking_uri: str | None = None,
    sweep_id: str | None = None,
    ray_address: str | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run a whole sweep (a spec without ``arms``: the front door, :func:`sweeps.run.api.run_sweep`, routes a
    comparison to :mod:`sweeps.run.compare`) and write ``OUT/cbs.json`` and ``OUT/report.html``.

    The output folder is claimed atomically before anything starts (:func:`~sweeps.run.claims.claim_output_folder`);
    SIGINT and SIGTERM stop the sweep cleanly and resumably (:class:`~sweeps.run.signals.StopSignals`).

    Returns:
        ``{"ok", "status", "sweep_id", "cbs", "output", "message", "exit_code"}``; ``ok`` is False when
        the sweep FAILED (no trial completed, or the analysis could not run) or was STOPPED;
        ``exit_code`` is ``128 + signal`` when a signal stopped it, else None.

    Raises:
        InvalidInput: a batch size whose step passes several milestones (``sweeps.run.preflight.check_milestones``),
            bad data, a tracking URI MLflow would refuse, an output folder that cannot be
            created or holds (or is being claimed by) another sweep, a bad sweep id, a sweep id bound
            to another spec's fingerprint, resources that cannot fit the cluster. Nothing was created.
        CritbatchError: MLflow unreachable when the sweep starts (nothing is left behind either).
    """
    fingerprint = spec.fingerprint()  # of the spec as given: what the sweep id is bound to
    spec, output, sweep_id, uri, root = prepare_sweep(spec, output, tracking_uri, sweep_id, fingerprint)
    shared = root != str(output)

    with StopSignals() as stop:
        claim = claim_output_folder(output, sweep_id, fingerprint)  # exclusive: a second run exits 2
        started = False
        tracker = None
        try:
            with ray_session(ray_address, spec):
                stop.install()  # ray.init replaced the SIGTERM handler
                total, largest = cluster_shape()
                plan = plan_resources(spec, total, largest)
                if plan.warning:
                    log.warning(plan.warning)
                from sweeps.run.runners import sweep_runners

                # the runners' hosts import (seconds) while MLflow is set up; stopped when the sweep ends
                with sweep_runners(spec, sweep_id, concurrency=plan.concurrency, storage_path=root + "/train"):
                    if shared:
                        from ray import tune

                        if tune.Tuner.can_restore(tune_dir_of(root, sweep_id)):
                            # a retried job (e.g. a KubeRay RayJob) finds its own sweep's state on shared storage
                            tracker, state = _attach_shared(spec, output, sweep_id, uri, root, ray_address,
                                                            fingerprint)
                            started = True
                            log.warning("resuming sweep %s from %s", sweep_id, root)
                            return _execute_guarded(spec, output, tracker, state, plan.concurrency, show_progress,
                                                    resume=True, stop=stop)
                    tracker = _tracker(uri, spec, sweep_id, fingerprint)
                    state = _start(spec, output, tracker, uri=uri, root=root, ray_address=ray_address)
                    started = True
                    return _execute_guarded(spec, output, tracker, state, plan.concurrency, show_progress,
                                            resume=False, stop=stop)
        except KeyboardInterrupt:
            if started:
                raise
            # stopped before the sweep started: nothing to resume, so nothing is left behind
            return {"ok": False, "status": "STOPPED", "sweep_id": sweep_id, "cbs": None, "output": str(output),
                    "message": "stopped before the sweep started; nothing was kept", "exit_code": stop.exit_code}
        finally:
            if not started:
                _discard(output, tracker)
            claim.release(remove=not started)


def _start(spec: SweepSpec, output: Path, tracker, *, uri: str, root: str, ray_address: str | None) -> SweepState:
    """Create the sweep's MLflow parent run, bind a shared storage root to the sweep, write ``spec.yaml``
    and ``sweep.json``.

    Raises:
        CritbatchError: MLflow refused the parent run.
    """
    try:
        tracker.start_parent()
    except Exception as exc:  # noqa: BLE001
        raise CritbatchError(f"cannot create the sweep's MLflow run at {uri}: {exc}") from None
    if root != str(output):
        write_storage_binding(root, tracker.sweep_id, tracker.fingerprint)
    state = SweepState(sweep_id=tracker.sweep_id, fingerprint=tracker.fingerprint, tracking_uri=uri,
                       experiment_id=tracker.experiment_id, parent_run_id=tracker.parent_run_id,
                       data_path=resolve_data_path(spec), ray_address=ray_address, storage_root=root,
                       optuna_storage=optuna_storage_url(output), inputs=pin_inputs(spec))
    SpaceReserve(output).keep()  # room to record a crash on a full disk
    _write_spec(output, spec)
    state.save(output)
    return state


def _discard(output: Path, tracker) -> None:
    """Remove what a sweep that did not start made: its MLflow parent run and ``spec.yaml``."""
    if tracker is not None and tracker.parent_run_id:
        try:
            tracker.client.delete_run(tracker.parent_run_id)
        except Exception:  # noqa: BLE001
            log.warning("could not delete the MLflow run %s of the sweep that did not start", tracker.parent_run_id)
    (output / "spec.yaml").unlink(missing_ok=True)
    SpaceReserve(output).release()


def prepare_sweep(spec: SweepSpec, output: Path, tracking_uri: str | None, sweep_id: str | None,
             fingerprint: str) -> tuple[SweepSpec, Path, str, str, str]:
    """Every check that needs neither Ray nor a new file: ``(spec with paths resolved and budget planned,
    output folder, sweep id, tracking URI, storage root)``. A comparison runs it for each arm first.

    Raises:
        InvalidInput: see :func:`run_single_sweep`.
    """
    check_milestones(spec)
    facts = check_data_files(spec)
    for warning in spec_warnings(spec) + window_warnings(spec, facts):  # validate prints them too; a run should not hide them
        log.warning(warning)
    spec = _plan_budget(resolve_paths(spec))
    output = Path(output).expanduser().resolve()
    check_output_folder(output)
    sweep_id = sweep_id or run_sweep_id(spec.name)
    if not is_valid_sweep_id(sweep_id):
        raise InvalidInput(f"--sweep-id {sweep_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    uri = local_tracking_uri(spec, tracking_uri)
    check_tracking_uri(uri, source=tracking_uri_source(spec, tracking_uri))
    if os.environ.get("CRITBATCH_OPTUNA_STORAGE"):
        check_optuna_storage(os.environ["CRITBATCH_OPTUNA_STORAGE"], source="CRITBATCH_OPTUNA_STORAGE")
    root = storage_root(spec, output, sweep_id)
    check_sweep_id_binding(sweep_id, fingerprint, storage_root=root if root != str(output) else None,
                           mlflow_parents=_mlflow_parents(uri, spec.experiment_name, sweep_id),
                           optuna_storage=os.environ.get("CRITBATCH_OPTUNA_STORAGE"))
    return spec, output, sweep_id, uri, root


def resume_single_sweep(output: Path, *, ray_address: str | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Resume an interrupted sweep from ``OUT`` (``Tuner.restore``; Optuna study and MLflow runs kept); not a
    comparison (the front door, :func:`sweeps.run.api.resume_sweep`, routes one to :mod:`sweeps.run.compare`).

    Unfinished trials continue from their last checkpoint (every report it holds is sent again,
    so no milestone is lost); finished ones are not rerun.

    Raises:
        InvalidInput: ``OUT`` holds no sweep, one that never started or already finished, its spec
            no longer validates, an input it started with changed or is gone
            (:func:`sweeps.run.inputs.check_inputs_unchanged`), or another driver is running there.
    """
    output = Path(output).expanduser().resolve()
    check_output_folder(output, resuming=True)
    state = SweepState.load(output)
    spec = parse_stored_spec(yaml.safe_load((output / "spec.yaml").read_text()))
    if state.status in FINISHED_STATUSES and (output / "cbs.json").is_file() and not state.error:
        raise InvalidInput(f"sweep '{state.sweep_id}' in {output} already finished ({state.status})")
    check_inputs_unchanged(state.inputs, output)
    check_tune_state_readable(tune_dir_of(state.storage_root, state.sweep_id))
    check_optuna_storage(state.optuna_storage or optuna_storage_url(output), source=f"resume of {output}")
    with StopSignals() as stop:
        claim = lock_output_folder(output, state.sweep_id)  # a second driver on one folder exits 2
        try:
            with ray_session(ray_address or state.ray_address, spec):
                stop.install()  # ray.init replaced the SIGTERM handler
                total, largest = cluster_shape()
                plan = plan_resources(spec, total, largest)
                from sweeps.run.runners import sweep_runners

                with sweep_runners(spec, state.sweep_id, concurrency=plan.concurrency,
                                   storage_path=state.storage_root + "/train"):
                    tracker = _tracker(state.tracking_uri, spec, state.sweep_id, state.fingerprint)
                    SpaceReserve(output).keep()  # a full disk refuses the resume here, before anything changes
                    tracker.attach_parent(state.experiment_id, state.parent_run_id)
                    state.status, state.error = "RUNNING", None
                    state.save(output)
                    return _execute_guarded(spec, output, tracker, state, plan.concurrency, show_progress,
                                            resume=True, stop=stop)
        except KeyboardInterrupt:  # stopped before the resume began: the sweep is as it was
            return {"ok": False, "status": "STOPPED", "sweep_id": state.sweep_id, "cbs": None,
                    "output": str(output), "message": "stopped before the resume began", "exit_code": stop.exit_code}
        finally:
            claim.release()


def _attach_shared(spec, output, sweep_id, uri, root, ray_address, fingerprint):
    """The tracker and state of a sweep whose Tune state lives on shared storage (found by its sweep id).

    Raises:
        InvalidInput: MLflow has no parent run for it.
    """
    tracker = _tracker(uri, spec, sweep_id, fingerprint)
    exp = tracker.client.get_experiment_by_name(spec.experiment_name)
    parents = tracker.client.search_runs([exp.experiment_id], filter_string=(
        f"tags.`{schema.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{schema.TAG_ROLE}` = '{schema.ROLE_SWEEP}'")) if exp else []
    if not parents:
        raise InvalidInput(f"shared storage {root} holds sweep '{sweep_id}' but MLflow at {uri} has no parent run for it")
    tracker.attach_parent(exp.experiment_id, parents[0].info.run_id)
    state = SweepState(sweep_id=sweep_id, fingerprint=fingerprint, tracking_uri=uri, experiment_id=exp.experiment_id,
                       parent_run_id=parents[0].info.run_id, data_path=resolve_data_path(spec), ray_address=ray_address,
                       storage_root=root, optuna_storage=optuna_storage_url(output))
    SpaceReserve(output).keep()
    _write_spec(output, spec)
    state.save(output)
    return tracker, state


def _execute_guarded(spec: SweepSpec, output: Path, tracker, state: SweepState, concurrency: int, show_progress: bool,
                     *, resume: bool, stop: StopSignals) -> dict[str, Any]:
    """:func:`~sweeps.run.execute.execute_sweep`, ending every MLflow run as FAILED if the sweep machinery
    itself crashes, and as STOPPED on a force-quit (see :class:`~sweeps.run.signals.StopSignals`)."""
    try:
        return execute_sweep(spec, output, tracker, state, concurrency, show_progress, resume=resume, stop=stop)
    except KeyboardInterrupt:
        return _force_quit(output, tracker, state, stop)
    except Exception as exc:
        error = _record_crash(output, tracker, state, exc)
        raise SweepFailed(error) from exc


def _record_crash(output: Path, tracker, state: SweepState, exc: Exception) -> str:
    """End the MLflow runs FAILED and write ``sweep.json`` FAILED with ``error`` (resumable); the error's line.

    A full disk (:func:`sweeps.files.out_of_space_cause`) is one line, not a traceback, and the output
    folder's :class:`~sweeps.files.SpaceReserve` is released first so that ``sweep.json`` can still say so.
    """
    error = out_of_space_cause(exc, output)
    if error is None:
        log.exception("sweep crashed")
        error = f"sweep crashed: {type(exc).__name__}: {exc}"
    else:
        log.error("%s", error)
    SpaceReserve(output).release()
    try:
        tracker.finish("FAILED", {}, None, message=error)
    except Exception as mlflow_exc:  # noqa: BLE001 - the crash is what must be recorded
        log.warning("could not end the MLflow runs: %s", mlflow_exc)
    state.status, state.error = "FAILED", error
    try:
        state.save(output)
    except WriteFailed as write_exc:
        log.error("could not record the crash in sweep.json: %s", write_exc)
    return error


def _force_quit(output: Path, tracker, state: SweepState, stop: StopSignals) -> dict[str, Any]:
    """End a sweep stopped by a second signal (or before Tune ran): every open MLflow run STOPPED,
    ``sweep.json`` STOPPED, no analysis; Tune's last snapshot and the trials' checkpoints stay for
    ``critbatch resume``."""
    stop.forced = True  # later signals are ignored while it quits
    message = "the sweep was force-quit before all trials finished: `critbatch resume` continues it"
    complete = tracker.finish("STOPPED", {}, None, message=message, drain_s=FORCE_QUIT_DRAIN_S)
    state.status = "STOPPED"
    state.mlflow_complete = complete
    state.save(output)
    return {"ok": False, "status": "STOPPED", "sweep_id": state.sweep_id, "cbs": None, "output": str(output),
            "message": message, "exit_code": stop.exit_code or 130}


def _tracker(uri: str, spec: SweepSpec, sweep_id: str, fingerprint: str | None):
    """The sweep's MLflow :class:`~sweeps.tracking.writer.Tracker` on ``uri`` (no run started yet)."""
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.writer import Tracker, configure_mlflow_env

    configure_mlflow_env()
    return Tracker(MlflowClient(uri), spec, sweep_id, fingerprint=fingerprint)


def _write_spec(output: Path, spec: SweepSpec) -> None:
    """``OUT/spec.yaml``: the resolved spec a resume reads back (whole or not at all)."""
    write_atomic(output / "spec.yaml", yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))


def _plan_budget(spec: SweepSpec) -> SweepSpec:
    """The spec with the trials per batch size that fit ``budget.sweep_flops`` (unchanged without one).

    Raises:
        InvalidInput: the budget cannot pay for one full trial per batch size and seed.
    """
    if spec.budget.sweep_flops is None:
        return spec
    from sweeps.search.budget import apply_plan, plan_trials

    plan = plan_trials(spec, flops_accounting(spec)[0])
    if plan.reduced:
        log.warning("budget.sweep_flops %.3g fits %d trial(s) per batch size (the spec asks for %d): planning %d trials",
                    spec.budget.sweep_flops, plan.trials_per_batch_size, spec.search.trials_per_batch_size, plan.n_trials)
    return apply_plan(spec, plan)


def _mlflow_parents(uri: str, experiment: str, sweep_id: str) -> list[tuple[str, str | None]]:
    """``(run id, critbatch.fingerprint tag)`` of the MLflow parent runs of a sweep id; [] when the store
    does not exist yet or cannot be read (starting the parent run then says why)."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):].split("?", 1)[0]).is_file():
        return []
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.writer import configure_mlflow_env

    configure_mlflow_env()
    try:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        runs = client.search_runs([exp.experiment_id], filter_string=(
            f"tags.`{schema.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{schema.TAG_ROLE}` = '{schema.ROLE_SWEEP}'"))
    except Exception:  # noqa: BLE001
        return []
    return [(r.info.run_id, r.data.tags.get(schema.TAG_FINGERPRINT)) for r in runs]
