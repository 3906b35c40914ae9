"""A submitted sweep's status: Ray's job record corrected by the sweep's MLflow runs.

A job that exited 0 but whose parent run says FAILED, or whose trials all failed, is FAILED
(docs/design.md, "MLflow schema"). Everything here is pure: it reads a Ray job record (an object
with ``submission_id``, ``status``, ``message``, ``metadata``, ``start_time``, ``end_time``,
``driver_exit_code``) and MLflow run objects already fetched by :class:`sweeps.remote.jobs.SweepJobs`.

Imports neither Ray nor MLflow: the REST service uses it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sweeps.spec import statuses
from sweeps.spec.identity import redact_uri
from sweeps.spec.statuses import SERVED_STATUSES, TERMINAL_STATUSES
from sweeps.tracking.schema import (
    META_NAME,
    META_SWEEP_ID,
    META_TRIALS_PLANNED,
    METRIC_VAL_LOSS,
    MLFLOW_RUN_KILLED,
    MLFLOW_RUN_RUNNING,
    PARAM_BATCH_SIZE_SEQUENCES,
    PARAM_BETA2,
    PARAM_LR,
    PARAM_LR_RULE,
    SUMMARY_METRICS,
    TAG_MESSAGE,
    TAG_STATUS,
    TAG_TRIAL_ID,
    TAG_TRIALS_PLANNED,
    TRIAL_COMPLETED,
    TRIAL_DIVERGED,
    TRIAL_FAILED,
    TRIAL_PAUSED,
    TRIAL_PRUNED,
    TRIAL_RUNNING,
    TRIAL_STOPPED,
    trial_count_metric,
)

__all__ = [
    "SERVED_STATUSES",
    "TERMINAL_STATUSES",
    "SweepRuns",
    "SweepStatus",
    "TrialCounts",
    "best_trial",
    "failure_reason",
    "final_counts",
    "from_job",
    "planned_trials",
    "trial_counts",
    "with_runs",
]

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Params of the best trial, with the type each is served as.
_BEST_PARAMS = ((PARAM_BATCH_SIZE_SEQUENCES, int), (PARAM_LR, float), (PARAM_LR_RULE, str), (PARAM_BETA2, float))


@dataclass(frozen=True, kw_only=True)
class TrialCounts:
    """Trials by their MLflow ``critbatch.status`` tag.

    ``done`` counts trials that completed normally (``COMPLETED``); ``diverged``, ``failed``,
    ``pruned`` and ``stopped`` (cut short by a stop) are the other ways a trial ends.
    """

    planned: int | None = None
    done: int = 0
    running: int = 0
    failed: int = 0
    diverged: int = 0
    pruned: int = 0
    stopped: int = 0

    @property
    def finished(self) -> int:
        """Trials that have ended, one way or another."""
        return self.done + self.failed + self.diverged + self.pruned + self.stopped


@dataclass(frozen=True, kw_only=True)
class SweepStatus:
    """What a reader knows about one submitted sweep: Ray's job record plus its MLflow runs.

    Attributes:
        id: the sweep id (the Ray submission id).
        status: one of :data:`SERVED_STATUSES` (Ray's, corrected by MLflow).
        ray_status: the Ray job's own status.
        reason: why it FAILED or was STOPPED.
        submitted_at, ended_at: ISO 8601 UTC times (``...Z``).
        trials: trial counts (None when not read).
        best: the trial with the lowest ``val_loss`` so far.
        result: the parent run's summary metrics (``b_crit`` and friends) once analysed.
        tracking_uri, experiment_id, parent_run_id: where its MLflow runs are.
        mlflow_error: why MLflow was not read (then only Ray's view is given).
    """

    id: str
    status: str
    ray_status: str
    name: str | None = None
    reason: str | None = None
    submitted_at: str | None = None
    ended_at: str | None = None
    trials: TrialCounts | None = None
    best: dict[str, Any] | None = None
    result: dict[str, float] | None = None
    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    mlflow_error: str | None = None

    @property
    def terminal(self) -> bool:
        """Whether the sweep has ended (SUCCEEDED, FAILED or STOPPED)."""
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able fields (the tracking URI without a password), as the REST API serves them."""
        d = asdict(self)
        d["tracking_uri"] = redact_uri(self.tracking_uri)
        return d


@dataclass(frozen=True)
class SweepRuns:
    """A sweep's MLflow runs as read: the experiments searched, its parent run (or None), its trial runs,
    and ``note``: why they are missing where the store says."""

    exp_ids: list[str]
    parent: Any | None
    trials: list[Any]
    note: str | None = None  # why the runs are missing, when the store says (a deleted experiment)


def _iso(ms: int | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat().replace("+00:00", "Z")


def failure_reason(job: Any) -> str | None:
    """One line (at most 2,000 characters) on why a job failed: the driver's last error line, else Ray's message."""
    msg = _ANSI_RE.sub("", job.message or "")
    code = getattr(job, "driver_exit_code", None)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    if not lines:
        return f"exit code {code}" if code is not None else None
    if "last available logs" in lines[0] and len(lines) > 1:
        logs = lines[1:]
        picked = next((ln for ln in reversed(logs) if re.match(r"(sweep failed|error)\b", ln, re.IGNORECASE)), logs[-1])
        prefix = "invalid input (exit code 2)" if code == 2 else (f"exit code {code}" if code is not None else "failed")
        return f"{prefix}: {picked}"[:2000]
    return lines[0][:2000]


def from_job(job: Any, tracking_uri: str | None) -> SweepStatus:
    """Ray's view of a sweep: its status (another Ray status than :data:`SERVED_STATUSES` reads FAILED),
    the reason it failed or stopped, its name and times; ``tracking_uri`` as given."""
    md = job.metadata or {}
    ray_status = str(getattr(job.status, "value", job.status))
    # Ray's job statuses that are also served statuses mean the same; any other reads FAILED
    status = ray_status if ray_status in SERVED_STATUSES else statuses.SweepStatus.FAILED
    reason = None
    if status == statuses.SweepStatus.FAILED:
        reason = failure_reason(job)
    elif status == statuses.SweepStatus.STOPPED:
        reason = "stopped by request"
    return SweepStatus(
        id=job.submission_id or str(md.get(META_SWEEP_ID, "")),
        status=status,
        reason=reason,
        ray_status=ray_status,
        name=md.get(META_NAME),
        submitted_at=_iso(job.start_time),
        ended_at=_iso(job.end_time),
        tracking_uri=tracking_uri,
    )


def planned_trials(job: Any, parent: Any | None = None) -> int | None:
    """The trials the sweep plans: the job's metadata, else the parent run's tag, else None."""
    md = job.metadata or {}
    if md.get(META_TRIALS_PLANNED, "").isdigit():
        return int(md[META_TRIALS_PLANNED])
    if parent is not None:
        tp = parent.data.tags.get(TAG_TRIALS_PLANNED, "")
        return int(tp) if tp.isdigit() else None
    return None


def trial_counts(trials: list[Any], planned: int | None) -> TrialCounts:
    """Count trial runs by their status tag. A paused trial counts as running; a run whose tag still
    says RUNNING but whose MLflow status has ended counts as stopped (KILLED) or failed."""
    c: Counter[str] = Counter()
    for r in trials:
        tag = r.data.tags.get(TAG_STATUS, TRIAL_RUNNING)
        if tag == TRIAL_PAUSED:  # waiting at a rung (pruning.mode: pause): still part of the live sweep
            tag = TRIAL_RUNNING
        if tag == TRIAL_RUNNING and r.info.status != MLFLOW_RUN_RUNNING:
            tag = TRIAL_STOPPED if r.info.status == MLFLOW_RUN_KILLED else TRIAL_FAILED
        c[tag] += 1
    return TrialCounts(
        planned=planned,
        done=c[TRIAL_COMPLETED],
        running=c[TRIAL_RUNNING],
        failed=c[TRIAL_FAILED],
        diverged=c[TRIAL_DIVERGED],
        pruned=c[TRIAL_PRUNED],
        stopped=c[TRIAL_STOPPED],
    )


def final_counts(parent: Any | None, planned: int | None) -> TrialCounts | None:
    """The trial counts the driver logged on the parent run when the sweep ended (``trials_*`` metrics), or None."""
    if parent is None or trial_count_metric(TRIAL_COMPLETED) not in parent.data.metrics:
        return None
    m = parent.data.metrics

    def n(status: str) -> int:
        v = m.get(trial_count_metric(status))
        return int(v) if v is not None and math.isfinite(v) else 0

    return TrialCounts(
        planned=planned,
        done=n(TRIAL_COMPLETED),
        running=0,
        failed=n(TRIAL_FAILED),
        diverged=n(TRIAL_DIVERGED),
        pruned=n(TRIAL_PRUNED),
        stopped=n(TRIAL_STOPPED),
    )


def best_trial(trials: list[Any]) -> dict[str, Any] | None:
    """The trial run with the lowest finite ``val_loss``: ``trial_id``, ``run_id``, ``status``,
    ``val_loss`` and its ``batch_size_sequences``, ``lr``, ``lr_rule``, ``beta2`` params; None without one."""
    best = None
    for r in trials:
        v = r.data.metrics.get(METRIC_VAL_LOSS)
        if v is None or not math.isfinite(v):
            continue
        if best is None or v < best.data.metrics[METRIC_VAL_LOSS]:
            best = r
    if best is None:
        return None
    p = best.data.params
    out: dict[str, Any] = {
        "trial_id": best.data.tags.get(TAG_TRIAL_ID),
        "run_id": best.info.run_id,
        "status": best.data.tags.get(TAG_STATUS),
        "val_loss": best.data.metrics[METRIC_VAL_LOSS],
    }
    for k, conv in _BEST_PARAMS:
        if k in p:
            try:
                out[k] = conv(float(p[k])) if conv is int else conv(p[k])
            except ValueError:
                out[k] = p[k]
    return out


def with_runs(ray: SweepStatus, runs: SweepRuns, planned: int | None, *, with_trials: bool) -> SweepStatus:
    """``ray`` (:func:`from_job`) completed from the sweep's MLflow runs: trial counts (the driver's
    final summary wins for an ended sweep), the best trial, the result metrics, and an honest status
    (a job that exited 0 is FAILED when its parent run says so or when every trial failed).

    ``runs.trials`` is read when ``with_trials`` or the sweep SUCCEEDED (for the every-trial-failed check).
    """
    status, reason, parent, trials = ray.status, ray.reason, runs.parent, runs.trials
    counts = trial_counts(trials, planned) if (with_trials or status == statuses.SweepStatus.SUCCEEDED) else None
    final = final_counts(parent, planned) if status in TERMINAL_STATUSES else None
    if final is not None and counts is not None:
        counts = final  # the driver's own summary of a finished sweep wins over the child runs
    parent_tag = parent.data.tags.get(TAG_STATUS) if parent is not None else None
    parent_msg = parent.data.tags.get(TAG_MESSAGE) if parent is not None else None
    # Honest status: exit 0 is not enough when MLflow says otherwise.
    failed = statuses.SweepStatus.FAILED
    if status == statuses.SweepStatus.SUCCEEDED:
        if parent_tag == failed:
            status, reason = failed, parent_msg or "the sweep's parent run is marked FAILED"
        elif counts is not None and counts.finished > 0 and counts.done == 0 and counts.failed == counts.finished:
            status, reason = failed, "every trial failed"
    elif status == failed and parent_tag == failed and parent_msg:
        reason = parent_msg
    result = None
    if parent is not None:
        result = {k: parent.data.metrics[k] for k in SUMMARY_METRICS if k in parent.data.metrics} or None
    exp_ids = runs.exp_ids
    mlflow_error = ray.mlflow_error or runs.note
    succeeded = ray.status == statuses.SweepStatus.SUCCEEDED
    if mlflow_error is None and parent is None and succeeded:  # a finished driver always made one
        mlflow_error = (
            "no MLflow parent run of this sweep in its tracking store (deleted?): its trial counts and "
            "result cannot be read"
        )
    return replace(
        ray,
        status=status,
        reason=reason,
        mlflow_error=mlflow_error,
        trials=counts if with_trials else None,
        best=best_trial(trials) if with_trials else None,
        result=result,
        experiment_id=parent.info.experiment_id if parent is not None else (exp_ids[0] if len(exp_ids) == 1 else None),
        parent_run_id=parent.info.run_id if parent is not None else None,
    )
