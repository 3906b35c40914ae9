"""MLflow tracking: a parent run per sweep, a child run per trial, all written by the driver.

Every write goes through an explicit ``MlflowClient`` (no fluent active-run state) and through an
:class:`Outbox`: if the tracking server is unreachable, the write is queued and retried in order at
the next event, so training goes on and nothing is lost once the server is back. Metrics use
``step = tokens seen``; a restarted trial never logs a tokens value twice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback
from ray.tune.experiment.trial import Trial

from sweeps.files import read_tail
from sweeps.spec import SweepSpec
from sweeps.spec.identity import experiment_artifact_location
from sweeps.spec.statuses import SweepStatus
from sweeps.tracking import schema
from sweeps.tracking.base import Tracker
from sweeps.tracking.outbox import Outbox
from sweeps.tracking.parent_run import parent_fields, read_analysis
from sweeps.tracking.ui import experiment_tags
from workloads.api import FLOPS_CONVENTION

__all__ = ["DEFAULT_DRAIN_S", "MlflowTracker", "MlflowTrialCallback", "Outbox", "configure_mlflow_env"]

log = logging.getLogger(__name__)

#: trial metrics that hold one value per attempt: logged when they change, not at every milestone
_ONCE_METRICS = schema.ONCE_METRIC_KEYS
#: a trial's communication counters: always 0 with one worker (nothing is communicated), so not logged then
_SYNC_METRICS = schema.COMM_METRIC_KEYS
#: how long :meth:`MlflowTracker.finish` retries writes MLflow refuses, by default (seconds)
DEFAULT_DRAIN_S = 300.0


def configure_mlflow_env() -> None:
    """Make MLflow's HTTP client fail fast (the Outbox retries instead of blocking training)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]
    return out


def create_experiment(client: MlflowClient, name: str) -> str:
    """Create experiment ``name`` with :func:`~sweeps.spec.identity.experiment_artifact_location`'s artifact
    location (beside a SQLite store; else MLflow's default) and :func:`sweeps.tracking.ui.experiment_tags`; its id."""
    location = experiment_artifact_location(getattr(client, "tracking_uri", None))
    return client.create_experiment(name, artifact_location=location, tags=experiment_tags())


