"""CLI commands for sweeps on a Ray cluster: ``submit``, ``status``, ``logs``, ``stop``, ``list``, ``serve``.

``critbatch submit SPEC --address http://HEAD:8265`` validates the spec here, stages the job's
working directory (``sweeps.remote.staging``) and submits it as a Ray Job whose submission id is the sweep
id. The other commands read Ray Jobs and MLflow; nothing is kept locally.

Each request to the job server gives up after ``CRITBATCH_RAY_CONNECT_TIMEOUT_S`` seconds (30 by default).
Exit codes as for ``critbatch run``: 0 success; 1 the sweep failed or was stopped (``--wait``), or
the cluster could not be reached; 2 invalid input (a bad spec, an unknown sweep id, a sweep id
taken by a different spec, a submission over the size limits).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import typer
from rich.console import Console

from critbatch.common import EXIT_FAILED, EXIT_INVALID
from sweeps.errors import InvalidInput
from sweeps.remote import (
    ClusterUnavailable,
    StagingLimits,
    SweepExists,
    SweepJobs,
    SweepNotFound,
    SweepStatus,
    default_job_python,
    staged_summary,
    staged_sweep,
)
from sweeps.spec import SpecError, load_spec, statuses
from sweeps.spec.result import CbsResult

__all__ = ["register"]

_err = Console(stderr=True, highlight=False, soft_wrap=True)
_out = Console(highlight=False, soft_wrap=True)

_ADDRESS = typer.Option(
    None,
    "--address",
    envvar="RAY_ADDRESS",
    help="Ray job server, http://HEAD:8265 (default: $RAY_ADDRESS, else a local cluster)",
)


def _fail(message: str, code: int) -> None:
    _err.print(f"error: {message}", markup=False)
    raise typer.Exit(code)


def _fail_spec(exc: SpecError) -> None:
    _fail(str(exc), EXIT_INVALID)  # one problem in one line, several one a line (SpecError's text)


def _jobs(address: str | None, tracking_uri: str | None = None) -> SweepJobs:
    """The job client: each request to the job server gives up after ``CRITBATCH_RAY_CONNECT_TIMEOUT_S``
    seconds (default 30; exit 1 naming the address), so a dead or frozen job server does not hang the command;
    exit 2 when that variable is not a positive number."""
    from sweeps.launch.reach import ray_connect_timeout_s

    # Status reads of an unreachable MLflow server fail within seconds instead of retrying for minutes.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        timeout_s = ray_connect_timeout_s()
    except InvalidInput as exc:
        _fail(str(exc), EXIT_INVALID)
    return SweepJobs(address, tracking_uri=tracking_uri, ray_timeout_s=timeout_s)


def _print_state(state: SweepStatus) -> None:
    _out.print(
        f"sweep {state.id}: {state.status}"
        + (f" (Ray: {state.ray_status})" if state.ray_status != state.status else ""),
        markup=False,
    )
    if state.reason:
        _out.print(f"  reason: {state.reason}", markup=False)
    t = state.trials
    if t is not None:
        planned = f"/{t.planned}" if t.planned is not None else ""
        _out.print(
            f"  trials: {t.done}{planned} done, {t.running} running, {t.failed} failed, {t.diverged} diverged"
            + (f", {t.pruned} pruned" if t.pruned else "")
            + (f", {t.stopped} stopped" if t.stopped else ""),
            markup=False,
        )
    if state.best:
        b = state.best
        _out.print(
            f"  best so far: val_loss {b['val_loss']:.4f} at B={b.get('batch_size_sequences')} sequences"
            f" (lr {b.get('lr')}, trial {b.get('trial_id')})",
            markup=False,
        )
    # the parent run's summary metrics are cbs.json's fields of the same names
    result = CbsResult.model_validate(state.result or {})
    if result.b_crit is not None:
        _out.print(
            f"  critical batch size b_crit = {result.b_crit:.1f} sequences"
            + (f" ({result.b_crit_tokens:.0f} tokens)" if result.b_crit_tokens is not None else ""),
            markup=False,
        )
    if state.mlflow_error:
        _out.print(f"  MLflow: {state.mlflow_error}", markup=False)


def _exit_for(state: SweepStatus) -> None:
    raise typer.Exit(0 if state.status == statuses.SweepStatus.SUCCEEDED else EXIT_FAILED)


def _follow(jobs: SweepJobs, sweep_id: str, timeout_s: float, as_json: bool) -> SweepStatus:
    last: list[str] = []

    def on_update(state: SweepStatus) -> None:
        line = (state.status, state.trials and (state.trials.done, state.trials.running, state.trials.failed))
        if not as_json and str(line) != (last[0] if last else None):
            last[:] = [str(line)]
            t = state.trials
            counts = f" trials done {t.done} running {t.running} failed {t.failed} diverged {t.diverged}" if t else ""
            _err.print(f"{state.id}: {state.status}{counts}", markup=False)

    return jobs.wait(sweep_id, timeout_s=timeout_s, poll_s=2.0, on_update=on_update)


def submit(
    spec: Path = typer.Argument(..., help="sweep spec (YAML)"),
    address: str | None = _ADDRESS,
    sweep_id: str | None = typer.Option(
        None, "--sweep-id", help="sweep id = Ray submission id (default NAME-FINGERPRINT)"
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow server the job logs to (default: the spec's tracking.uri if it is a server, "
        "else $MLFLOW_TRACKING_URI, else the spec's file store)",
    ),
    ship_data: bool = typer.Option(
        True, "--ship-data/--no-ship-data", help="ship small local inputs with the job (else paths are cluster paths)"
    ),
    ship_data_max_mb: float = typer.Option(
        20.0, "--ship-data-max-mb", min=0, help="largest input shipped with the job"
    ),
    upload_max_mb: float = typer.Option(100.0, "--upload-max-mb", min=0, help="largest job working directory"),
    output_root: str = typer.Option(
        "outputs", "--output-root", help="job output folder on the cluster (relative: the job's working dir)"
    ),
    job_python: str | None = typer.Option(
        None,
        "--job-python",
        envvar="CRITBATCH_JOB_PYTHON",
        help="Python on the cluster (default: this one for a local cluster, else 'python')",
    ),
    wait: bool = typer.Option(False, "--wait", help="follow the sweep until it ends; exit 0 only if it SUCCEEDED"),
    timeout_s: float = typer.Option(24 * 3600.0, "--timeout-s", help="with --wait: give up after this long"),
    dry_run: bool = typer.Option(False, "--dry-run", help="stage and print what would be submitted; submit nothing"),
) -> None:
    """Submit a sweep to a Ray cluster as a Ray Job.

    The Ray submission id is the sweep id.
    """

    try:
        s = load_spec(spec)
    except SpecError as exc:
        _fail_spec(exc)
    jobs = _jobs(address)
    try:
        with staged_sweep(
            s,
            sweep_id=sweep_id,
            tracking_uri=tracking_uri,
            default_tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
            base_dir=Path.cwd(),
            ship_data=ship_data,
            limits=StagingLimits.from_mb(ship_data_max_mb=ship_data_max_mb, upload_max_mb=upload_max_mb),
            python=job_python or default_job_python(address),
            output_root=output_root,
        ) as staged:
            for w in staged.warnings:
                _err.print(f"warning: {w}", markup=False)
            if dry_run:
                print(json.dumps(staged_summary(staged), indent=2))
                return
            state = jobs.submit(staged)
    except InvalidInput as exc:
        _fail(str(exc), EXIT_INVALID)
    except SweepExists as exc:
        if not exc.same_spec:
            _fail(str(exc), EXIT_INVALID)
        _err.print(f"already submitted: {exc}", markup=False)
        sid = exc.sweep_id
    except ClusterUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)
    else:
        sid = state.id
        _out.print(f"submitted sweep {sid} ({staged.size_bytes / 1e6:.1f} MB uploaded)", markup=False)
        _err.print(
            f"follow it: critbatch status {sid} --wait   |   critbatch logs {sid} --follow   |   stop: critbatch stop {sid}",
            markup=False,
        )
    if wait:
        try:
            final = _follow(jobs, sid, timeout_s, as_json=False)
        except ClusterUnavailable as exc:
            _fail(str(exc), EXIT_FAILED)
        _print_state(final)
        _exit_for(final)


def status(
    sweep_id: str = typer.Argument(..., help="sweep id"),
    address: str | None = _ADDRESS,
    as_json: bool = typer.Option(False, "--json", help="print the state as JSON"),
    wait: bool = typer.Option(False, "--wait", help="follow until the sweep ends; exit 0 only if it SUCCEEDED"),
    timeout_s: float = typer.Option(24 * 3600.0, "--timeout-s", help="with --wait: give up after this long"),
) -> None:
    """Status of a submitted sweep.

    PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED, its trial counts and the best trial so far.
    """

    jobs = _jobs(address)
    try:
        state = _follow(jobs, sweep_id, timeout_s, as_json) if wait else jobs.get(sweep_id)
    except SweepNotFound as exc:
        _fail(str(exc), EXIT_INVALID)
    except ClusterUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)
    if as_json:
        print(json.dumps(state.to_dict(), indent=2, default=str))
    else:
        _print_state(state)
    if wait:
        _exit_for(state)


def logs(
    sweep_id: str = typer.Argument(..., help="sweep id"),
    address: str | None = _ADDRESS,
    follow: bool = typer.Option(False, "--follow", "-f", help="stream the log until the sweep ends"),
    tail: int | None = typer.Option(None, "--tail", min=1, help="only the last N lines"),
) -> None:
    """The sweep driver's log (its Ray job's output)."""

    jobs = _jobs(address)
    try:
        if follow:

            async def stream() -> None:
                async for chunk in jobs.follow_logs(sweep_id):
                    print(chunk, end="", flush=True)

            asyncio.run(stream())
        else:
            print(jobs.logs(sweep_id, tail_lines=tail), end="")
    except SweepNotFound as exc:
        _fail(str(exc), EXIT_INVALID)
    except ClusterUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)


def stop(
    sweep_id: str = typer.Argument(..., help="sweep id"),
    address: str | None = _ADDRESS,
    wait_s: float = typer.Option(60.0, "--wait-s", min=0, help="seconds to wait for the job to end"),
) -> None:
    """Stop a submitted sweep.

    Its Ray job ends and its MLflow runs are closed (STOPPED).
    """

    jobs = _jobs(address)
    try:
        state, sent = jobs.stop(sweep_id, wait_s=wait_s)
    except SweepNotFound as exc:
        _fail(str(exc), EXIT_INVALID)
    except ClusterUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)
    if not sent:
        _err.print(f"sweep {sweep_id} had already ended ({state.status})", markup=False)
    elif not state.terminal:
        _err.print(f"stop sent; sweep {sweep_id} is still stopping", markup=False)
    _print_state(state)


def list_sweeps(
    address: str | None = _ADDRESS,
    limit: int = typer.Option(20, "--limit", min=1, max=1000, help="sweeps per page"),
    offset: int = typer.Option(0, "--offset", min=0, help="sweeps to skip (newest first)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Sweeps submitted to the cluster, newest first."""

    jobs = _jobs(address)
    try:
        states, total = jobs.list(limit=limit, offset=offset)
    except ClusterUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)
    if as_json:
        print(
            json.dumps(
                {"items": [s.to_dict() for s in states], "total": total, "offset": offset, "limit": limit},
                indent=2,
                default=str,
            )
        )
        return
    from rich.table import Table

    table = Table(title=f"sweeps {offset + 1 if states else 0}-{offset + len(states)} of {total}")
    for col in ("id", "status", "submitted", "ended", "reason"):
        table.add_column(col, overflow="fold")
    for s in states:
        table.add_row(s.id, s.status, s.submitted_at or "", s.ended_at or "", (s.reason or "")[:80])
    _out.print(table)


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="interface to bind"),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="port to bind"),
    local_only: bool = typer.Option(
        False, "--local-only", help="allow serving without CRITBATCH_API_TOKEN; only on a loopback host"
    ),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level"),
) -> None:
    """Serve the REST API (see docs/service.md).

    Settings from RAY_ADDRESS, MLFLOW_TRACKING_URI and CRITBATCH_API_TOKEN.
    """
    from service.server import SettingsError  # the CLI is the composition root
    from service.server import serve as run_server

    try:
        run_server(host=host, port=port, local_only=local_only, log_level=log_level)
    except SettingsError as exc:
        _fail(str(exc), EXIT_INVALID)


def register(app: typer.Typer) -> None:
    """Attach ``submit``, ``status``, ``logs``, ``stop``, ``list`` and ``serve`` to the ``critbatch`` app."""
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("stop")(stop)
    app.command("list")(list_sweeps)
    app.command("serve")(serve)
