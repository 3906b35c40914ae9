"""A comparison: a spec with ``arms`` runs each arm as a sweep of its own, then sets them side by side.

::

    OUT/comparison.json      the comparison's identity, its arms' sweep ids and its status
    OUT/spec.yaml            the comparison spec (paths resolved)
    OUT/arms/NAME/           each arm: a whole sweep folder (sweep.json, trials.json, cbs.json, report.html)
    OUT/cbs.json             the arms' critical batch sizes at the reference arm's targets
                             (:func:`sweeps.analysis.compare.compare_arms`)
    OUT/report.html          the side-by-side table and plots, with links to each arm's report

Every arm is checked before anything starts (its spec, data, output folder, tracking URI, sweep id,
and that its trial bundle fits the cluster): an arm that cannot run leaves nothing behind. The arms
run one after the other on one Ray connection; each arm's sweep id is ``COMPARISON_ID.ARM``, its runs
in the comparison's MLflow experiment with the tags ``critbatch.comparison`` and ``critbatch.arm``
(filter or group by them in the MLflow UI). A signal stops the running arm cleanly (it is resumable);
``critbatch resume OUT`` then skips finished arms, resumes the stopped one and runs the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from sweeps.errors import InvalidInput
from sweeps.files import read_json_lines, write_atomic, write_json
from sweeps.run.context import SweepResult
from sweeps.settings import Settings
from sweeps.spec import SweepSpec, parse_stored_spec
from sweeps.spec.identity import is_valid_sweep_id, run_sweep_id
from sweeps.spec.result import CbsResult, ComparisonResult
from sweeps.spec.statuses import FINISHED_STATUSES, SweepStatus
from sweeps.store.migrations import read_sweep_json

__all__ = [
    "ARMS_DIR",
    "COMPARISON_FILE",
    "analyze_comparison",
    "is_comparison",
    "naming_arm",
    "resume_comparison",
    "run_comparison",
]

log = logging.getLogger(__name__)

COMPARISON_FILE = "comparison.json"
ARMS_DIR = "arms"


def is_comparison(output: Path) -> bool:
    """Whether ``output`` holds a comparison (its ``comparison.json``)."""
    return (Path(output) / COMPARISON_FILE).is_file()


def _arm_dir(output: Path, arm: str) -> Path:
    return output / ARMS_DIR / arm


@contextlib.contextmanager
def naming_arm(index: int, name: str) -> Iterator[None]:
    """Re-raise an :class:`~sweeps.errors.InvalidInput` from inside as one that names the arm it is about,
    ``arms.INDEX (NAME): MESSAGE``, as the spec's own arm errors read (``sweeps.spec.sweep``): every check
    of one arm (its milestones, data, output folder, resources) says which arm failed it."""
    prefix = f"arms.{index} ({name}): "
    try:
        yield
    except InvalidInput as exc:
        if str(exc).startswith(prefix):
            raise
        raise InvalidInput(prefix + str(exc)) from exc


def run_comparison(
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
    """Run every arm of ``spec`` (a spec with ``arms``) as a sweep, then compare them. ``settings``: the
    ``CRITBATCH_*`` settings every arm runs with (default: from the environment).

    Returns:
        :func:`sweeps.run.api.run_sweep`'s result for the comparison: ``sweep_id`` is the comparison id,
        ``cbs`` the comparison (``kind: comparison``), ``ok`` True when every arm succeeded; a stopped arm
        ends the comparison with its ``exit_code``.

    Raises:
        InvalidInput: any arm's preflight fails, or ``OUT`` holds a sweep or another comparison. Nothing
            was created.
        RayUnreachable: the Ray address did not answer within ``ray_connect_timeout_s`` seconds
            (:mod:`sweeps.launch.reach`); nothing was created.
    """
    from sweeps.launch.cluster import cluster_shape, plan_resources, ray_session
    from sweeps.run.preflight import check_output_folder, resolve_paths
    from sweeps.run.prepare import prepare_sweep  # the one-sweep preflight, per arm

    settings = settings or Settings.from_env()
    output = Path(output).expanduser().resolve()
    if is_comparison(output):
        raise InvalidInput(
            f"--output {output} already holds a comparison: use `critbatch resume {output}` to "
            "continue it, or choose another folder"
        )
    check_output_folder(output)
    cid = sweep_id or run_sweep_id(spec.name)
    if not is_valid_sweep_id(cid) or len(cid) + 25 > 128:
        raise InvalidInput(
            f"--sweep-id {cid!r}: use letters, digits, '.', '_' and '-' (at most 103, the arms add '.ARM')"
        )
    arms = spec.arm_specs()
    for i, (name, arm) in enumerate(arms):
        with naming_arm(i, name):
            prepare_sweep(
                arm, _arm_dir(output, name), tracking_uri=tracking_uri, sweep_id=f"{cid}.{name}", settings=settings
            )
    with ray_session(ray_address, _sizing(arms), connect_timeout_s=_timeout_s(ray_connect_timeout_s, settings)):
        total, largest = cluster_shape()
        for i, (name, arm) in enumerate(arms):
            with naming_arm(i, name):
                plan_resources(arm, total, largest)  # raises InvalidInput before anything is written
        output.mkdir(parents=True, exist_ok=True)
        state = {
            "comparison_id": cid,
            "fingerprint": spec.fingerprint(),
            "status": SweepStatus.RUNNING,
            "created": time.time(),
            "tracking_uri": tracking_uri,
            "ray_address": ray_address,
            "arms": [{"name": n, "sweep_id": f"{cid}.{n}", "output": str(_arm_dir(output, n))} for n, _ in arms],
        }
        try:
            fd = os.open(output / COMPARISON_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise InvalidInput(f"--output {output} is being claimed by another comparison") from None
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)
        write_atomic(output / "spec.yaml", yaml.safe_dump(resolve_paths(spec).model_dump(mode="json"), sort_keys=False))
        return _run_arms(spec, output, state, show_progress, settings)


def resume_comparison(
    output: Path,
    *,
    ray_address: str | None = None,
    ray_connect_timeout_s: float | None = None,
    show_progress: bool = True,
    settings: Settings | None = None,
) -> SweepResult:
    """Continue a comparison: finished arms are kept, a stopped one resumed, the rest run, then the comparison.
    ``settings``: as for :func:`run_comparison`.

    Raises:
        InvalidInput: ``OUT`` holds no comparison, or its spec no longer validates, or it is not writable.
    """
    from sweeps.launch.cluster import ray_session
    from sweeps.run.preflight import check_output_writable

    settings = settings or Settings.from_env()
    output, state, spec = _load(output, "to resume")
    if state.get("status") in FINISHED_STATUSES:
        raise InvalidInput(f"comparison '{state['comparison_id']}' in {output} already finished ({state['status']})")
    check_output_writable(output)  # before Ray: comparison.json and the arms' folders are written there
    arms = spec.arm_specs()
    address = ray_address or state.get("ray_address")
    with ray_session(address, _sizing(arms), connect_timeout_s=_timeout_s(ray_connect_timeout_s, settings)):
        state["status"] = SweepStatus.RUNNING
        state["ray_address"] = address
        _save(output, state)
        return _run_arms(spec, output, state, show_progress, settings)


def _load(output: Path, purpose: str = "") -> tuple[Path, dict[str, Any], SweepSpec]:
    """``(resolved OUT, comparison.json's state, the spec)`` of the comparison in ``output``.

    Raises:
        InvalidInput: a file is missing (the message names it), or the spec no longer validates.
    """
    output = Path(output).expanduser().resolve()
    try:
        state = json.loads((output / COMPARISON_FILE).read_text())
        spec = parse_stored_spec(yaml.safe_load((output / "spec.yaml").read_text()))
    except FileNotFoundError as exc:
        raise InvalidInput(
            f"{output} holds no comparison{' ' + purpose if purpose else ''} ({exc.filename} missing)"
        ) from None
    return output, state, spec


def _sizing(arms: list[tuple[str, SweepSpec]]) -> SweepSpec:
    """The arm a local Ray is sized for (the most trial-driver CPUs at once: ``sweeps.launch.cluster.init_ray``)."""
    return max((a for _, a in arms), key=lambda a: a.resources.trial_driver_cpus * a.resources.max_concurrent_trials)


def _save(output: Path, state: dict[str, Any]) -> None:
    write_json(output / COMPARISON_FILE, state)


def _arm_status(arm_out: Path) -> str | None:
    """The arm's sweep status from its ``sweep.json`` (None: not started)."""
    try:
        return read_sweep_json(arm_out / "sweep.json").get("status")
    except InvalidInput:  # written by a newer critbatch
        raise
    except (FileNotFoundError, ValueError):
        return None


def _arm_error(arm_out: Path) -> str | None:
    """Why the arm's driver crashed (``sweep.json``'s ``error``), or None."""
    try:
        return read_sweep_json(arm_out / "sweep.json").get("error")
    except InvalidInput:  # written by a newer critbatch
        raise
    except (FileNotFoundError, ValueError):
        return None


def _timeout_s(given: float | None, settings: Settings) -> float | None:
    """``--connect-timeout-s`` if given, else ``CRITBATCH_RAY_CONNECT_TIMEOUT_S`` (None: the default)."""
    return given if given is not None else settings.ray_connect_timeout_s


def _run_arms(
    spec: SweepSpec, output: Path, state: dict[str, Any], show_progress: bool, settings: Settings
) -> SweepResult:
    """Run (or resume, or skip when finished) each arm in order, then write the comparison."""
    from sweeps.launch.runners import shared_runners

    with shared_runners(state["comparison_id"]):  # arms of one resource shape run in the same trial runners
        result = _run_arms_in_turn(spec, output, state, show_progress, settings)
    return result if result is not None else _finish(spec, output, state)


def _run_arms_in_turn(
    spec: SweepSpec, output: Path, state: dict[str, Any], show_progress: bool, settings: Settings
) -> SweepResult | None:
    """Each arm in order (skipped when finished); the stopped arm's result, or None when every arm ran."""
    from sweeps.run.driver import resume_single_sweep, run_single_sweep

    cid = state["comparison_id"]
    for i, (name, arm) in enumerate(spec.arm_specs()):
        arm_out = _arm_dir(output, name)
        status = _arm_status(arm_out)
        crashed = status == SweepStatus.FAILED and _arm_error(arm_out)  # a crashed arm (sweep.json's error) is resumed
        if status in FINISHED_STATUSES and (arm_out / "cbs.json").is_file() and not crashed:
            log.warning("comparison %s: arm %s already finished (%s)", cid, name, status)
            continue
        log.warning("comparison %s: arm %s", cid, name)
        with naming_arm(i, name):
            if status is None or status == SweepStatus.STARTING:
                result = run_single_sweep(
                    arm,
                    arm_out,
                    tracking_uri=state.get("tracking_uri"),
                    sweep_id=f"{cid}.{name}",
                    ray_address=state.get("ray_address"),
                    show_progress=show_progress,
                    settings=settings,
                )
            else:
                result = resume_single_sweep(
                    arm_out, ray_address=state.get("ray_address"), show_progress=show_progress, settings=settings
                )
        if result.exit_code:  # stopped by a signal: the comparison stops with it, resumable
            state["status"] = SweepStatus.STOPPED
            _save(output, state)
            return dataclasses.replace(
                result,
                sweep_id=cid,
                output=str(output),
                message=f"arm {name} stopped: `critbatch resume {output}` continues the comparison",
            )
    return None


def _measured(arm_out: Path) -> dict[str, float | None]:
    """Medians over the arm's trials of what their last reports measured (communication, throughput), and the
    optimizer-state median its ``cbs.json`` holds; None where nothing has it."""
    from sweeps.store.state import REPORTS_DIR

    keys_last = ("comm_bytes_per_step", "comm_time_s", "tokens_per_s")
    seen: dict[str, list[float]] = {k: [] for k in keys_last}
    for f in sorted((arm_out / REPORTS_DIR).glob("*.jsonl")):
        rows = read_json_lines(f)
        for k in keys_last:
            v = next((r[k] for r in reversed(rows) if isinstance(r.get(k), (int, float))), None)
            if v is not None:
                seen[k].append(float(v))
    path = arm_out / "cbs.json"
    cbs = CbsResult.model_validate(json.loads(path.read_text())) if path.is_file() else CbsResult()
    return {
        "optimizer_state_bytes_per_param": cbs.optimizer_state_bytes_per_param,
        **{k: statistics.median(v) if v else None for k, v in seen.items()},
    }


def _arm_info(name: str, arm: SweepSpec, arm_out: Path, status: str | None, sweep_id: str) -> dict[str, Any]:
    sync = arm.resources.sync
    return {
        "sync": sync.mode,
        "sync_every_steps": sync.every_steps if sync.mode != "ddp" else 1,
        "replicas": arm.resources.workers_per_trial,
        "optimizer": arm.optimizer.name,
        "status": status,
        "sweep_id": sweep_id,
        **_measured(arm_out),
    }


def analyze_comparison(output: Path) -> ComparisonResult:
    """Re-analyse a comparison's arms at the reference arm's targets with this critbatch, rewriting
    ``OUT/cbs.json`` and ``OUT/report.html`` (``critbatch analyze --comparison OUT``); the comparison's
    and the arms' states are left as they are.

    Returns:
        The comparison (``OUT/cbs.json``'s content).

    Raises:
        InvalidInput: ``OUT`` holds no comparison, or its spec no longer validates.
    """
    output, state, spec = _load(output)
    comparison, _, _ = _write_comparison(spec, output, state["comparison_id"])
    return comparison


def _write_comparison(spec: SweepSpec, output: Path, cid: str) -> tuple[ComparisonResult, list[str], bool]:
    """Analyse every arm at the reference arm's targets; write ``OUT/cbs.json`` and ``OUT/report.html``.

    Returns ``(comparison, arms that did not succeed, whether the reference arm has targets)``."""
    from sweeps.analysis import analyze_trials_file, finite_json
    from sweeps.analysis.compare import compare_arms

    arms = spec.arm_specs()
    ref_cbs_path = _arm_dir(output, arms[0][0]) / "cbs.json"
    ref_targets = None
    if ref_cbs_path.is_file():
        ref_cbs = CbsResult.model_validate(json.loads(ref_cbs_path.read_text()))
        ref_targets = [t.target_loss for t in ref_cbs.targets or [] if t.target_loss is not None] or None
    rows = []
    for name, arm in arms:
        arm_out = _arm_dir(output, name)
        analysis = None
        if ref_targets and (arm_out / "trials.json").is_file() and (arm_out / "cbs.json").is_file():
            try:
                analysis = analyze_trials_file(arm_out / "trials.json", targets=ref_targets)
            except InvalidInput as exc:
                log.warning("comparison %s: arm %s cannot be analysed: %s", cid, name, exc)
        rows.append((name, _arm_info(name, arm, arm_out, _arm_status(arm_out), f"{cid}.{name}"), analysis))
    failed = [n for n, info, _ in rows if info["status"] != SweepStatus.SUCCEEDED]
    comparison = ComparisonResult.model_validate(
        {
            **compare_arms(rows),
            "comparison_id": cid,
            "name": spec.name,
            "arm_outputs": {n: str(_arm_dir(output, n)) for n, _ in arms},
        }
    )
    write_json(output / "cbs.json", finite_json(comparison))
    from sweeps.analysis.compare_report import write_comparison_report

    write_comparison_report(output, comparison)
    return comparison, failed, bool(ref_targets)


def _finish(spec: SweepSpec, output: Path, state: dict[str, Any]) -> SweepResult:
    """Re-analyse every arm at the reference arm's targets, write ``OUT/cbs.json`` and ``OUT/report.html``."""
    cid = state["comparison_id"]
    comparison, failed, ref_targets = _write_comparison(spec, output, cid)
    state["status"] = SweepStatus.FAILED if failed or not ref_targets else SweepStatus.SUCCEEDED
    _save(output, state)
    message = "; ".join(comparison.summary)
    if failed:
        message = f"arm(s) {failed} did not succeed; " + message
    return SweepResult(
        ok=not failed and bool(ref_targets),
        status=state["status"],
        sweep_id=cid,
        cbs=comparison.to_json_dict(),
        output=str(output),
        message=message,
        exit_code=None,
    )
