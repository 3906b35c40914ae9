"""What the MLflow parent run says at the end of a sweep: ``summary``'s metrics and, from the analysis
(``cbs.json``'s content), the interval's ends, the headline target loss, the fit's status, the provenance, the
measured LR scaling and the headline sentence as the run's description. Pure: used by
:meth:`sweeps.tracking.writer.MlflowTracker.finish`.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from sweeps.analysis.summary import headline
from sweeps.spec.statuses import SweepStatus
from sweeps.tracking import schema

__all__ = ["METRIC_CI_HIGH", "METRIC_CI_LOW", "TAG_FIT_STATUS", "TAG_NOTE", "parent_fields", "read_analysis"]

log = logging.getLogger(__name__)

#: the fit's status on the parent run (``cbs.json``'s ``status``: ok, edge, above_range, ...), beside
#: ``critbatch.status``, the sweep's state (RUNNING, SUCCEEDED, ...)
TAG_FIT_STATUS = "critbatch.fit_status"
#: MLflow's run description (shown on the run's page)
TAG_NOTE = "mlflow.note.content"
#: the parent-run metrics of ``cbs.json``'s ``b_crit_ci`` ends (sequences), each logged only when finite
METRIC_CI_LOW, METRIC_CI_HIGH = "b_crit_ci_low", "b_crit_ci_high"


def read_analysis(path: Path) -> dict[str, Any] | None:
    """``cbs.json``'s content, or None when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parent_fields(
    status: str, summary: dict[str, Any], message: str, analysis: dict[str, Any] | None
) -> tuple[dict[str, float], dict[str, str]]:
    """The parent run's final ``(metrics, tags)``: ``summary``'s finite values, the interval's ends and the
    headline target loss from ``analysis``; the message, the fit's status and the description as tags."""
    metrics = {k: float(v) for k, v in summary.items() if _finite(v)}
    tags: dict[str, str] = {}
    if message:
        tags[schema.TAG_MESSAGE] = message[:4000]
    note = ""
    if analysis:
        ci = analysis.get("b_crit_ci") or []
        for key, v in zip((METRIC_CI_LOW, METRIC_CI_HIGH), list(ci)[:2]):
            if _finite(v):
                metrics[key] = float(v)
        if _finite(analysis.get("target_loss")):
            metrics["target_loss"] = float(analysis["target_loss"])
        if isinstance(analysis.get("provenance"), dict):  # versions and thread settings (sweeps/run/provenance.py)
            tags.update(schema.provenance_tags(analysis["provenance"]))
        lr_metrics, lr_tags = schema.lr_scaling_fields(analysis)  # the measured LR scaling rule
        metrics.update(lr_metrics)
        tags.update(lr_tags)
        tags.update(schema.precision_tags(analysis))  # why search.precision stopped adding trials
        if analysis.get("status"):
            tags[TAG_FIT_STATUS] = str(analysis["status"])
            try:
                note = headline(analysis) + "".join(f"\n\n- {c}" for c in analysis.get("caveats") or [])
            except Exception:
                log.exception("no headline for the parent run's description")
    if status != SweepStatus.SUCCEEDED and message:
        note = f"{note}\n\nSweep {status.lower()}: {message}" if note else f"Sweep {status.lower()}: {message}"
    if note:
        tags[TAG_NOTE] = note[:5000]
    return metrics, tags
