"""``/v1/sweeps``: submit a sweep, list sweeps, and one sweep's status, stop, logs and report.

Every route needs the token (:func:`service.deps.require_token`) and refuses undeclared query
parameters. Backend calls run on the backend pool (:class:`service.deps.Backend`); the errors
they raise are answered by :mod:`service.errors`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from service.body import BodyError, parse_body
from service.deps import (
    Backend,
    get_backend,
    get_jobs,
    get_settings,
    reject_unknown_query,
    require_token,
    sweep_id_path,
)
from service.errors import (
    ERROR_RESPONSES,
    INVALID_RESPONSE,
    NOT_FOUND_RESPONSE,
    invalid_response,
    json_error_responses,
)
from service.policy import policy_errors
from service.schemas import (
    ConflictOut,
    ErrorOut,
    ReportOut,
    SweepCreatedOut,
    SweepOut,
    SweepPageOut,
    SweepStoppedOut,
    finite,
)
from service.settings import Settings
from sweeps.errors import InvalidInput
from sweeps.remote import StagingLimits, SweepJobs, SweepStatus, default_job_python, staged_sweep
from sweeps.spec import SweepSpec
from sweeps.spec.identity import check_sweep_id

__all__ = ["LOG_MAX_BYTES", "router"]

#: The logs route returns at most this many bytes (the end of the log).
LOG_MAX_BYTES = 5 * 1024 * 1024

router = APIRouter(
    prefix="/v1",
    dependencies=[Depends(require_token), Depends(reject_unknown_query)],
    responses=ERROR_RESPONSES,
    tags=["sweeps"],
)


def sweep_out(state: SweepStatus, **extra: Any) -> dict[str, Any]:
    """A sweep's JSON (:class:`service.schemas.SweepOut`): its status with links to its routes, and ``extra``."""
    d = finite(state.to_dict())
    d["links"] = {
        "self": f"/v1/sweeps/{state.id}",
        "logs": f"/v1/sweeps/{state.id}/logs",
        "report": f"/v1/sweeps/{state.id}/report",
    }
    d.update(extra)
    return d


def _submit(
    spec: SweepSpec, sweep_id: str | None, settings: Settings, jobs: SweepJobs, backend: Backend
) -> tuple[SweepStatus, list[str]]:
    """Stage and submit (on the backend pool); the count of active sweeps and the submission as one step."""
    with (
        staged_sweep(
            spec,
            sweep_id=sweep_id,
            default_tracking_uri=settings.tracking_uri,
            data_root=settings.data_dir,
            ship_data=settings.data_dir is not None,
            limits=StagingLimits.from_mb(
                ship_data_max_mb=settings.ship_data_max_mb, upload_max_mb=settings.upload_max_mb
            ),
            python=settings.job_python or default_job_python(jobs.address),
            storage_root=settings.storage_root,
        ) as staged,
        backend.submitting(),
    ):  # the cap holds for concurrent POSTs
        return jobs.submit(staged, max_active=settings.max_running), list(staged.warnings)


@router.post(
    "/sweeps",
    status_code=201,
    response_model=SweepCreatedOut,
    responses={
        **INVALID_RESPONSE,
        409: {"model": ConflictOut, "description": "a sweep with this id was already submitted"},
        415: {"model": ErrorOut, "description": "not YAML or JSON"},
        429: {
            "model": ErrorOut,
            "description": "CRITBATCH_MAX_RUNNING sweeps are running: retry after Retry-After seconds",
        },
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
                "application/yaml": {"schema": {"type": "string", "description": "the spec as YAML"}},
            },
        }
    },
)
async def submit_sweep(
    request: Request,
    sweep_id: str | None = Query(
        None,
        max_length=200,
        description="the sweep id (Ray submission id); default NAME-FINGERPRINT, so an identical spec is not run twice",
    ),
    settings: Settings = Depends(get_settings),
    jobs: SweepJobs = Depends(get_jobs),
    backend: Backend = Depends(get_backend),
) -> Any:
    """Validate the spec and submit it as a Ray Job. 201 with the sweep id; 409 if that id exists;
    429 (with ``Retry-After``) when ``CRITBATCH_MAX_RUNNING`` sweeps are pending or running."""
    body = await request.body()
    try:
        # parsing and validating a large body takes CPU seconds: never on the event loop (a SpecError
        # is answered by service.errors: 422 with every invalid field)
        spec = await backend.parse(parse_body, request.headers.get("content-type"), body)
    except BodyError as exc:
        raise HTTPException(status_code=exc.status, detail=str(exc)) from None
    if sweep_id is not None:
        try:
            check_sweep_id(sweep_id)
        except InvalidInput as exc:
            return invalid_response([("sweep_id", str(exc))], "invalid request")
    refused = policy_errors(spec, settings)
    if refused:
        return invalid_response(refused, "the spec names a location the service does not allow")
    state, warnings = await backend.call(lambda: _submit(spec, sweep_id, settings, jobs, backend))
    body_out = {"id": state.id, "status": state.status, "warnings": warnings, "links": sweep_out(state)["links"]}
    return JSONResponse(status_code=201, content=body_out, headers={"Location": f"/v1/sweeps/{state.id}"})


