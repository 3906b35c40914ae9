"""Run (or resume) a sweep: Ray, the Tune + Optuna search, MLflow runs, analysis and report.

Order of events, so that bad input leaves nothing behind: validate the spec and the data; refuse
an output folder of another sweep; connect Ray and check the trial bundle fits the cluster; only
then create the output folder, the MLflow parent run and the Optuna storage.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from sweeps.spec.identity import is_valid_sweep_id, local_tracking_uri, tracking_uri_source
from sweeps.errors import CritbatchError, InvalidInput, SweepFailed
from sweeps.run.workload import flops_accounting, tokens_per_sequence
from sweeps.run.claims import check_sweep_id_binding, claim_output_folder, lock_output_folder, write_storage_binding
from sweeps.run.preflight import (
    check_data_files,
    check_output_folder,
    check_tracking_uri,
    plan_resources,
    resolve_data_path,
    resolve_paths,
)
from sweeps.spec import SweepSpec, parse_spec

__all__ = ["run_sweep", "resume_sweep", "collect_records"]

log = logging.getLogger(__name__)

#: Ray Train's controller polls workers this often; reports block until polled (ray-notes.md).
HEALTH_CHECK_INTERVAL_S = "0.1"
#: MLflow writes a force-quit still waits for (seconds); a clean stop waits CRITBATCH_MLFLOW_DRAIN_S
FORCE_QUIT_DRAIN_S = 15.0


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (``kill``, ``ray job stop``, Kubernetes) stop a sweep cleanly.

    The first signal asks Tune to end its run (Tune's own interrupt, reached through its SIGUSR1
    handler): Tune snapshots the experiment, in which the running trials stay unfinished, each with
    its last milestone checkpoint, and stops them; the driver then ends every MLflow run
    ``STOPPED``, writes ``sweep.json`` ``STOPPED`` and the CLI exits ``128 + signal`` (130, 143), so
    that ``critbatch resume OUT`` continues the sweep. Ray Tune's own SIGINT handler is turned off
    (``TUNE_DISABLE_SIGINT_HANDLER``): it made ``fit()`` return normally, and an interrupted sweep was
    reported ``SUCCEEDED``. A second signal force-quits (``KeyboardInterrupt`` wherever the driver
    is): no analysis, the runs are still ended ``STOPPED`` (waiting at most
    :data:`FORCE_QUIT_DRAIN_S` for MLflow), and the sweep resumes from Tune's last snapshot (taken
    every ``TUNE_GLOBAL_CHECKPOINT_S``). Later signals are ignored while it quits.

    Handlers are installed in the main thread only (elsewhere Python refuses them), and again by
    :meth:`install` after ``ray.init``, which sets a SIGTERM handler of its own (``sys.exit``).

    Attributes:
        signum: the first signal received, or None.
        forced: a ``KeyboardInterrupt`` was raised (force-quit, or a stop before Tune ran).
        tune_running: set by the driver around ``Tuner.fit()``.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.forced = False
        self.tune_running = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        return self.install()

    def install(self) -> "StopSignals":
        """(Re)install the handlers; the ones found first are restored on exit."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.signal(sig, self._on_signal)
                self._old.setdefault(sig, old)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()
        return False

    @property
    def exit_code(self) -> int | None:
        """``128 + signal`` once a signal arrived (the shell's convention: 130 for SIGINT, 143 for SIGTERM)."""
        return None if self.signum is None else 128 + int(self.signum)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.forced:
            log.warning("%s: already quitting", name)
            return
        if self.signum is not None:
            self.forced = True
            log.warning("%s again: force-quitting; `critbatch resume` continues from Tune's last snapshot", name)
            raise KeyboardInterrupt
        self.signum = signum
        tune_interrupt = signal.getsignal(signal.SIGUSR1)
        if self.tune_running and getattr(tune_interrupt, "__name__", "") == "signal_interrupt_tune_run":
            log.warning("%s: stopping the sweep cleanly (trials keep their last checkpoint; `critbatch resume` "
                        "continues it); send it again to force-quit", name)
            tune_interrupt(signum, frame)  # Tune ends fit() after one last experiment snapshot
            return
        self.forced = True
        log.warning("%s: stopping the sweep", name)
        raise KeyboardInterrupt


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
            f"tags.`critbatch.sweep_id` = '{sweep_id}' and tags.`critbatch.role` = 'sweep'"))
    except Exception:  # noqa: BLE001
        return []
    return [(r.info.run_id, r.data.tags.get("critbatch.fingerprint")) for r in runs]


def storage_root(spec: SweepSpec, output: Path, sweep_id: str) -> str:
    """Where Tune and Train keep this sweep's state: ``resources.storage_path`` or
    ``CRITBATCH_STORAGE_PATH`` (plus ``/<sweep id>``), else the output folder."""
    base = spec.resources.storage_path or os.environ.get("CRITBATCH_STORAGE_PATH")
    if not base:
        return str(output)
    return base.rstrip("/") + "/" + sweep_id


