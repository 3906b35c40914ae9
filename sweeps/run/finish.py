"""The end of a sweep: analysis, ``trials.json``, ``cbs.json``, the report, the best checkpoint, the
sweep's status and message, and the MLflow parent run closed with its summary metrics and artifacts.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from sweeps.analysis import CbsResult, analyze_trials, finite_json, finite_result, with_sweep_fields
from sweeps.analysis.report import write_report
from sweeps.errors import WriteFailed
from sweeps.files import SpaceReserve, replace_tree, write_failed
from sweeps.launch.workload import flops_accounting, tokens_per_sequence
from sweeps.run.context import SweepResult, SweepRun
from sweeps.run.provenance import sweep_provenance
from sweeps.search.precision import budgets_trained, precise_enough, wave_summary
from sweeps.spec import SweepSpec
from sweeps.spec.result import BestCheckpoint
from sweeps.spec.statuses import SweepStatus, TrialStatus
from sweeps.store.state import write_json
from sweeps.tracking import schema
from sweeps.tracking.base import Tracker

__all__ = ["PRECISION_FILE", "finish_sweep", "full_disk_note", "sweep_analysis"]

#: ``search.precision``'s waves and outcome, written after each wave (``OUT/precision.json``), read into ``cbs.json``
PRECISION_FILE = "precision.json"

log = logging.getLogger(__name__)


def finish_sweep(run: SweepRun, records: list, *, stopped: bool, budget_note: str = "") -> SweepResult:
    """Analyse ``records``, write the sweep's files, close its MLflow runs and ``sweep.json``.

    Args:
        run: the sweep (its tracker, state and signals: a stopped sweep returns ``run.stop.exit_code``).
        records: every trial's :class:`sweeps.analysis.TrialRecord`.
        stopped: a signal stopped the sweep (its status is then ``STOPPED``, resumable).
        budget_note: why a sweep budget ended it early ("" if none did).

    Returns:
        the :class:`~sweeps.run.context.SweepResult` (see :func:`sweeps.run.api.run_sweep`).
    """
    spec, output, tracker, state = run.spec, run.output, run.tracker, run.state
    analysis, analysis_error = _analyse(run, records)
    precision = _precision_section(spec, output, records, analysis, stopped=stopped, budget_note=budget_note)
    if precision is not None:
        analysis = with_sweep_fields(analysis, precision=precision)
    best, best_record = _best_checkpoint(spec, output, analysis)
    if best_record is not None:
        analysis = with_sweep_fields(analysis, best_checkpoint=best_record)
    analysis = finite_result(analysis)
    write_json(output / "trials.json", finite_json([r.to_dict() for r in records]))
    write_json(output / "cbs.json", analysis.to_json_dict())
    try:
        write_report(output, analysis, records, spec)
    except WriteFailed:
        raise  # a full disk: the sweep crashed (resumable), not a bug of the report
    except Exception:
        log.exception("report failed")
    counts = analysis.trials.model_dump() if analysis.trials is not None else {}
    status, message = _final_status(
        run, records, counts, stopped=stopped, budget_note=budget_note, analysis_error=analysis_error, analysis=analysis
    )
    if budget_note and not stopped:
        for r in records:
            if r.status == TrialStatus.STOPPED:
                tracker.trial_ended(r.trial_id, TrialStatus.STOPPED, error=budget_note)
    summary = {k: getattr(analysis, k) for k in schema.SUMMARY_METRICS}
    summary.update({schema.trial_count_metric(k): v for k, v in counts.items()})
    # a driver killed between a trial's start and Tune's next experiment checkpoint leaves a child run
    # for a trial that the restored sweep does not know: remove it, so MLflow holds one run per trial
    tracker.prune_children(keep={r.trial_id for r in records})
    tracker.settle_children({r.trial_id: r.status for r in records})  # MLflow says what trials.json says
    complete = _close_parent(output, tracker, status, summary, message, best)
    state.status = status
    state.mlflow_complete = complete
    if not complete:
        state.mlflow_incomplete_writes = tracker.pending_writes()
        log.warning(
            "MLflow was unreachable: %d write(s) could not be delivered; see sweep.json",
            len(state.mlflow_incomplete_writes),
        )
    state.save(output)
    SpaceReserve(output).release()  # kept for a crash; a resume makes it again
    return SweepResult(
        ok=status == SweepStatus.SUCCEEDED,
        status=status,
        sweep_id=state.sweep_id,
        cbs=analysis.to_json_dict(),
        output=str(output),
        message=message,
        exit_code=run.stop.exit_code if stopped else None,
    )


def sweep_analysis(
    spec: SweepSpec,
    records: list,
    flops_per_token: float | None = None,
    targets: list[float] | None = None,
    tokens_per_seq: float | None = None,
) -> CbsResult:
    """:func:`sweeps.analysis.analyze_trials` with the spec's context length, reference batch
    (``base_batch_size_sequences``), targets and tokens per sequence: ``cbs.json``'s analysis, also what
    ``search.precision`` refits after each wave. ``flops_per_token``: default the spec's (builds the model
    on the meta device). ``targets``: target losses to use where the spec gives none (``search.precision``'s,
    declared by its first wave); else chosen from the trials. ``tokens_per_seq``: default the spec's
    (:func:`sweeps.launch.workload.tokens_per_sequence`)."""
    c_tok = flops_per_token if flops_per_token is not None else flops_accounting(spec)[0]
    tps = tokens_per_seq if tokens_per_seq is not None else tokens_per_sequence(spec)
    return analyze_trials(
        records,
        context_length_tokens=spec.model.context_length_tokens,
        reference_batch=float(spec.search.base_batch_size_sequences),
        flops_per_token=c_tok,
        targets=spec.targets or targets,
        tokens_per_sequence=tps,
    )


def _declared_targets(spec: SweepSpec, output: Path) -> list[float] | None:
    """The target losses ``search.precision``'s first wave declared (``OUT/precision.json``), or None."""
    path = output / PRECISION_FILE
    if spec.search.precision is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get("targets") or None