class MlflowTracker(Tracker):
    """The sweep's MLflow runs: parent creation, child runs per trial, summary at the end (the ``mlflow`` sink).

    Args:
        client: an explicit ``MlflowClient``.
        spec: the sweep.
        sweep_id: the sweep id (``critbatch.sweep_id`` tag).
        fingerprint: the fingerprint of the spec the sweep id is bound to (``critbatch.fingerprint``
            tag of the parent run; a run under this id with another fingerprint is refused).
        drain_s: how long :meth:`finish` retries writes MLflow refuses, in seconds, unless it is given one.
    """

    def __init__(
        self,
        client: MlflowClient,
        spec: SweepSpec,
        sweep_id: str,
        fingerprint: str | None = None,
        drain_s: float = DEFAULT_DRAIN_S,
    ):
        self.client = client
        self.drain_s = drain_s
        self.spec = spec
        self.sweep_id = sweep_id
        self.fingerprint = fingerprint
        self.outbox = Outbox()
        self.child_runs: dict[str, Any] = {}  # tune trial id -> run id (a holder {"run_id": ...} until created)
        self.last_step: dict[str, int] = {}  # tune trial id -> last tokens logged
        self.ended: set[str] = set()
        self.once_logged: dict[str, dict[str, float]] = {}  # tune trial id -> the once-metrics' values logged
        # one worker under ddp communicates nothing: its communication counters are constant zeros
        self.skipped_metrics = (
            frozenset(_SYNC_METRICS)
            if (spec.resources.sync.mode == "ddp" and spec.resources.workers_per_trial == 1)
            else frozenset()
        )

    def start_parent(self) -> str:
        """Create (or find) the experiment and create the sweep's parent run; returns its id.

        Raises: whatever MLflow raises: a sweep does not start without its parent run.
        """
        exp = self.client.get_experiment_by_name(self.spec.experiment_name)
        self.experiment_id = experiment_id = (
            exp.experiment_id if exp else create_experiment(self.client, self.spec.experiment_name)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=self.sweep_id,
            tags={
                schema.TAG_SWEEP_ID: self.sweep_id,
                schema.TAG_ROLE: schema.ROLE_SWEEP,
                schema.TAG_STATUS: SweepStatus.RUNNING,
                schema.TAG_TRIALS_PLANNED: str(self.spec.n_trials),
                **({schema.TAG_FINGERPRINT: self.fingerprint} if self.fingerprint else {}),
                **self.spec.tracking.tags,
            },
        )
        self.parent_run_id = parent_run_id = run.info.run_id
        params = _flatten(self.spec.model_dump(mode="json"))
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 90):
            self.client.log_batch(parent_run_id, params=items[i : i + 90])
        return parent_run_id

    def attach_parent(self, experiment_id: str, parent_run_id: str) -> None:
        """Re-attach to an existing sweep's runs (resume): finds child runs by their trial-id tag."""
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.{schema.TAG_PARENT_RUN_ID} = '{parent_run_id}'", max_results=10000
        )
        for r in runs:
            tid = r.data.tags.get(schema.TAG_TRIAL_ID)
            if tid:
                self.child_runs[tid] = r.info.run_id
                hist = self.client.get_metric_history(r.info.run_id, schema.METRIC_VAL_LOSS)
                self.last_step[tid] = max((m.step for m in hist), default=-1)
                if r.info.status != schema.MLFLOW_RUN_RUNNING:
                    self.ended.add(tid)
        self.client.update_run(parent_run_id, status=schema.MLFLOW_RUN_RUNNING)
        self.client.set_tag(parent_run_id, schema.TAG_STATUS, SweepStatus.RUNNING)

    def find_sweep(self) -> tuple[str, str] | None:
        """``(experiment id, parent run id)`` of this sweep id's parent run in the spec's experiment, or None."""
        exp = self.client.get_experiment_by_name(self.spec.experiment_name)
        parents = (
            self.client.search_runs(
                [exp.experiment_id],
                filter_string=(
                    f"tags.`{schema.TAG_SWEEP_ID}` = '{self.sweep_id}' and tags.`{schema.TAG_ROLE}` = '{schema.ROLE_SWEEP}'"
                ),
            )
            if exp
            else []
        )
        return (exp.experiment_id, parents[0].info.run_id) if exp and parents else None

    def discard(self) -> None:
        """Delete the parent run (the sweep did not start); a failure is logged."""
        if not self.parent_run_id:
            return
        try:
            self.client.delete_run(self.parent_run_id)
        except Exception:  # noqa: BLE001
            log.warning("could not delete the MLflow run %s of the sweep that did not start", self.parent_run_id)

    # ---- per-trial ---------------------------------------------------------------------------------

    def trial_started(self, trial_id: str, config: dict[str, Any], extra_params: dict[str, Any]) -> None:
        """Create the trial's child run (tags, params from its Tune ``config`` and ``extra_params``),
        or reopen it when the trial resumes."""
        if trial_id in self.child_runs:  # a resumed trial (a resumed sweep, or promoted from a rung)
            self.ended.discard(trial_id)

            def reopen() -> None:
                rid = self._run_id(trial_id)
                self.client.update_run(rid, status=schema.MLFLOW_RUN_RUNNING)
                self.client.set_tag(rid, schema.TAG_STATUS, schema.TRIAL_RUNNING)
                # the stop that ended it ("sweep ended before the trial") is over: a stale error would stay
                # on a trial that then completes
                if schema.TAG_ERROR in self.client.get_run(rid).data.tags:
                    self.client.delete_tag(rid, schema.TAG_ERROR)

            self.outbox.put(f"reopen {trial_id}", reopen)
            return
        B = config[schema.PARAM_BATCH_SIZE_SEQUENCES]
        name = f"B{B}-s{config['seed']}-{trial_id}"
        tags = {
            schema.TAG_PARENT_RUN_ID: self.parent_run_id,
            schema.TAG_SWEEP_ID: self.sweep_id,
            schema.TAG_ROLE: schema.ROLE_TRIAL,
            schema.TAG_TRIAL_ID: trial_id,
            schema.TAG_GROUP_ID: str(config.get("group_id", "")),
            schema.TAG_STATUS: schema.TRIAL_RUNNING,
            **self.spec.tracking.tags,
        }
        if config.get("initial_point") is not None:  # search.initial_points: an enqueued configuration
            tags[schema.TAG_INITIAL_POINT] = str(config["initial_point"])
        params = {
            schema.PARAM_BATCH_SIZE_SEQUENCES: B,
            "batch_size_tokens": B * self.spec.model.context_length_tokens,
            schema.PARAM_LR: config["lr"],
            schema.PARAM_LR_RULE: config["lr_rule"],
            "lr_multiplier": config["lr_multiplier"],
            schema.PARAM_BETA2: config["beta2"],
            "beta2_half_life_tokens": config["beta2_half_life_tokens"],
            "seed": config["seed"],
            "budget_tokens": int(config.get("budget_tokens") or self.spec.budget_tokens),
            "context_length_tokens": self.spec.model.context_length_tokens,
            "flops_convention": FLOPS_CONVENTION,
            schema.PARAM_OPTIMIZER: self.spec.optimizer.name,
            **extra_params,  # may override flops_convention (fine-tuning, LoRA)
        }
        if config.get("stop_at_loss") is not None:  # token reallocation: it ends at the lowest declared target
            params["stop_at_loss"] = config["stop_at_loss"]
        holder: dict[str, str] = {}

        def create() -> None:
            if "run_id" not in holder:
                run = self.client.create_run(self._parent()[0], run_name=name, tags=tags)
                holder["run_id"] = run.info.run_id
            self.client.log_batch(holder["run_id"], params=[Param(k, str(v)) for k, v in params.items()])

        # child run ids are needed by later writes: resolve lazily through the holder
        self.child_runs[trial_id] = holder  # type: ignore[assignment]
        self.outbox.put(f"create child {trial_id}", create)

    def knows_trial(self, trial_id: str) -> bool:
        return trial_id in self.child_runs

    def trial_run_ids(self) -> dict[str, str]:
        return {tid: rid for tid, rid in self.child_runs.items() if isinstance(rid, str)}

    def _parent(self) -> tuple[str, str]:
        """``(experiment id, parent run id)``.

        Raises:
            RuntimeError: neither :meth:`start_parent` nor :meth:`attach_parent` has run.
        """
        if self.experiment_id is None or self.parent_run_id is None:
            raise RuntimeError("the sweep's MLflow parent run is neither started nor attached")
        return self.experiment_id, self.parent_run_id

    def _run_id(self, trial_id: str) -> str:
        r = self.child_runs[trial_id]
        if isinstance(r, dict):
            if "run_id" not in r:
                raise RuntimeError("child run not created yet")
            self.child_runs[trial_id] = r["run_id"]
            return r["run_id"]
        return r

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """Log a report's finite metrics at ``step = tokens_seen`` (a NaN ``val_loss`` too); a tokens
        value already logged is skipped.

        A value that holds for a whole attempt (``startup_s``, ``startup_ray_s``, ``trainable_params``,
        ``optimizer_state_bytes_per_param``) is logged when it differs from the one last logged for the trial,
        not at every milestone; with one ddp worker the communication counters (``syncs``, ``comm_*``), always
        zero, are not logged.
        """
        step = int(result.get("tokens_seen", -1))
        if step <= self.last_step.get(trial_id, -1):
            return  # already logged (a restarted worker group replays from its checkpoint)
        self.last_step[trial_id] = step
        ts = int(time.time() * 1000)
        once = self.once_logged.setdefault(trial_id, {})
        metrics = []
        for k in schema.METRIC_KEYS:
            v = result.get(k)
            if k in self.skipped_metrics or not isinstance(v, (int, float)) or v != v:
                continue
            if k in _ONCE_METRICS:
                if once.get(k) == float(v):
                    continue
                once[k] = float(v)
            metrics.append(Metric(k, float(v), ts, step))
        val_loss = result.get(schema.METRIC_VAL_LOSS)
        if val_loss is not None and val_loss != val_loss:  # NaN: logged, so that divergence shows in MLflow
            metrics.append(Metric(schema.METRIC_VAL_LOSS, float("nan"), ts, step))
        self.outbox.put(
            f"metrics {trial_id}@{step}", lambda: self.client.log_batch(self._run_id(trial_id), metrics=metrics)
        )

    def trial_paused(self, trial_id: str) -> None:
        """Tag a trial's run ``critbatch.status = PAUSED`` (it waits at a rung; the MLflow run stays open)."""
        if trial_id not in self.child_runs or trial_id in self.ended:
            return
        self.outbox.put(
            f"pause {trial_id}",
            lambda: self.client.set_tag(self._run_id(trial_id), schema.TAG_STATUS, schema.TRIAL_PAUSED),
        )

    def trial_ended(self, trial_id: str, status: str, error: str | None = None) -> None:
        """status: COMPLETED, DIVERGED, FAILED, PRUNED or STOPPED."""
        if trial_id in self.ended or trial_id not in self.child_runs:
            return
        self.ended.add(trial_id)
        mlflow_statuses: dict[str, str] = {
            schema.TRIAL_COMPLETED: schema.MLFLOW_RUN_FINISHED,
            schema.TRIAL_DIVERGED: schema.MLFLOW_RUN_FINISHED,
            schema.TRIAL_PRUNED: schema.MLFLOW_RUN_FINISHED,
            schema.TRIAL_FAILED: schema.MLFLOW_RUN_FAILED,
        }
        mlflow_status = mlflow_statuses.get(status, schema.MLFLOW_RUN_KILLED)

        def end() -> None:
            rid = self._run_id(trial_id)
            tags = [RunTag(schema.TAG_STATUS, status)]
            if error:
                tags.append(RunTag(schema.TAG_ERROR, error[:4000]))
            self.client.log_batch(rid, tags=tags)
            self.client.set_terminated(rid, status=mlflow_status)

        self.outbox.put(f"end {trial_id}", end)

    def log_trial_tag(self, trial_id: str, key: str, value: str) -> None:
        """Set one tag on the trial's run."""
        self.outbox.put(f"tag {trial_id}", lambda: self.client.set_tag(self._run_id(trial_id), key, value))

    def prune_children(self, keep: set[str]) -> None:
        """Delete child runs of this sweep whose trial is not in ``keep`` (trials lost with a killed driver)."""

        def prune() -> None:
            experiment_id, parent_run_id = self._parent()
            runs = self.client.search_runs(
                [experiment_id], filter_string=f"tags.{schema.TAG_PARENT_RUN_ID} = '{parent_run_id}'", max_results=10000
            )
            for r in runs:
                tid = r.data.tags.get(schema.TAG_TRIAL_ID)
                if r.data.tags.get(schema.TAG_ROLE) == schema.ROLE_TRIAL and tid not in keep:
                    self.client.delete_run(r.info.run_id)
                    if tid is not None:
                        self.child_runs.pop(tid, None)
                        self.ended.add(tid)

        self.outbox.put("prune orphan child runs", prune)

    def settle_children(self, statuses: dict[str, str]) -> None:
        """Make each child run say how its trial ended by the sweep's records (``{trial id: status}``; only
        COMPLETED, DIVERGED, PRUNED and FAILED are settled): a crash ends every open child FAILED ("sweep
        ended before the trial"), and a trial Tune had already finished is not run again by the resume."""
        wanted = {
            t: s
            for t, s in statuses.items()
            if s in (schema.TRIAL_COMPLETED, schema.TRIAL_DIVERGED, schema.TRIAL_PRUNED, schema.TRIAL_FAILED)
        }

        def settle() -> None:
            experiment_id, parent_run_id = self._parent()
            runs = self.client.search_runs(
                [experiment_id], filter_string=f"tags.{schema.TAG_PARENT_RUN_ID} = '{parent_run_id}'", max_results=10000
            )
            for r in runs:
                want = wanted.get(r.data.tags.get(schema.TAG_TRIAL_ID, ""))
                if want is None or (
                    r.data.tags.get(schema.TAG_STATUS) == want and r.info.status != schema.MLFLOW_RUN_RUNNING
                ):
                    continue
                self.client.set_tag(r.info.run_id, schema.TAG_STATUS, want)
                if want != schema.TRIAL_FAILED and schema.TAG_ERROR in r.data.tags:
                    self.client.delete_tag(r.info.run_id, schema.TAG_ERROR)
                self.client.set_terminated(
                    r.info.run_id,
                    status=schema.MLFLOW_RUN_FAILED if want == schema.TRIAL_FAILED else schema.MLFLOW_RUN_FINISHED,
                )

        self.outbox.put("settle child runs", settle)

    # ---- end of sweep -----------------------------------------------------------------------------

    def finish(
        self,
        status: str,
        summary: dict[str, float],
        artifacts_dir: str | None,
        message: str = "",
        drain_s: float | None = None,
        analysis: dict[str, Any] | None = None,
    ) -> bool:
        """Log the summary and artifacts to the parent run and end it.

        Beside ``summary``'s metrics, from the analysis (``cbs.json``): the interval's finite ends as metrics
        ``b_crit_ci_low`` and ``b_crit_ci_high`` (sequences) and ``target_loss`` (the headline target), the
        fit's status as the tag ``critbatch.fit_status``, its ``provenance`` as ``critbatch.provenance.*`` tags
        (:func:`sweeps.tracking.schema.provenance_tags`), the measured LR exponent with its interval
        (:func:`sweeps.tracking.schema.lr_scaling_fields`) and the headline sentence
        (:func:`sweeps.analysis.summary.headline`) as the run's description (``mlflow.note.content``, with
        the message of a sweep that did not succeed).

        Args:
            status: SUCCEEDED, FAILED or STOPPED (``critbatch.status`` tag).
            drain_s: how long to retry writes MLflow refuses, in seconds (default: the tracker's ``drain_s``).
            analysis: the content of ``cbs.json``; default: ``artifacts_dir/cbs.json`` when it is there
                and is a JSON object, else none (then only ``message`` describes the run).
        Returns: True if every queued write reached MLflow.
        """
        if analysis is None and artifacts_dir:
            analysis = read_analysis(Path(artifacts_dir) / schema.ARTIFACT_CBS)
        metrics, tags = parent_fields(status, summary, message, analysis)
        for tid in list(self.child_runs):
            if tid not in self.ended:
                # cut short by a stop or a budget (a paused trial waiting at a rung, too); FAILED if the sweep crashed
                self.trial_ended(
                    tid,
                    schema.TRIAL_FAILED if status == SweepStatus.FAILED else schema.TRIAL_STOPPED,
                    error="sweep ended before the trial",
                )

        def summary_write() -> None:
            _, pid = self._parent()
            ts = int(time.time() * 1000)
            ms = [Metric(k, v, ts, 0) for k, v in metrics.items()]
            if ms or tags:
                self.client.log_batch(pid, metrics=ms, tags=[RunTag(k, v) for k, v in tags.items()])
            if artifacts_dir:
                self.client.log_artifacts(pid, artifacts_dir)
            self.client.set_tag(pid, schema.TAG_STATUS, status)
            ended_as: dict[str, str] = {
                SweepStatus.SUCCEEDED: schema.MLFLOW_RUN_FINISHED,
                SweepStatus.FAILED: schema.MLFLOW_RUN_FAILED,
            }
            self.client.set_terminated(pid, status=ended_as.get(status, schema.MLFLOW_RUN_KILLED))

        self.outbox.put("parent summary", summary_write)
        return self.outbox.drain(timeout_s=self.drain_s if drain_s is None else drain_s)

    def flush(self) -> None:
        self.outbox.flush()

    def pending_writes(self) -> list[str]:
        return [what for what, _ in self.outbox.pending]