def tune_experiment_dir(root: str, sweep_id: str) -> str:
    """The sweep's Tune experiment folder: ``ROOT/tune/<sweep id>`` (the Tune run is named by the sweep id).

    Ray stages an experiment's files on the driver node under ``<session>/artifacts/<start
    second>/<run name>/`` and syncs that whole folder to the run's storage: two sweeps on one
    cluster that started in the same second under one run name would share it, and each would
    read (and resume) the other's trials.
    """
    return f"{root}/tune/{sweep_id}"


def _tune_dir_of(root: str, sweep_id: str) -> str:
    """:func:`tune_experiment_dir`, or ``ROOT/tune`` for a sweep started before runs were named by sweep id."""
    legacy = f"{root}/tune"
    if not Path(tune_experiment_dir(root, sweep_id)).exists() and Path(legacy, "tuner.pkl").is_file():
        return legacy
    return tune_experiment_dir(root, sweep_id)


def optuna_storage_url(output: Path) -> str:
    """``CRITBATCH_OPTUNA_STORAGE`` (an RDB URL that outlives the cluster), else ``sqlite:///OUT/optuna.db``."""
    return os.environ.get("CRITBATCH_OPTUNA_STORAGE") or f"sqlite:///{output / 'optuna.db'}"


def _init_ray(address: str | None, spec: SweepSpec) -> bool:
    """Connect to a cluster (``address`` or ``RAY_ADDRESS``) or start one in-process.

    Returns True if this call started Ray (and so must shut it down).
    """
    import ray

    env = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": HEALTH_CHECK_INTERVAL_S, "TOKENIZERS_PARALLELISM": "false"}
    os.environ.update(env)
    # Tune snapshots the experiment (trials, searcher) this often: what a killed driver can lose
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": env}
    addr = address or os.environ.get("RAY_ADDRESS")
    if addr:
        ray.init(address=addr, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
        return True
    # Local: the trials' Tune drivers mostly wait on their Train workers, so one extra logical CPU
    # lets `max_concurrent_trials` workers use every core (ray-notes.md: a trainable needs a
    # non-empty resource request of its own).
    r = spec.resources
    cpus = os.cpu_count() or 1
    extra = 1 if r.trial_driver_cpus * r.max_concurrent_trials <= 1 else int(
        -(-r.trial_driver_cpus * r.max_concurrent_trials // 1))
    # one actor process less per trial: a local machine is not preempted by a cloud provider
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=cpus + extra, include_dashboard=True, runtime_env=runtime_env, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=True)
            return True
        except Exception as exc:  # noqa: BLE001 - Ray's own startup timeout on an overloaded machine
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            log.warning("Ray did not start in time (%s); retrying", exc)
            ray.shutdown()
    return True


def _cluster_shape() -> tuple[dict[str, float], dict[str, float]]:
    import ray

    total = {k: float(v) for k, v in ray.cluster_resources().items()}
    largest: dict[str, float] = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        if res.get("CPU", 0) >= largest.get("CPU", 0):
            largest = {k: float(v) for k, v in res.items()}
    return total, largest


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default))
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, float):
        return None
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _finite(o: Any) -> Any:
    """Replace non-finite floats by None, recursively (JSON has no NaN or Infinity)."""
    from sweeps.analysis.fit import finite_json

    return finite_json(o)