def _precision_section(
    spec: SweepSpec, output: Path, records: list, result: CbsResult, *, stopped: bool, budget_note: str
) -> dict | None:
    """``cbs.json``'s ``precision``: what was asked, each wave's interval and additions (the last entry: the
    final analysis), and why it stopped adding: ``met``, ``max_trials``, ``nothing_to_add``, ``no_trial_completed``
    (the searcher's decision), else ``budget`` (the sweep's FLOP or wall-clock budget) or ``interrupted`` (a stop
    signal)."""
    p = spec.search.precision
    if p is None:
        return None
    path = output / PRECISION_FILE
    saved = json.loads(path.read_text()) if path.is_file() else {}
    waves = list(saved.get("waves", []))
    analysis = result.to_json_dict()  # as search.precision reads an analysis after each wave
    final = {**wave_summary(analysis, len(records)), "added": []}
    if waves and waves[-1].get("trials") == final["trials"]:  # the last decision's wave, as cbs.json reads it
        waves[-1] = {
            **final,
            "added": waves[-1].get("added", []),  # (the same unless Tune's state is remote)
            **{k: waves[-1][k] for k in ("trials_added",) if k in waves[-1]},
        }
    else:
        waves.append(final)
    outcome = saved.get("outcome")
    if outcome is None:  # the searcher did not decide: a signal, a budget, or Tune's cap (num_samples) came first
        because = (
            "interrupted"
            if stopped
            else "budget"
            if budget_note
            else "met"
            if precise_enough(analysis, p.b_crit_ratio)
            else "max_trials"
        )
        outcome = {
            "stopped_because": because,
            "b_crit_ratio_requested": p.b_crit_ratio,
            "b_crit_ratio": final["ratio"],
            "status": final["status"],
            "trials": len(records),
            **({"note": budget_note} if budget_note else {}),
        }
    else:  # the searcher's reason, with the interval cbs.json reports
        outcome = {**outcome, "b_crit_ratio": final["ratio"], "status": final["status"]}
    return {
        "b_crit_ratio_requested": p.b_crit_ratio,
        "max_trials": spec.max_trials,
        "trials_per_wave": p.trials_per_wave,
        "reallocate_tokens": p.reallocate_tokens,
        **(
            {
                "stop_at_loss": min(saved["targets"]),
                "budgets_spent": round(budgets_trained(records, spec.budget_tokens, len(spec.seeds)), 4),
            }
            if p.reallocate_tokens and saved.get("targets") and any(w.get("added") for w in waves)
            else {}
        ),
        "waves": waves,
        **outcome,
    }


def _analyse(run: SweepRun, records: list) -> tuple[CbsResult, str | None]:
    """``(cbs.json's content, the analysis error or None)``: an analysis bug must not lose the trials."""
    spec, state, facts = run.spec, run.state, run.prepared.facts
    c_tok, _ = facts.flops()
    try:
        analysis = sweep_analysis(
            spec,
            records,
            c_tok,
            targets=_declared_targets(spec, run.output),
            tokens_per_seq=facts.tokens_per_sequence(),
        )
        analysis_error = None
    except Exception as exc:
        log.exception("analysis failed")
        analysis = CbsResult(status="analysis_failed", message=f"analysis failed: {exc}", b_crit=None)
        analysis_error = str(exc)
    mlflow = {
        "tracking_uri": state.tracking_uri,
        "experiment_id": state.experiment_id,
        "parent_run_id": state.parent_run_id,
        "child_runs": run.tracker.trial_run_ids(),
    }
    analysis = with_sweep_fields(
        analysis,
        sweep_id=state.sweep_id,
        flops_per_token=c_tok,
        trials_planned=spec.n_trials,
        optimizer=spec.optimizer.name,
        provenance=sweep_provenance(spec),
        mlflow=mlflow,
    )
    return analysis, analysis_error


