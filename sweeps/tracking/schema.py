"""The one owner of the names in a sweep's record: MLflow tags, params, metrics and artifacts, and
the Ray job metadata keys of a submitted sweep (docs/design.md, "MLflow schema").

A sweep is one MLflow *parent* run (``critbatch.role = sweep``, run name = sweep id) with one
*child* run per trial (``critbatch.role = trial``, ``mlflow.parentRunId`` = the parent). The driver
writes them (:mod:`sweeps.tracking.writer`); the Ray Jobs client and the service read them
(:mod:`sweeps.tracking.reader`). Every module that writes or reads one of these names uses the
constant here, never the string.

Plain data: imports only the status vocabulary (``sweeps.spec.statuses``) and the names of a trial's
report (``workloads.api``, torch-free), so the REST service can use it.
"""

from __future__ import annotations

import math
import re

from sweeps.spec.statuses import TRIAL_STATUSES, TrialStatus
from workloads.api import COMM_METRICS, MLFLOW_METRICS, ONCE_PER_ATTEMPT, TrialOutcome

__all__ = [
    "ARTIFACT_CBS",
    "CLOSED_BY_JOBS",
    "COMM_METRIC_KEYS",
    "EXPERIMENT_KIND_MODEL_TRAINING",
    "META_EXPERIMENT",
    "META_FINGERPRINT",
    "META_NAME",
    "META_SWEEP_ID",
    "META_TRACKING_URI",
    "META_TRIALS_PLANNED",
    "METRIC_KEYS",
    "METRIC_VAL_LOSS",
    "MLFLOW_RUN_FAILED",
    "MLFLOW_RUN_FINISHED",
    "MLFLOW_RUN_KILLED",
    "MLFLOW_RUN_RUNNING",
    "ONCE_METRIC_KEYS",
    "PARAM_ACTIVATION_CHECKPOINTING",
    "PARAM_BATCH_SIZE_SEQUENCES",
    "PARAM_BETA2",
    "PARAM_COMPILE",
    "PARAM_LR",
    "PARAM_LR_RULE",
    "PARAM_MIXED_PRECISION",
    "PARAM_OPTIMIZER",
    "PARAM_OUTER_LR",
    "PARAM_OUTER_MOMENTUM",
    "PARAM_PARALLELISM",
    "PARAM_REPLICAS",
    "PARAM_SYNC",
    "PARAM_SYNC_EVERY_STEPS",
    "ROLE_BRANCH",
    "ROLE_BRANCH_SWEEP",
    "ROLE_SWEEP",
    "ROLE_TRIAL",
    "SAVED_VIEW_ID",
    "SCHEDULER_TAG_KEYS",
    "SUMMARY_METRICS",
    "SYNC_OUTER_PARAMS",
    "TAG_CLOSED_BY",
    "TAG_ERROR",
    "TAG_EXPERIMENT_KIND",
    "TAG_FINGERPRINT",
    "TAG_GROUP_ID",
    "TAG_INITIAL_POINT",
    "TAG_LR_RULES_IN_INTERVAL",
    "TAG_MESSAGE",
    "TAG_PARENT_RUN_ID",
    "TAG_PREFIX",
    "TAG_PROVENANCE_PREFIX",
    "TAG_ROLE",
    "TAG_SAVED_VIEW_PREFIX",
    "TAG_STATUS",
    "TAG_SWEEP_ID",
    "TAG_TRIALS_PLANNED",
    "TAG_TRIAL_ID",
    "TRAINING_PARAMS",
    "TRIAL_COMPLETED",
    "TRIAL_COUNT_PREFIX",
    "TRIAL_DIVERGED",
    "TRIAL_END_SUFFIX",
    "TRIAL_FAILED",
    "TRIAL_PARAMS",
    "TRIAL_PARAMS_SUFFIX",
    "TRIAL_PAUSED",
    "TRIAL_PRUNED",
    "TRIAL_RUNNING",
    "TRIAL_STATUSES",
    "TRIAL_STOPPED",
    "lr_scaling_fields",
    "names_full_disk",
    "provenance_tags",
    "scheduler_tag",
    "trial_count_metric",
    "trial_error_line",
    "trial_status",
]

# ---- MLflow tags ---------------------------------------------------------------------------------