class MlflowTrialCallback(Callback):
    """Tune callback that hands Tune's trial events to a :class:`~sweeps.tracking.base.Tracker` (MLflow, or
    several sinks through a :class:`~sweeps.tracking.base.CompositeTracker`)."""

    def __init__(self, tracker: Tracker, extra_params: Callable[[dict[str, Any]], dict[str, Any]]):
        self.tracker = tracker
        self.extra_params = extra_params

    def __getstate__(self):  # Tune pickles its run config; live clients are re-attached on restore
        return {"tracker": None, "extra_params": None}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.tracker.trial_started(trial.trial_id, trial.config, self.extra_params(trial.config))

    def on_trial_restore(self, iteration, trials, trial, **info):
        self.tracker.trial_restored(trial.trial_id, trial.config, self.extra_params(trial.config))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.tracker.trial_result(trial.trial_id, result)
        if (
            trial.status == Trial.PAUSED
        ):  # Tune's status: waits at a rung for its batch size (pruning.mode: pause); RUNNING again on resume
            self.tracker.trial_paused(trial.trial_id)

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        for key in schema.SCHEDULER_TAG_KEYS:
            if last.get(key) is not None:  # the equal-compute scheduler's decisions (sweeps/pruning/scheduler.py)
                self.tracker.log_trial_tag(trial.trial_id, schema.scheduler_tag(key), str(last[key]))
        # no error here (on_trial_error is called instead): cut short by a budget or a stop is STOPPED
        self.tracker.trial_ended(trial.trial_id, schema.trial_status(last, failed=False))

    def on_trial_error(self, iteration, trials, trial, **info):
        err = read_tail(trial.error_file, 2000)  # Tune wrote it before calling back
        line = schema.trial_error_line(err)  # first what went wrong ("no space left on device ..."), then the traceback
        self.tracker.trial_ended(
            trial.trial_id, schema.TRIAL_FAILED, error=f"{line}\n\n{err}" if line else "trial raised"
        )

    def on_step_end(self, iteration, trials, **info):
        self.tracker.flush()