def run_sweep(
    spec: SweepSpec,
    output: Path,
    *,
    tracking_uri: str | None = None,
    sweep_id: str | None = None,
    ray_address: str | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run a whole sweep and write ``OUT/cbs.json`` and ``OUT/report.html``.

    The output folder is claimed atomically before anything starts (:func:`claim_output_folder`);
    SIGINT and SIGTERM stop the sweep cleanly and resumably (:class:`StopSignals`).

    Returns:
        ``{"ok", "status", "sweep_id", "cbs", "output", "message", "exit_code"}``; ``ok`` is False when
        the sweep FAILED (no trial completed, or the analysis could not run) or was STOPPED;
        ``exit_code`` is ``128 + signal`` when a signal stopped it, else None.

    Raises:
        InvalidInput: bad data, a tracking URI MLflow would refuse, an output folder that cannot be
            created or holds (or is being claimed by) another sweep, a bad sweep id, a sweep id bound
            to another spec's fingerprint, resources that cannot fit the cluster. Nothing was created.
        CritbatchError: MLflow unreachable when the sweep starts (nothing is left behind either).
    """
    fingerprint = spec.fingerprint()  # of the spec as given: what the sweep id is bound to
    check_data_files(spec)
    spec = _plan_budget(resolve_paths(spec))
    output = Path(output).expanduser().resolve()
    check_output_folder(output)
    # the random tail keeps two runs of one spec started in the same second apart (MLflow, Ray staging)
    sweep_id = sweep_id or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    if not is_valid_sweep_id(sweep_id):
        raise InvalidInput(f"--sweep-id {sweep_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    uri = local_tracking_uri(spec, tracking_uri)
    check_tracking_uri(uri, source=tracking_uri_source(spec, tracking_uri))
    root = storage_root(spec, output, sweep_id)
    shared = root != str(output)
    check_sweep_id_binding(sweep_id, fingerprint, storage_root=root if shared else None,
                           mlflow_parents=_mlflow_parents(uri, spec.experiment_name, sweep_id),
                           optuna_storage=os.environ.get("CRITBATCH_OPTUNA_STORAGE"))

    with StopSignals() as stop:
        claim = claim_output_folder(output, sweep_id, fingerprint)  # exclusive: a second run exits 2
        started = False
        tracker = None
        try:
            started_ray = _init_ray(ray_address, spec)
            stop.install()  # ray.init replaced the SIGTERM handler
            try:
                total, largest = _cluster_shape()
                plan = plan_resources(spec, total, largest)
                if plan.warning:
                    log.warning(plan.warning)
                if shared:
                    from ray import tune

                    if tune.Tuner.can_restore(_tune_dir_of(root, sweep_id)):
                        # a retried job (e.g. a KubeRay RayJob) finds its own sweep's state on shared storage
                        tracker, state = _attach_shared(spec, output, sweep_id, uri, root, ray_address, fingerprint)
                        started = True
                        log.warning("resuming sweep %s from %s", sweep_id, root)
                        return _execute_guarded(spec, output, tracker, state, plan.concurrency, show_progress,
                                                resume=True, stop=stop)
                from mlflow.tracking import MlflowClient

                from sweeps.tracking.writer import Tracker, configure_mlflow_env

                configure_mlflow_env()
                tracker = Tracker(MlflowClient(uri), spec, sweep_id, fingerprint=fingerprint)
                try:
                    tracker.start_parent()
                except Exception as exc:  # noqa: BLE001
                    raise CritbatchError(f"cannot create the sweep's MLflow run at {uri}: {exc}") from None
                if shared:
                    write_storage_binding(root, sweep_id, fingerprint)
                state = {
                    "sweep_id": sweep_id,
                    "fingerprint": fingerprint,
                    "tracking_uri": uri,
                    "experiment_id": tracker.experiment_id,
                    "parent_run_id": tracker.parent_run_id,
                    "data_path": resolve_data_path(spec),
                    "ray_address": ray_address,
                    "storage_root": root,
                    "optuna_storage": optuna_storage_url(output),
                    "status": "RUNNING",
                    "created": time.time(),
                }
                (output / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
                _write_json(output / "sweep.json", state)
                started = True
                return _execute_guarded(spec, output, tracker, state, plan.concurrency, show_progress, resume=False,
                                        stop=stop)
            finally:
                if started_ray:
                    import ray

                    ray.shutdown()
        except KeyboardInterrupt:
            if started:
                raise
            # stopped before the sweep started: nothing to resume, so nothing is left behind
            return {"ok": False, "status": "STOPPED", "sweep_id": sweep_id, "cbs": None, "output": str(output),
                    "message": "stopped before the sweep started; nothing was kept", "exit_code": stop.exit_code}
        finally:
            if not started and tracker is not None and tracker.parent_run_id:
                try:
                    tracker.client.delete_run(tracker.parent_run_id)
                except Exception:  # noqa: BLE001
                    log.warning("could not delete the MLflow run %s of the sweep that did not start",
                                tracker.parent_run_id)
            if not started:
                for name in ("spec.yaml",):
                    (output / name).unlink(missing_ok=True)
            claim.release(remove=not started)


def resume_sweep(output: Path, *, ray_address: str | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Resume an interrupted sweep from ``OUT`` (``Tuner.restore``; Optuna study and MLflow runs kept).

    Unfinished trials continue from their last checkpoint (every report it holds is sent again,
    so no milestone is lost); finished ones are not rerun.

    Raises:
        InvalidInput: ``OUT`` holds no sweep, one that never started or already finished, its spec
            no longer validates, or another driver is running there.
    """
    output = Path(output).expanduser().resolve()
    check_output_folder(output, resuming=True)
    state = json.loads((output / "sweep.json").read_text())
    if state.get("status") == "STARTING" or "parent_run_id" not in state:
        raise InvalidInput(f"sweep '{state.get('sweep_id', '?')}' in {output} never started (its driver died while "
                           f"starting): nothing to resume; `critbatch run SPEC --output {output}` starts it again")
    spec = parse_spec(yaml.safe_load((output / "spec.yaml").read_text()))
    if state.get("status") in ("SUCCEEDED", "FAILED") and (output / "cbs.json").is_file():
        raise InvalidInput(f"sweep '{state['sweep_id']}' in {output} already finished ({state['status']})")
    with StopSignals() as stop:
        claim = lock_output_folder(output, state["sweep_id"])  # a second driver on one folder exits 2
        try:
            started_ray = _init_ray(ray_address or state.get("ray_address"), spec)
            stop.install()  # ray.init replaced the SIGTERM handler
            try:
                total, largest = _cluster_shape()
                plan = plan_resources(spec, total, largest)
                from mlflow.tracking import MlflowClient

                from sweeps.tracking.writer import Tracker, configure_mlflow_env

                configure_mlflow_env()
                tracker = Tracker(MlflowClient(state["tracking_uri"]), spec, state["sweep_id"],
                                  fingerprint=state.get("fingerprint"))
                tracker.attach_parent(state["experiment_id"], state["parent_run_id"])
                state["status"] = "RUNNING"
                _write_json(output / "sweep.json", state)
                return _execute_guarded(spec, output, tracker, state, plan.concurrency, show_progress, resume=True,
                                        stop=stop)
            finally:
                if started_ray:
                    import ray

                    ray.shutdown()
        except KeyboardInterrupt:  # stopped before the resume began: the sweep is as it was
            return {"ok": False, "status": "STOPPED", "sweep_id": state["sweep_id"], "cbs": None,
                    "output": str(output), "message": "stopped before the resume began", "exit_code": stop.exit_code}
        finally:
            claim.release()


def _attach_shared(spec, output, sweep_id, uri, root, ray_address, fingerprint):
    """The tracker and state of a sweep whose Tune state lives on shared storage (found by its sweep id).

    Raises:
        InvalidInput: MLflow has no parent run for it.
    """
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.writer import Tracker, configure_mlflow_env

    configure_mlflow_env()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(spec.experiment_name)
    parents = client.search_runs([exp.experiment_id], filter_string=(
        f"tags.`critbatch.sweep_id` = '{sweep_id}' and tags.`critbatch.role` = 'sweep'")) if exp else []
    if not parents:
        raise InvalidInput(f"shared storage {root} holds sweep '{sweep_id}' but MLflow at {uri} has no parent run for it")
    tracker = Tracker(client, spec, sweep_id, fingerprint=fingerprint)
    tracker.attach_parent(exp.experiment_id, parents[0].info.run_id)
    state = {"sweep_id": sweep_id, "fingerprint": fingerprint, "tracking_uri": uri, "experiment_id": exp.experiment_id,
             "parent_run_id": parents[0].info.run_id, "data_path": resolve_data_path(spec), "ray_address": ray_address,
             "storage_root": root, "optuna_storage": optuna_storage_url(output), "status": "RUNNING",
             "created": time.time()}
    (output / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    _write_json(output / "sweep.json", state)
    return tracker, state


def _execute_guarded(spec, output, tracker, state, concurrency, show_progress, *, resume, stop: StopSignals):
    """:func:`_execute`, ending every MLflow run as FAILED if the sweep machinery itself crashes, and as
    STOPPED on a force-quit (see :class:`StopSignals`)."""
    try:
        return _execute(spec, output, tracker, state, concurrency, show_progress, resume=resume, stop=stop)
    except KeyboardInterrupt:
        return _force_quit(output, tracker, state, stop)
    except Exception as exc:
        log.exception("sweep crashed")
        tracker.finish("FAILED", {}, None, message=f"sweep crashed: {exc}")
        state["status"] = "FAILED"
        _write_json(output / "sweep.json", state)
        raise SweepFailed(f"sweep crashed: {exc}") from exc


def _force_quit(output: Path, tracker, state: dict, stop: StopSignals) -> dict[str, Any]:
    """End a sweep stopped by a second signal (or before Tune ran): every open MLflow run STOPPED,
    ``sweep.json`` STOPPED, no analysis; Tune's last snapshot and the trials' checkpoints stay for
    ``critbatch resume``."""
    stop.forced = True  # later signals are ignored while it quits
    message = "the sweep was force-quit before all trials finished: `critbatch resume` continues it"
    complete = tracker.finish("STOPPED", {}, None, message=message, drain_s=FORCE_QUIT_DRAIN_S)
    state["status"] = "STOPPED"
    state["mlflow_complete"] = complete
    _write_json(output / "sweep.json", state)
    return {"ok": False, "status": "STOPPED", "sweep_id": state["sweep_id"], "cbs": None, "output": str(output),
            "message": message, "exit_code": stop.exit_code or 130}


def _execute(spec: SweepSpec, output: Path, tracker, state: dict, concurrency: int, show_progress: bool,
             *, resume: bool, stop: StopSignals) -> dict[str, Any]:
    from ray import tune

    from sweeps.run.progress import ProgressCallback
    from sweeps.search.searcher import BatchSizeSearcher
    from sweeps.tracking.writer import MlflowTrialCallback
    from sweeps.run.trainable import batch_plan_params, make_trainable

    root = state.get("storage_root") or str(output)
    save_root = str(output / "checkpoints") if spec.tracking.checkpoint_artifact_max_mb > 0 and root == str(output) else (
        root + "/checkpoints" if spec.tracking.checkpoint_artifact_max_mb > 0 else None)
    pause_mode = spec.pruning.enabled and spec.pruning.mode == "pause"
    gate_prefix = f"critbatch-rung-gate/{state['sweep_id']}" if pause_mode else None
    # A trial that Tune stops before its end (paused or pruned at a rung, cut by a budget) is still inside
    # TorchTrainer.fit() (in mode pause its workers wait at the rung gate): Tune's graceful stop waits up to
    # TUNE_FORCE_TRIAL_CLEANUP_S (600 s) before killing its actor, which holds its CPUs meanwhile, and the
    # next trials wait for them (seen: a 7-batch-size pause-mode sweep stalled). Kill it within seconds.
    os.environ.setdefault("TUNE_FORCE_TRIAL_CLEANUP_S", "5")
    trainable = make_trainable(spec, data_path=state["data_path"], storage_path=root + "/train", save_dir_root=save_root,
                               rung_gate_prefix=gate_prefix)
    progress = ProgressCallback(spec.n_trials, list(spec.search.batch_sizes_sequences), concurrency, enabled=show_progress)
    c_tok, convention = flops_accounting(spec)
    mlflow_cb = MlflowTrialCallback(tracker, lambda cfg: {
        **batch_plan_params(spec, int(cfg["batch_size_sequences"])), "flops_per_token": c_tok, "flops_convention": convention})
    callbacks = [mlflow_cb, progress]
    scheduler = _scheduler(spec)
    from sweeps.pruning.scheduler import PlacementGroupReaper, PruningAnnotator

    if scheduler is not None:
        callbacks.insert(0, PruningAnnotator(scheduler))  # first: writes decisions into each result
    callbacks.append(PlacementGroupReaper())  # frees the workers of trials stopped mid-fit (pruned, budget, stop)
    from sweeps.tracking.writer import ReportLog

    callbacks.append(ReportLog(output / REPORTS_DIR))  # last: sees each result as annotated by the others
    stopper = None
    if spec.budget.sweep_flops is not None:
        from sweeps.search.budget import SweepBudgetStopper

        stopper = SweepBudgetStopper(spec.budget.sweep_flops)
    if scheduler is not None:
        scheduler.gate_prefix = gate_prefix
    if scheduler is not None and root == str(output):
        scheduler.state_path = str(output / PRUNED_WHILE_PAUSED)
        if resume and (output / PRUNED_WHILE_PAUSED).is_file():
            scheduler.pruned_while_paused.update(json.loads((output / PRUNED_WHILE_PAUSED).read_text()))
    if resume and root == str(output):  # neither is in Tune's experiment checkpoint: rebuild from the trials so far
        past = collect_records(output, spec, sweep_id=state["sweep_id"])
        if scheduler is not None:
            for r in past:
                scheduler.observe(r.trial_id, r.batch_size_sequences, r.tokens, r.flops, r.val_loss,
                                  ended=r.status in ("COMPLETED", "DIVERGED", "PRUNED", "FAILED"), pruning=r.pruning)
            if scheduler.mode == "pause":
                scheduler.restore_decisions()
                for r in past:
                    if r.status == "FAILED":  # Tune.restore(resume_errored=True) retries it
                        scheduler.reopen(r.trial_id)
        if stopper is not None:
            stopper.base_flops = sum(r.flops[-1] for r in past if r.flops)
    t0 = time.monotonic()
    # StopSignals turns SIGINT into Tune's interrupt itself; Tune's SIGINT handler would hide it (fit() returns)
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    grid = None
    tune_dir = _tune_dir_of(root, state["sweep_id"])
    try:
        if resume and tune.Tuner.can_restore(tune_dir):
            tuner = tune.Tuner.restore(tune_dir, trainable=trainable, resume_unfinished=True,
                                       resume_errored=True)
            tuner._local_tuner._run_config.callbacks = callbacks  # callbacks hold live clients: re-attach
            tuner._local_tuner._run_config.stop = stopper
            tuner._local_tuner._tune_config.scheduler = scheduler  # the one its annotator is bound to
            if scheduler is not None and scheduler.mode == "pause":
                _searcher_of(tuner._local_tuner._tune_config.search_alg).scheduler = scheduler
        else:
            searcher = BatchSizeSearcher(spec, storage_url=state.get("optuna_storage") or optuna_storage_url(output),
                                         study_prefix=state["sweep_id"], fingerprint=state.get("fingerprint"))
            pause = scheduler is not None and scheduler.mode == "pause"
            if pause:  # the scheduler gates new trials: Tune's limiter would count the paused ones and deadlock
                searcher.scheduler = scheduler
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(
                    search_alg=searcher,
                    scheduler=scheduler,
                    num_samples=spec.n_trials,
                    max_concurrent_trials=None if pause else concurrency,
                    reuse_actors=False,
                    time_budget_s=spec.budget.wall_clock_s,
                ),
                run_config=tune.RunConfig(name=state["sweep_id"], storage_path=root + "/tune",  # tune_experiment_dir
                                          callbacks=callbacks, verbose=0, stop=stopper,
                                          failure_config=tune.FailureConfig(max_failures=0)),
            )
        stop.tune_running = True
        grid = tuner.fit()
    finally:
        stop.tune_running = False
        progress.close()

    records = collect_records(output, spec, sweep_id=state["sweep_id"]) if root == str(output) else records_from_grid(grid)
    note = ""
    if stopper is not None and stopper.exhausted:
        note = f"the sweep's FLOP budget ({spec.budget.sweep_flops:.3g}) ran out"
    elif spec.budget.wall_clock_s is not None and time.monotonic() - t0 >= spec.budget.wall_clock_s:
        note = f"the sweep's wall-clock budget ({spec.budget.wall_clock_s:g} s) ran out"
    try:
        return _finish(spec, output, tracker, state, records, stopped=stop.signum is not None, budget_note=note,
                       exit_code=stop.exit_code)
    except KeyboardInterrupt:  # a second signal while the stopped sweep was being analysed
        return _force_quit(output, tracker, state, stop)


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


def _searcher_of(search_alg):
    """The :class:`BatchSizeSearcher` inside Tune's wrappers (``SearchGenerator``, ``ConcurrencyLimiter``)."""
    s = search_alg
    while s is not None and not hasattr(s, "exhausted"):
        s = getattr(s, "searcher", None)
    if s is None:
        raise RuntimeError(f"no BatchSizeSearcher inside {search_alg!r}")
    return s


def _scheduler(spec: SweepSpec):
    if not spec.pruning.enabled:
        return None
    from sweeps.pruning.scheduler import EqualComputeScheduler

    return EqualComputeScheduler.from_spec(spec)


#: trials pruned while paused at a rung (``pruning.mode: pause``): ``{trial id: the scheduler's annotation}``.
#: Their last Tune report is the rung they waited at, so result.json alone cannot say they were pruned.
PRUNED_WHILE_PAUSED = "pruned_while_paused.json"


#: ``OUT/reports/<trial id>.jsonl``: every report Tune received for a trial, across restarts (:class:`sweeps.tracking.writer.ReportLog`)
REPORTS_DIR = "reports"


def _json_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON Lines file, skipping torn lines; [] if it does not exist."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    return rows


def _trial_id_from_dir(name: str) -> str:
    """Tune names a trial's folder ``run_trial_<trial id>_<index>_<params>_<date>``."""
    m = re.match(r"run_trial_([^_]+)_", name)
    return m.group(1) if m else name


def collect_records(output: Path, spec: SweepSpec, *, sweep_id: str | None = None) -> list:
    """Every trial's config, status and milestone curve, read from the sweep's own Tune experiment folder.

    Reads ``params.json`` and the reports of ``OUT/tune/<sweep id>/*/result.json`` and
    ``OUT/reports/<trial id>.jsonl`` (one JSON line per report, every restart included:
    :class:`sweeps.tracking.writer.ReportLog`), so that it works the same after a resume as after an uninterrupted run; no
    other sweep's folder is read.

    Args:
        sweep_id: the sweep's id; default the one in ``OUT/sweep.json``.
    """
    from sweeps.analysis.fit import TrialRecord

    records = []
    if sweep_id is None:
        sweep_file = output / "sweep.json"
        if not sweep_file.is_file():
            return records
        sweep_id = json.loads(sweep_file.read_text())["sweep_id"]
    tune_dir = Path(_tune_dir_of(str(output), sweep_id))
    if not tune_dir.is_dir():
        return records
    pruned_file = output / PRUNED_WHILE_PAUSED
    pruned_while_paused = json.loads(pruned_file.read_text()) if pruned_file.is_file() else {}
    for d in sorted(p for p in tune_dir.iterdir() if p.is_dir()):
        params_file, result_file = d / "params.json", d / "result.json"
        if not params_file.is_file():
            continue
        cfg = json.loads(params_file.read_text())
        rows = _json_lines(result_file)
        trial_id = rows[-1]["trial_id"] if rows and "trial_id" in rows[-1] else _trial_id_from_dir(d.name)
        # every report across the trial's restarts: result.json holds only some after a restore
        rows += _json_lines(output / REPORTS_DIR / f"{trial_id}.jsonl")
        # keep one row per tokens value (a restarted worker group may report a milestone twice)
        by_tokens: dict[int, dict] = {}
        for r in rows:
            if "tokens_seen" in r:
                by_tokens[int(r["tokens_seen"])] = r
        curve = [by_tokens[k] for k in sorted(by_tokens)]
        last = curve[-1] if curve else {}
        has_error = (d / "error.txt").is_file() or (d / "error.pkl").is_file()
        if trial_id in pruned_while_paused:  # its last report is the rung it waited at (pruning.mode: pause)
            last = {**last, **pruned_while_paused[trial_id]}
            if curve:
                curve[-1] = last
        if last.get("pruned"):
            status = "PRUNED"
        elif last.get("status") == "diverged":
            status = "DIVERGED"
        elif last.get("done") and not has_error:
            status = "COMPLETED"
        elif has_error:
            status = "FAILED"
        else:
            status = "STOPPED"
        hp = {k: cfg.get(k) for k in ("lr_rule", "lr_multiplier", "lr", "beta2", "beta2_half_life_tokens")}
        records.append(TrialRecord(
            trial_id=trial_id,
            batch_size_sequences=int(cfg["batch_size_sequences"]),
            seed=int(cfg["seed"]),
            group_id=str(cfg.get("group_id", trial_id)),
            status=status,
            hyperparameters=hp,
            tokens=[float(r["tokens_seen"]) for r in curve],
            val_loss=[float(r["val_loss"]) if r.get("val_loss") is not None else float("nan") for r in curve],
            flops=[float(r.get("flops", 0.0)) for r in curve],
            b_simple=[r.get("b_simple") for r in curve],
            pruning=_pruning_of(last),
        ))
    return records


def _best_checkpoint(spec: SweepSpec, output: Path, analysis: dict) -> Path | None:
    """Copy the best trial's Hugging Face checkpoint to ``OUT/best_checkpoint``; return it if it is
    small enough (``tracking.checkpoint_artifact_max_mb``) to log as an MLflow artifact."""
    rows = [r for r in analysis.get("per_batch") or [] if r.get("loss_at_budget") is not None]
    if not rows or spec.tracking.checkpoint_artifact_max_mb <= 0:
        return None
    best = min(rows, key=lambda r: r["loss_at_budget"])
    for tid in best["trial_ids_at_budget"]:
        src = output / "checkpoints" / tid
        if src.is_dir():
            dst = output / "best_checkpoint"
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
            (dst / "critbatch.json").write_text(json.dumps(
                {"trial_id": tid, "batch_size_sequences": best["batch_size_sequences"],
                 "loss_at_budget": best["loss_at_budget"], "config": best["best_config_at_budget"]}, indent=2))
            size_mb = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file()) / 2**20
            analysis["best_checkpoint"] = {"path": str(dst), "trial_id": tid, "size_mb": size_mb}
            if size_mb <= spec.tracking.checkpoint_artifact_max_mb:
                return dst
            log.warning("best checkpoint is %.1f MB, over tracking.checkpoint_artifact_max_mb: not logged to MLflow", size_mb)
            return None
    return None