def _final_status(
    run: SweepRun,
    records: list,
    counts: dict[str, int],
    *,
    stopped: bool,
    budget_note: str,
    analysis_error: str | None,
    analysis: CbsResult,
) -> tuple[str, str]:
    """The sweep's ``(status, message)``: ``STOPPED`` (resumable), ``FAILED`` or ``SUCCEEDED``."""
    spec, output = run.spec, run.output
    unfinished = sum(1 for r in records if r.status == TrialStatus.STOPPED) + max(0, spec.n_trials - len(records))
    if stopped:
        status, message = (
            SweepStatus.STOPPED,
            (f"the sweep was stopped before all trials finished: `critbatch resume {output}` continues it"),
        )
    elif unfinished and not budget_note:
        # Tune ended its run with trials unfinished (an interrupt that did not come through StopSignals,
        # e.g. Tune's SIGUSR1): not a result, and resumable
        status, message = (
            SweepStatus.STOPPED,
            (
                f"{unfinished} of {spec.n_trials} planned trial(s) did not finish: "
                f"`critbatch resume {output}` continues the sweep"
            ),
        )
    elif analysis_error is not None:
        status, message = SweepStatus.FAILED, analysis.message or ""
    elif not counts.get(TrialStatus.COMPLETED):
        status, message = SweepStatus.FAILED, "no trial completed (every trial failed or diverged)"
    else:
        status, message = SweepStatus.SUCCEEDED, analysis.message or ""
    if budget_note and not stopped:
        message = f"{budget_note}: analysed the {counts.get(TrialStatus.COMPLETED, 0)} trial(s) that completed" + (
            f"; {message}" if message else ""
        )
    full_disk = full_disk_note(records)
    if full_disk:
        message = f"{message}; {full_disk}" if message else full_disk
    return status, message


def full_disk_note(records: list) -> str:
    """ "N of the M failed trial(s) found their disk full (trial ID: no space left on device while writing
    ...)" when a FAILED trial's error names a full filesystem (``schema.names_full_disk``), else "": a
    sweep whose trials failed so says it, not only "no trial completed"."""
    failed = [r for r in records if r.status == schema.TRIAL_FAILED]
    full = [(r.trial_id, schema.names_full_disk(r.error)) for r in failed if schema.names_full_disk(r.error)]
    if not full:
        return ""
    tid, cause = full[0]
    return f"{len(full)} of the {len(failed)} failed trial(s) found their disk full (trial {tid}: {cause})"


def _close_parent(
    output: Path, tracker: Tracker, status: str, summary: dict[str, Any], message: str, best: Path | None
) -> bool:
    """End the MLflow parent run with the summary metrics and the sweep's files as artifacts; True if
    every MLflow write was delivered."""
    artifacts = output / "_artifacts"  # staged for MLflow, removed once logged
    shutil.rmtree(artifacts, ignore_errors=True)
    try:
        artifacts.mkdir()
        for name in ("cbs.json", "report.html", "trials.json", "spec.yaml"):
            if (output / name).is_file():
                shutil.copy(output / name, artifacts / name)
        if (output / "plots").is_dir():
            shutil.copytree(output / "plots", artifacts / "plots")
        if best is not None:
            shutil.copytree(best, artifacts / "best_checkpoint")
    except OSError as exc:
        shutil.rmtree(artifacts, ignore_errors=True)
        raise write_failed(artifacts, exc) from exc
    complete = tracker.finish(
        status, {k: v for k, v in summary.items() if isinstance(v, (int, float))}, str(artifacts), message=message
    )
    shutil.rmtree(artifacts, ignore_errors=True)
    return complete


def _best_checkpoint(spec: SweepSpec, output: Path, analysis: CbsResult) -> tuple[Path | None, BestCheckpoint | None]:
    """Copy the best trial's Hugging Face checkpoint to ``OUT/best_checkpoint``: ``(the copy if it is small
    enough (``tracking.checkpoint_artifact_max_mb``) to log as an MLflow artifact, else None; cbs.json's
    ``best_checkpoint`` record, None when no checkpoint was copied)``."""
    rows = [r for r in analysis.per_batch or [] if r.loss_at_budget is not None]
    if not rows or spec.tracking.checkpoint_artifact_max_mb <= 0:
        return None, None
    best = min(rows, key=lambda r: r.loss_at_budget or 0.0)
    for tid in best.trial_ids_at_budget or []:
        src = output / "checkpoints" / tid
        if src.is_dir():
            dst = replace_tree(
                src,
                output / "best_checkpoint",
                extra={
                    "critbatch.json": json.dumps(
                        {
                            "trial_id": tid,
                            "batch_size_sequences": best.batch_size_sequences,
                            "loss_at_budget": best.loss_at_budget,
                            "config": best.best_config_at_budget,
                        },
                        indent=2,
                    )
                },
            )
            size_mb = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file()) / 2**20
            record = BestCheckpoint(path=str(dst), trial_id=tid, size_mb=size_mb)
            if size_mb <= spec.tracking.checkpoint_artifact_max_mb:
                return dst, record
            log.warning(
                "best checkpoint is %.1f MB, over tracking.checkpoint_artifact_max_mb: not logged to MLflow", size_mb
            )
            return None, record
    return None, None