#: Every critbatch tag starts with this.
TAG_PREFIX = "critbatch."
#: The sweep id, on the parent run and on every trial run.
TAG_SWEEP_ID = "critbatch.sweep_id"
#: What a run is: one of the ``ROLE_*`` values.
TAG_ROLE = "critbatch.role"
#: A trial's ``TRIAL_*`` status; the parent's sweep status (RUNNING, SUCCEEDED, FAILED, STOPPED).
TAG_STATUS = "critbatch.status"
#: Tune's trial id, on a trial run.
TAG_TRIAL_ID = "critbatch.trial_id"
#: The number of trials the spec plans, on the parent run.
TAG_TRIALS_PLANNED = "critbatch.trials_planned"
#: The fingerprint of the spec the sweep id is bound to, on the parent run.
TAG_FINGERPRINT = "critbatch.fingerprint"
#: The parent run's one-line outcome (why it failed), set by the driver.
TAG_MESSAGE = "critbatch.message"
#: A trial's error (the end of its traceback).
TAG_ERROR = "critbatch.error"
#: Set on runs a reader closed after their process ended (value :data:`CLOSED_BY_JOBS`).
TAG_CLOSED_BY = "critbatch.closed_by"
#: The search group (same batch size and seed) of a trial.
TAG_GROUP_ID = "critbatch.group_id"
#: The index of an enqueued configuration (``search.initial_points``) a trial runs.
TAG_INITIAL_POINT = "critbatch.initial_point"
#: MLflow's own parent-run tag.
TAG_PARENT_RUN_ID = "mlflow.parentRunId"

# ---- MLflow experiment tags (read by MLflow's UI: sweeps.tracking.ui) -------------------------------

#: MLflow 3's experiment kind, as its UI's experiment-type selector writes it.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
#: The kind MLflow's experiment-type selector calls "Machine learning" (the other, ``genai_development``, is
#: "GenAI apps & agents"); its sidebar's toggle names the same side "Model training".
EXPERIMENT_KIND_MODEL_TRAINING = "custom_model_development"
#: MLflow's saved views of an experiment's runs table: one tag ``mlflow.sharedViewState.<view id>`` each.
TAG_SAVED_VIEW_PREFIX = "mlflow.sharedViewState."
#: The view id of the runs-table view critbatch saves on its experiments (``?viewStateShareKey=critbatch``).
SAVED_VIEW_ID = "critbatch"

#: The equal-compute scheduler's decisions, tagged on a trial run as ``critbatch.<key>``.
SCHEDULER_TAG_KEYS = ("pruned_at_flops", "pruned_rung", "rung_decisions")


def scheduler_tag(key: str) -> str:
    """The tag name of one of :data:`SCHEDULER_TAG_KEYS` (``critbatch.<key>``)."""
    return f"{TAG_PREFIX}{key}"


#: What the sweep's numbers were computed with (``cbs.json``'s ``provenance``), on the parent run as
#: ``critbatch.provenance.<dotted key>``: ``python``, ``platform``, ``packages.torch`` (``.ray``,
#: ``.transformers``, ``.optuna``, ``.mlflow``), ``driver.omp_num_threads``, ``driver.torch_num_threads``,
#: ``worker.device``, ``worker.torch_num_threads``, ``worker.deterministic_algorithms``, ``worker.deterministic_warn_only``.
TAG_PROVENANCE_PREFIX = "critbatch.provenance."