def _pruning_of(row: dict) -> dict[str, Any]:
    """The equal-compute scheduler's keys (``RESULT_KEYS``) of a result row, without the missing ones."""
    from sweeps.pruning.scheduler import RESULT_KEYS

    return {k: row[k] for k in RESULT_KEYS if row.get(k) is not None and row.get(k) == row.get(k)}


def records_from_grid(grid) -> list:
    """Trial records from a Tune ``ResultGrid`` (used when the Tune state lives on remote storage)."""
    from sweeps.analysis.fit import TrialRecord

    out = []
    if grid is None:
        return out
    for res in grid:
        df = res.metrics_dataframe
        rows = df.to_dict("records") if df is not None else []
        by_tokens = {int(r["tokens_seen"]): r for r in rows if r.get("tokens_seen") == r.get("tokens_seen") and "tokens_seen" in r}
        curve = [by_tokens[k] for k in sorted(by_tokens)]
        last = curve[-1] if curve else {}
        cfg = res.config or {}
        if (res.metrics or {}).get("pruned") and not last.get("pruned"):  # pruned while paused
            last = {**last, **_pruning_of(res.metrics)}
            if curve:
                curve[-1] = last
        if last.get("pruned"):
            status = "PRUNED"
        elif last.get("status") == "diverged":
            status = "DIVERGED"
        elif last.get("done") and res.error is None:
            status = "COMPLETED"
        else:
            status = "FAILED" if res.error is not None else "STOPPED"
        tid = str((res.metrics or {}).get("trial_id") or Path(res.path).name)
        out.append(TrialRecord(
            trial_id=tid, batch_size_sequences=int(cfg["batch_size_sequences"]), seed=int(cfg["seed"]),
            group_id=str(cfg.get("group_id", tid)), status=status,
            hyperparameters={k: cfg.get(k) for k in ("lr_rule", "lr_multiplier", "lr", "beta2", "beta2_half_life_tokens")},
            tokens=[float(r["tokens_seen"]) for r in curve],
            val_loss=[float(r["val_loss"]) if r.get("val_loss") is not None else float("nan") for r in curve],
            flops=[float(r.get("flops", 0.0)) for r in curve], b_simple=[r.get("b_simple") for r in curve],
            pruning=_pruning_of(last)))
    return out


