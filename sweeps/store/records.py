"""Trial records (:class:`sweeps.analysis.TrialRecord`) read back from what a sweep wrote: its Tune
experiment folder and report log (:func:`collect_records`), or a Tune ``ResultGrid`` when the state lives on
remote storage (:func:`records_from_grid`). One classifier (:func:`sweeps.tracking.schema.trial_status`) names every trial's end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sweeps.analysis import TrialRecord
from sweeps.files import read_json_lines
from sweeps.pruning.rungs import RESULT_KEYS
from sweeps.spec import SweepSpec
from sweeps.store.migrations import read_sweep_json
from sweeps.store.state import PRUNED_WHILE_PAUSED, REPORTS_DIR, tune_dir_of
from sweeps.tracking.schema import TRIAL_END_SUFFIX, TRIAL_FAILED, TRIAL_PARAMS_SUFFIX, trial_error_line, trial_status

__all__ = ["HYPERPARAMETER_KEYS", "collect_records", "records_from_grid", "records_from_reports"]

#: the sampled hyperparameters a record keeps (the Tune config's keys)
HYPERPARAMETER_KEYS = ("lr_rule", "lr_multiplier", "lr", "beta2", "beta2_half_life_tokens")


def _record(
    trial_id: str, cfg: dict[str, Any], curve: list[dict], last: dict, status: str, error: str | None = None
) -> TrialRecord:
    """A :class:`TrialRecord` from a trial's Tune config and its reports (one per tokens value, in order);
    ``error`` is kept for a FAILED one only."""
    return TrialRecord(
        trial_id=trial_id,
        batch_size_sequences=int(cfg["batch_size_sequences"]),
        seed=int(cfg["seed"]),
        group_id=str(cfg.get("group_id", trial_id)),
        status=status,
        hyperparameters={k: cfg.get(k) for k in HYPERPARAMETER_KEYS},
        tokens=[float(r["tokens_seen"]) for r in curve],
        val_loss=[float(r["val_loss"]) if r.get("val_loss") is not None else float("nan") for r in curve],
        flops=[float(r.get("flops", 0.0)) for r in curve],
        b_simple=[r.get("b_simple") for r in curve],
        pruning=_pruning_of(last),
        optimizer_state_bytes_per_param=_first_number(curve, "optimizer_state_bytes_per_param"),
        trainable_params=_first_number(curve, "trainable_params"),
        error=error if status == TRIAL_FAILED else None,
    )


def _first_number(curve: list[dict], key: str) -> float | None:
    """The first finite ``key`` of a trial's reports (its first report has it), or None."""
    for r in curve:
        v = r.get(key)
        if isinstance(v, (int, float)) and v == v:
            return float(v)
    return None


def _trial_id_from_dir(name: str) -> str:
    """Tune names a trial's folder ``run_trial_<trial id>_<index>_<params>_<date>``."""
    m = re.match(r"run_trial_([^_]+)_", name)
    return m.group(1) if m else name


def collect_records(output: Path, spec: SweepSpec, *, sweep_id: str | None = None) -> list:
    """Every trial's config, status and milestone curve, read from the sweep's own Tune experiment folder.

    Reads ``params.json`` and the reports of ``OUT/tune/<sweep id>/*/result.json`` and
    ``OUT/reports/<trial id>.jsonl`` (one JSON line per report, every restart included:
    :class:`sweeps.store.reportlog.ReportLog`), so that it works the same after a resume as after an uninterrupted run; no
    other sweep's folder is read.

    Args:
        sweep_id: the sweep's id; default the one in ``OUT/sweep.json``.
    """
    records = []
    if sweep_id is None:
        sweep_file = output / "sweep.json"
        if not sweep_file.is_file():
            return records
        sweep_id = str(read_sweep_json(sweep_file)["sweep_id"])
    tune_dir = Path(tune_dir_of(str(output), sweep_id))
    if not tune_dir.is_dir():
        return records
    pruned_file = output / PRUNED_WHILE_PAUSED
    pruned_while_paused = json.loads(pruned_file.read_text()) if pruned_file.is_file() else {}
    reports = output / REPORTS_DIR
    snapshot = _tune_trial_configs(tune_dir)  # every trial Tune created, started or not
    for d in sorted(p for p in tune_dir.iterdir() if p.is_dir()):
        rows = read_json_lines(d / "result.json")
        trial_id = rows[-1]["trial_id"] if rows and "trial_id" in rows[-1] else _trial_id_from_dir(d.name)
        # Tune writes params.json only with the first result: else the config the driver saw at the
        # trial's start, else the one in Tune's snapshot (a trial created but not started yet)
        cfg = _first_config(d / "params.json", reports / f"{trial_id}{TRIAL_PARAMS_SUFFIX}", snapshot.get(trial_id))
        if cfg is None:
            continue
        has_error = (d / "error.txt").is_file() or (d / "error.pkl").is_file()
        records.append(_trial_record(reports, trial_id, cfg, rows, has_error, pruned_while_paused))
    # a trial with no folder yet (Tune stages it until its first result): stopped before it reported,
    # it is still one of the sweep's trials (it used to be missing from trials.json while STOPPED)
    seen = {r.trial_id for r in records}
    for trial_id in sorted(set(snapshot) - seen):
        cfg = _first_config(reports / f"{trial_id}{TRIAL_PARAMS_SUFFIX}", snapshot[trial_id])
        if cfg is not None:
            records.append(_trial_record(reports, trial_id, cfg, [], False, pruned_while_paused))
    return records