def provenance_tags(provenance: dict) -> dict[str, str]:
    """``cbs.json``'s ``provenance`` as parent-run tags: nested keys dotted under :data:`TAG_PROVENANCE_PREFIX`,
    values as strings (None as ``"None"``)."""

    def flat(d: dict, prefix: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in d.items():
            out.update(
                flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": str(value)[:5000]}
            )
        return out

    return flat(provenance, TAG_PROVENANCE_PREFIX)


#: the parent run's tag naming the LR scaling rules inside the fitted exponent's interval (comma-separated)
TAG_LR_RULES_IN_INTERVAL = "critbatch.lr_scaling_rules_in_interval"


def lr_scaling_fields(analysis: dict) -> tuple[dict[str, float], dict[str, str]]:
    """``cbs.json``'s measured LR scaling rule (:mod:`sweeps.analysis.lr_scaling`) as parent-run
    ``(metrics, tags)``: ``lr_scaling_exponent`` and its interval's ends ``lr_scaling_exponent_ci_low`` /
    ``_high`` (finite values only), and :data:`TAG_LR_RULES_IN_INTERVAL`; empty without a fitted exponent."""

    def finite(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    metrics: dict[str, float] = {}
    if not finite(analysis.get("lr_scaling_exponent_fit")):
        return metrics, {}
    metrics["lr_scaling_exponent"] = float(analysis["lr_scaling_exponent_fit"])
    for key, v in zip(
        ("lr_scaling_exponent_ci_low", "lr_scaling_exponent_ci_high"),
        list(analysis.get("lr_scaling_exponent_ci") or [])[:2],
    ):
        if finite(v):
            metrics[key] = float(v)
    rules = analysis.get("lr_scaling_rules_in_interval") or []
    return metrics, {TAG_LR_RULES_IN_INTERVAL: ",".join(rules) or "none of linear, sqrt, none"}


#: the parent run's tags of ``search.precision`` (``cbs.json``'s ``precision``)
TAG_PRECISION_STOPPED_BECAUSE = "critbatch.precision.stopped_because"
TAG_PRECISION_REQUESTED = "critbatch.precision.b_crit_ratio_requested"


def precision_tags(analysis: dict) -> dict[str, str]:
    """``cbs.json``'s ``precision`` as parent-run tags: why the sweep stopped adding trials
    (:data:`TAG_PRECISION_STOPPED_BECAUSE`) and the ratio asked for; empty without ``search.precision``."""
    p = analysis.get("precision")
    if not isinstance(p, dict):
        return {}
    return {
        TAG_PRECISION_STOPPED_BECAUSE: str(p.get("stopped_because")),
        TAG_PRECISION_REQUESTED: str(p.get("b_crit_ratio_requested")),
    }


ROLE_SWEEP = "sweep"
ROLE_TRIAL = "trial"
#: Branched training (``critbatch branch``): its parent run and one run per branch.
ROLE_BRANCH_SWEEP = "branch-sweep"
ROLE_BRANCH = "branch"

# ---- MLflow's own run statuses (a run's ``info.status``, what ``set_terminated`` takes) ------------
# Not critbatch's vocabulary (that is ``sweeps.spec.statuses``): ``mlflow.entities.RunStatus``'s names, held
# here as strings so that reading them needs no MLflow import (a test checks them against MLflow's).

MLFLOW_RUN_RUNNING = "RUNNING"
MLFLOW_RUN_FINISHED = "FINISHED"
MLFLOW_RUN_FAILED = "FAILED"
MLFLOW_RUN_KILLED = "KILLED"

# ---- trial statuses (values of TAG_STATUS on a trial run) ---------------------------------------

TRIAL_RUNNING = TrialStatus.RUNNING
#: Waiting at a rung (``pruning.mode: pause``); still part of the live sweep.
TRIAL_PAUSED = TrialStatus.PAUSED
TRIAL_COMPLETED = TrialStatus.COMPLETED
TRIAL_DIVERGED = TrialStatus.DIVERGED
TRIAL_PRUNED = TrialStatus.PRUNED
TRIAL_FAILED = TrialStatus.FAILED
#: Cut short by a stopped sweep or a budget.
TRIAL_STOPPED = TrialStatus.STOPPED


#: ``OUT/reports/<trial id>.params.json``: a trial's config, written by ``sweeps.store.reportlog.ReportLog``
#: when the trial starts (Tune's own ``params.json`` comes only with its first result)
TRIAL_PARAMS_SUFFIX = ".params.json"
#: ``OUT/reports/<trial id>.end.json``: ``{"failed": bool}`` (and ``"error"``, :func:`trial_error_line`, when it
#: failed), how the trial's latest attempt ended (written by
#: ``sweeps.store.reportlog.ReportLog``; ``false`` again when the trial starts again). Tune leaves a trial's ``error.txt``
#: in place when a resume retries it, so that file alone cannot say whether a trial that later completed
#: failed (a resumed trial once counted FAILED and its batch size was left out of the fit).
TRIAL_END_SUFFIX = ".end.json"


#: colour codes in Ray's error texts (``\x1b[36mray::ImplicitFunc.train()\x1b[39m``)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: how a full filesystem or a spent quota reads in an error (the OS's words, lower case)
_FULL_DISK_WORDS = ("no space left on device", "disk quota exceeded")


def trial_error_line(text: str | None) -> str | None:
    """The line of a trial's error text (Tune's ``error.txt``: a traceback, the trial runner's inside it)
    that says what went wrong: its last non-blank line, colour codes removed, at most 1000 characters;
    None for no text. What ``trials.json``'s ``error`` and the first line of ``TAG_ERROR`` hold."""
    lines = [ln.strip() for ln in _ANSI.sub("", text or "").splitlines() if ln.strip()]
    return lines[-1][:1000] if lines else None


def names_full_disk(error: str | None) -> str | None:
    """The part of ``error`` from "no space left on device" (or "disk quota exceeded"; any case) on, if it
    names a full filesystem, else None: ``"workloads.errors.OutOfSpace: no space left on device while
    writing ..."`` -> ``"no space left on device while writing ..."``."""
    low = (error or "").lower()
    at = min((i for i in (low.find(w) for w in _FULL_DISK_WORDS) if i >= 0), default=-1)
    return (error or "")[at:] if at >= 0 else None


def trial_status(last: dict, *, failed: bool) -> TrialStatus:
    """How a trial ended (the one classifier: the MLflow child run's status and the analysis' count),
    from its last report (annotated by the pruning scheduler) and whether it raised.

    ``PRUNED`` (the scheduler stopped it at a rung), ``DIVERGED`` (the loop said so), ``FAILED`` (an
    error), ``COMPLETED`` (its last report is ``done``), else ``STOPPED`` (cut short by a budget, a stop
    or an interrupt).
    """
    if last.get("pruned"):
        return TRIAL_PRUNED
    if last.get("status") == TrialOutcome.DIVERGED:
        return TRIAL_DIVERGED
    if failed:
        return TRIAL_FAILED
    return TRIAL_COMPLETED if last.get("done") else TRIAL_STOPPED


#: The value of :data:`TAG_CLOSED_BY` a reader sets.
CLOSED_BY_JOBS = "critbatch.jobs"

# ---- metrics -------------------------------------------------------------------------------------

#: Trial metrics logged to MLflow at each milestone (step = tokens seen): the fields of a trial's report
#: (``workloads.api.TrialReport``) marked as metrics, in the report's order.
METRIC_KEYS = MLFLOW_METRICS
#: Trial metrics that hold one value per attempt (its start-up, the model's size, the optimizer's state).
ONCE_METRIC_KEYS = ONCE_PER_ATTEMPT
#: A trial's communication counters (always 0 with one worker: nothing is communicated).
COMM_METRIC_KEYS = COMM_METRICS
METRIC_VAL_LOSS = "val_loss"
#: The ``cbs.json`` values logged as metrics of the sweep's parent run when it ends.
SUMMARY_METRICS = ("b_crit", "b_crit_tokens", "cbs_20", "s_min", "e_min", "target_loss")
#: The parent run's trial counts at the end: ``trials_<status in lower case>`` (``trials_completed``, ...).
TRIAL_COUNT_PREFIX = "trials_"


def trial_count_metric(status: str) -> str:
    """The parent-run metric that counts trials ending with ``status`` (``COMPLETED`` -> ``trials_completed``)."""
    return f"{TRIAL_COUNT_PREFIX}{status.lower()}"


# ---- params (on a trial run) ---------------------------------------------------------------------

PARAM_BATCH_SIZE_SEQUENCES = "batch_size_sequences"
PARAM_LR = "lr"
PARAM_LR_RULE = "lr_rule"
PARAM_BETA2 = "beta2"
#: ``optimizer.name`` of the spec: adamw, adafactor, adamw_8bit or sgd_momentum
PARAM_OPTIMIZER = "optimizer"
#: Every param the writer logs on a trial run (a workload may add its own, such as LoRA's rank).
TRIAL_PARAMS = (
    PARAM_BATCH_SIZE_SEQUENCES,
    "batch_size_tokens",
    PARAM_LR,
    PARAM_LR_RULE,
    "lr_multiplier",
    PARAM_BETA2,
    "beta2_half_life_tokens",
    "seed",
    "budget_tokens",
    "context_length_tokens",
    "flops_convention",
    PARAM_OPTIMIZER,
)
#: The trial params of ``resources``' training options (``sweeps.launch.trainable.training_params``), logged on
#: every trial run beside the batch plan: ``ddp``/``fsdp``, ``True``/``False``, ``auto``/``bf16``/``fp32``.
PARAM_PARALLELISM = "parallelism"
PARAM_COMPILE = "compile"
PARAM_ACTIVATION_CHECKPOINTING = "activation_checkpointing"
PARAM_MIXED_PRECISION = "mixed_precision"
#: ``resources.sync``: ``ddp``/``local_sgd``/``diloco``, the steps between synchronisations (1 under ddp), the workers
PARAM_SYNC = "sync"
PARAM_SYNC_EVERY_STEPS = "sync_every_steps"
PARAM_REPLICAS = "replicas"
TRAINING_PARAMS = (
    PARAM_PARALLELISM,
    PARAM_COMPILE,
    PARAM_ACTIVATION_CHECKPOINTING,
    PARAM_MIXED_PRECISION,
    PARAM_SYNC,
    PARAM_SYNC_EVERY_STEPS,
    PARAM_REPLICAS,
)
#: DiLoCo's outer SGD, logged beside :data:`TRAINING_PARAMS` on a diloco trial only
PARAM_OUTER_LR = "outer_lr"
PARAM_OUTER_MOMENTUM = "outer_momentum"
SYNC_OUTER_PARAMS = (PARAM_OUTER_LR, PARAM_OUTER_MOMENTUM)

# ---- artifacts (on the parent run) ---------------------------------------------------------------

ARTIFACT_CBS = "cbs.json"

# ---- Ray job metadata of a submitted sweep (strings only) ----------------------------------------

#: Marks a Ray job as a critbatch sweep.
META_SWEEP_ID = "critbatch.sweep_id"
META_NAME = "critbatch.name"
META_FINGERPRINT = "critbatch.fingerprint"
META_EXPERIMENT = "critbatch.experiment"
META_TRACKING_URI = "critbatch.tracking_uri"
META_TRIALS_PLANNED = "critbatch.trials_planned"