def _finish(spec: SweepSpec, output: Path, tracker, state: dict, records: list, *, stopped: bool,
            budget_note: str = "", exit_code: int | None = None) -> dict[str, Any]:
    from sweeps.analysis.fit import analyze_trials
    from sweeps.analysis.report import write_report

    c_tok, _ = flops_accounting(spec)
    reference = float(spec.search.base_batch_size_sequences)
    try:
        analysis = analyze_trials(records, context_length_tokens=spec.model.context_length_tokens,
                                  reference_batch=reference, flops_per_token=c_tok, targets=spec.targets,
                                  tokens_per_sequence=tokens_per_sequence(spec))
        analysis_error = None
    except Exception as exc:  # noqa: BLE001 - an analysis bug must not lose the trials
        log.exception("analysis failed")
        analysis = {"status": "analysis_failed", "message": f"analysis failed: {exc}", "b_crit": None}
        analysis_error = str(exc)
    analysis["sweep_id"] = state["sweep_id"]
    analysis["flops_per_token"] = c_tok
    analysis["trials_planned"] = spec.n_trials
    analysis["mlflow"] = {"tracking_uri": state["tracking_uri"], "experiment_id": state["experiment_id"],
                          "parent_run_id": state["parent_run_id"],
                          "child_runs": {tid: rid for tid, rid in tracker.child_runs.items() if isinstance(rid, str)}}
    best = _best_checkpoint(spec, output, analysis)
    analysis = _finite(analysis)
    _write_json(output / "trials.json", _finite([r.to_dict() for r in records]))
    _write_json(output / "cbs.json", analysis)
    try:
        write_report(output, analysis, records, spec)
    except Exception:  # noqa: BLE001
        log.exception("report failed")
    counts = analysis.get("trials", {})
    unfinished = sum(1 for r in records if r.status == "STOPPED") + max(0, spec.n_trials - len(records))
    if stopped:
        status, message = "STOPPED", ("the sweep was stopped before all trials finished: `critbatch resume "
                                      f"{output}` continues it")
    elif unfinished and not budget_note:
        # Tune ended its run with trials unfinished (an interrupt that did not come through StopSignals,
        # e.g. Tune's SIGUSR1): not a result, and resumable
        status, message = "STOPPED", (f"{unfinished} of {spec.n_trials} planned trial(s) did not finish: "
                                      f"`critbatch resume {output}` continues the sweep")
    elif analysis_error is not None:
        status, message = "FAILED", analysis["message"]
    elif not counts.get("COMPLETED"):
        status, message = "FAILED", "no trial completed (every trial failed or diverged)"
    else:
        status, message = "SUCCEEDED", analysis.get("message", "")
    if budget_note and not stopped:
        message = f"{budget_note}: analysed the {counts.get('COMPLETED', 0)} trial(s) that completed" + (
            f"; {message}" if message else "")
        for r in records:
            if r.status == "STOPPED":
                tracker.trial_ended(r.trial_id, "STOPPED", error=budget_note)
    summary = {k: analysis.get(k) for k in ("b_crit", "b_crit_tokens", "cbs_20", "s_min", "e_min", "target_loss")}
    summary.update({f"trials_{k.lower()}": v for k, v in counts.items()})
    artifacts = output / "_artifacts"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir()
    for name in ("cbs.json", "report.html", "trials.json", "spec.yaml"):
        if (output / name).is_file():
            shutil.copy(output / name, artifacts / name)
    if (output / "plots").is_dir():
        shutil.copytree(output / "plots", artifacts / "plots")
    if best is not None:
        shutil.copytree(best, artifacts / "best_checkpoint")
    # a driver killed between a trial's start and Tune's next experiment checkpoint leaves a child run
    # for a trial that the restored sweep does not know: remove it, so MLflow holds one run per trial
    tracker.prune_children(keep={r.trial_id for r in records})
    complete = tracker.finish(status, {k: v for k, v in summary.items() if isinstance(v, (int, float))}, str(artifacts),
                              message=message)
    shutil.rmtree(artifacts, ignore_errors=True)
    state["status"] = status
    state["mlflow_complete"] = complete
    if not complete:
        state["mlflow_incomplete_writes"] = [w for w, _ in tracker.outbox.pending]
        log.warning("MLflow was unreachable: %d write(s) could not be delivered; see sweep.json", len(tracker.outbox.pending))
    _write_json(output / "sweep.json", state)
    return {"ok": status == "SUCCEEDED", "status": status, "sweep_id": state["sweep_id"], "cbs": analysis,
            "output": str(output), "message": message, "exit_code": exit_code if stopped else None}