@router.get("/sweeps", response_model=SweepPageOut, responses=INVALID_RESPONSE)
async def list_sweeps(
    limit: int = Query(20, ge=1, le=100, description="page size"),
    offset: int = Query(0, ge=0, le=1_000_000, description="sweeps to skip (newest first)"),
    jobs: SweepJobs = Depends(get_jobs),
    backend: Backend = Depends(get_backend),
) -> Any:
    """Submitted sweeps, newest first, one page at a time (status only; no trial counts)."""
    states, total = await backend.call(lambda: jobs.list(limit=limit, offset=offset))
    nxt = offset + len(states)
    return {
        "items": [sweep_out(s) for s in states],
        "total": total,
        "limit": limit,
        "offset": offset,
        "next_offset": nxt if nxt < total else None,
    }


@router.get("/sweeps/{sweep_id}", response_model=SweepOut, responses=NOT_FOUND_RESPONSE)
async def get_sweep(
    sweep_id: str = Depends(sweep_id_path), jobs: SweepJobs = Depends(get_jobs), backend: Backend = Depends(get_backend)
) -> Any:
    """Status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), reason, trial counts, best trial so far."""
    return sweep_out(await backend.call(lambda: jobs.get(sweep_id)))


@router.delete(
    "/sweeps/{sweep_id}",
    response_model=SweepStoppedOut,
    responses={
        **NOT_FOUND_RESPONSE,
        **INVALID_RESPONSE,
        202: {"model": SweepStoppedOut, "description": "stop sent, still stopping"},
    },
)
async def stop_sweep(
    sweep_id: str = Depends(sweep_id_path),
    wait_s: float = Query(30.0, ge=0, le=120, description="seconds to wait for the job to end"),
    settings: Settings = Depends(get_settings),
    jobs: SweepJobs = Depends(get_jobs),
    backend: Backend = Depends(get_backend),
) -> Any:
    """Stop the sweep (its Ray job). 200 once it has ended (STOPPED, or its earlier final status); 202 if still stopping."""
    state, sent = await backend.call(
        lambda: jobs.stop(sweep_id, wait_s=wait_s), timeout_s=wait_s + settings.request_timeout_s
    )
    return JSONResponse(status_code=200 if state.terminal else 202, content=sweep_out(state, stop_sent=sent))


@router.get(
    "/sweeps/{sweep_id}/logs",
    response_class=PlainTextResponse,
    # error bodies stay JSON (a response_class of text/plain would document them as text)
    responses={
        **json_error_responses({**ERROR_RESPONSES, **NOT_FOUND_RESPONSE, **INVALID_RESPONSE}),
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
    },
)
async def sweep_logs(
    sweep_id: str = Depends(sweep_id_path),
    tail: int | None = Query(None, ge=1, le=100_000, description="only the last N lines"),
    jobs: SweepJobs = Depends(get_jobs),
    backend: Backend = Depends(get_backend),
) -> Any:
    """The driver's log (the job's stdout and stderr), at most the last 5 MiB."""
    data = (await backend.call(lambda: jobs.logs(sweep_id, tail_lines=tail))).encode("utf-8", "replace")
    if len(data) > LOG_MAX_BYTES:
        data = b"[... truncated ...]\n" + data[-LOG_MAX_BYTES:]
    return PlainTextResponse(data.decode("utf-8", "replace"))


@router.get(
    "/sweeps/{sweep_id}/report",
    response_model=ReportOut,
    responses={
        **NOT_FOUND_RESPONSE,
        409: {"model": ErrorOut, "description": "no report yet (running) or none (failed)"},
    },
)
async def sweep_report(
    sweep_id: str = Depends(sweep_id_path),
    settings: Settings = Depends(get_settings),
    jobs: SweepJobs = Depends(get_jobs),
    backend: Backend = Depends(get_backend),
) -> Any:
    """The sweep's cbs.json (from its MLflow parent run) with links to its MLflow runs."""
    return finite(await backend.call(lambda: jobs.report(sweep_id, ui_url=settings.mlflow_ui_url)))
