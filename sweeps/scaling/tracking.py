"""The study in MLflow: one study run in the members' experiment (``critbatch.role = study``) holding the
exponent and the prediction (b_crit's, and B_opt's: ``b_opt_gamma``, ``predicted_b_opt``) as metrics and ``scale.json`` with its plot as artifacts; each member's sweep run is
nested under it (``mlflow.parentRunId``), so the UI shows the study, its members and their trials as one tree."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["STUDY_ROLE", "log_study"]

#: ``critbatch.role`` of a study's run (a sweep's is ``sweep``, a trial's ``trial``)
STUDY_ROLE = "study"


def _metrics(result: dict[str, Any]) -> dict[str, float]:
    out = {
        "gamma": result["gamma"],
        "gamma_ci_low": result["gamma_ci"][0],
        "gamma_ci_high": result["gamma_ci"][1],
        "b0": result["b0"],
        "tokens_ref": result["tokens_ref"],
        "tau2": result["tau2"],
        "n_members": float(len(result["members"])),
    }
    pred = result.get("prediction")
    if pred:
        q = result["quantity"]
        out.update(
            {
                f"predicted_{q}": pred[q],
                f"predicted_{q}_low": pred["interval"][0],
                f"predicted_{q}_high": pred["interval"][1],
                "predict_tokens": pred["tokens"],
                "extrapolation_factor": pred["extrapolation_factor"],
            }
        )
    out.update(_b_opt_metrics(result.get("b_opt") or {}))
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def _b_opt_metrics(b_opt: dict[str, Any]) -> dict[str, Any]:
    """B_opt's exponent and its interval (``b_opt_gamma*``) and its prediction (``predicted_b_opt*``) from
    ``scale.json``'s ``b_opt``; only the member count when it has no law."""
    out: dict[str, Any] = {"b_opt_n_members": len(b_opt.get("members") or [])} if b_opt else {}
    if b_opt.get("gamma") is not None:
        out.update(
            b_opt_gamma=b_opt["gamma"],
            b_opt_gamma_ci_low=b_opt["gamma_ci"][0],
            b_opt_gamma_ci_high=b_opt["gamma_ci"][1],
            b_opt_b0=b_opt["b0"],
        )
    pred = b_opt.get("prediction")
    if pred:
        out.update(
            predicted_b_opt=pred["b_opt"],
            predicted_b_opt_low=pred["interval"][0],
            predicted_b_opt_high=pred["interval"][1],
        )
    return out


def log_study(study_name: str, result: dict[str, Any], member_folders: list[Path], files: list[Path]) -> dict | None:
    """Log the study to the MLflow store of its members (read from each member's ``cbs.json`` ``mlflow``); the
    same study run is reused when the command runs again. Returns ``{"tracking_uri", "experiment_id",
    "study_run_id"}``, or None when no member has an MLflow run.

    Raises:
        MlflowException: the store cannot be reached (the caller reports it; ``scale.json`` is already written).
    """
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.schema import MLFLOW_RUN_FINISHED, TAG_PARENT_RUN_ID, TAG_ROLE

    where = []
    for folder in member_folders:
        try:
            where.append(json.loads((folder / "cbs.json").read_text(encoding="utf-8"))["mlflow"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not where:
        return None
    uri, exp_id = where[0]["tracking_uri"], where[0]["experiment_id"]
    client = MlflowClient(uri)
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{TAG_ROLE}` = '{STUDY_ROLE}' and tags.`critbatch.study` = '{study_name}'",
        max_results=1,
    )
    run_id = (
        found[0].info.run_id
        if found
        else client.create_run(
            exp_id, run_name=f"{study_name}-study", tags={TAG_ROLE: STUDY_ROLE, "critbatch.study": study_name}
        ).info.run_id
    )
    for key, value in _metrics(result).items():
        client.log_metric(run_id, key, value)
    client.set_tag(run_id, "critbatch.status", result["status"])
    if result.get("b_opt"):
        client.set_tag(run_id, "critbatch.b_opt_status", result["b_opt"]["status"])
    client.set_tag(run_id, "critbatch.message", result["answer"][:5000])
    for path in files:
        if path.is_file():
            client.log_artifact(run_id, str(path))
    for w in where:
        if w.get("parent_run_id") and w.get("experiment_id") == exp_id:
            client.set_tag(w["parent_run_id"], TAG_PARENT_RUN_ID, run_id)
    client.set_terminated(run_id, MLFLOW_RUN_FINISHED)
    return {"tracking_uri": uri, "experiment_id": exp_id, "study_run_id": run_id}