def _trial_record(
    reports: Path, trial_id: str, cfg: dict, rows: list[dict], has_error: bool, pruned_while_paused: dict
) -> TrialRecord:
    """One trial's record from its config, Tune's ``result.json`` rows and the driver's report log.

    The trial failed if its latest attempt ended with an error (``<trial id>.end.json``); without that
    file (a sweep from before it, or a driver that died first) if Tune left an error file.
    """
    # every report across the trial's restarts: result.json holds only some after a restore
    rows = rows + read_json_lines(reports / f"{trial_id}.jsonl")
    # keep one row per tokens value (a restarted worker group may report a milestone twice)
    by_tokens: dict[int, dict] = {}
    for r in rows:
        if "tokens_seen" in r:
            by_tokens[int(r["tokens_seen"])] = r
    curve = [by_tokens[k] for k in sorted(by_tokens)]
    last = curve[-1] if curve else {}
    end = _json_object(reports / f"{trial_id}{TRIAL_END_SUFFIX}")
    failed = bool(end["failed"]) if isinstance(end.get("failed"), bool) else has_error
    if trial_id in pruned_while_paused:  # its last report is the rung it waited at (pruning.mode: pause)
        last = {**last, **pruned_while_paused[trial_id]}
        if curve:
            curve[-1] = last
    error = end.get("error") if failed and isinstance(end.get("error"), str) else None
    return _record(trial_id, cfg, curve, last, trial_status(last, failed=failed), error)


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; {} if it is missing or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tune_trial_configs(tune_dir: Path) -> dict[str, dict]:
    """``{trial id: config}`` of the trials in Tune's experiment snapshots (``experiment_state-*.json``,
    the newest last): each entry of ``trial_data`` is ``[the trial's JSON state, its run metadata]``, the
    state holding ``trial_id`` and ``config``."""
    configs: dict[str, dict] = {}
    for f in sorted(tune_dir.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime):
        for entry in _json_object(f).get("trial_data") or []:
            try:
                state = json.loads(entry[0])
                configs[str(state["trial_id"])] = dict(state["config"])
            except (TypeError, ValueError, KeyError, IndexError):
                continue
    return configs


def _first_config(*sources: Path | dict | None) -> dict | None:
    """The first config found: a JSON file that exists, or a dict."""
    for src in sources:
        if isinstance(src, dict):
            return src
        if src is not None and src.is_file():
            return json.loads(src.read_text())
    return None


def _pruning_of(row: dict) -> dict[str, Any]:
    """The equal-compute scheduler's keys (``RESULT_KEYS``) of a result row, without the missing ones."""
    return {k: row[k] for k in RESULT_KEYS if row.get(k) is not None and row.get(k) == row.get(k)}


def records_from_reports(output: Path) -> list:
    """The records of every trial that started, from the driver's report log alone (``OUT/reports/``: the
    config each trial started with, every report, how it ended); what ``search.precision`` refits after
    each wave, wherever Tune keeps its own state. Trials Tune created but never started are left out (they
    have no curve to fit)."""
    reports = output / REPORTS_DIR
    pruned_file = output / PRUNED_WHILE_PAUSED
    pruned_while_paused = json.loads(pruned_file.read_text()) if pruned_file.is_file() else {}
    records = []
    for params in sorted(reports.glob(f"*{TRIAL_PARAMS_SUFFIX}")):
        cfg = _json_object(params)
        if cfg:
            trial_id = params.name[: -len(TRIAL_PARAMS_SUFFIX)]
            records.append(_trial_record(reports, trial_id, cfg, [], False, pruned_while_paused))
    return records


def records_from_grid(grid) -> list:
    """Trial records from a Tune ``ResultGrid`` (used when the Tune state lives on remote storage)."""
    out = []
    if grid is None:
        return out
    for res in grid:
        df = res.metrics_dataframe
        rows = df.to_dict("records") if df is not None else []
        by_tokens = {
            int(r["tokens_seen"]): r
            for r in rows
            if r.get("tokens_seen") == r.get("tokens_seen") and "tokens_seen" in r
        }
        curve = [by_tokens[k] for k in sorted(by_tokens)]
        last = curve[-1] if curve else {}
        cfg = res.config or {}
        if (res.metrics or {}).get("pruned") and not last.get("pruned"):  # pruned while paused
            last = {**last, **_pruning_of(res.metrics)}
            if curve:
                curve[-1] = last
        tid = str((res.metrics or {}).get("trial_id") or Path(res.path).name)
        out.append(
            _record(
                tid,
                cfg,
                curve,
                last,
                trial_status(last, failed=res.error is not None),
                trial_error_line(str(res.error)) if res.error is not None else None,
            )
        )
    return out
