"""The REST API: submit sweeps to a Ray cluster as Ray Jobs and read them back from Ray and MLflow.

The service keeps no state: Ray Jobs (one job per sweep, submission id = sweep id) and MLflow
(the sweep's runs) are the record, so a restart loses nothing. Every route but ``/healthz``
requires ``Authorization: Bearer <CRITBATCH_API_TOKEN>``; request bodies are size-limited.

Create the app with :func:`create_app` (``critbatch serve`` does, or
``uvicorn --factory service.app:create_app``, which reads the settings from the environment).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

import yaml
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.schemas import (
    ConflictOut,
    ErrorOut,
    HealthOut,
    InvalidRequestOut,
    ReadyOut,
    ReportOut,
    SweepCreatedOut,
    SweepOut,
    SweepPageOut,
    SweepStoppedOut,
    finite,
)
from service.policy import policy_errors
from service.settings import Settings
from sweeps.errors import InvalidInput
from sweeps.remote.jobs import (
    BackendTimeout,
    ClusterUnavailable,
    ReportNotReady,
    StagingError,
    SweepExists,
    SweepJobs,
    SweepNotFound,
    SweepState,
    StagingLimits,
    TooManySweeps,
    check_sweep_id,
    default_job_python,
    is_valid_sweep_id,
    staged_sweep,
)
from sweeps.spec import SpecError, SweepSpec, parse_spec

__all__ = ["create_app", "API_VERSION", "LOG_MAX_BYTES", "EXAMPLE_SWEEP_ID"]

API_VERSION = "1.0.0"
#: The logs route returns at most this many bytes (the end of the log).
LOG_MAX_BYTES = 5 * 1024 * 1024
JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")

_bearer = HTTPBearer(auto_error=False, description="the service's CRITBATCH_API_TOKEN")
log = logging.getLogger("critbatch.service")
#: Ray job statuses that hold a place under ``CRITBATCH_MAX_RUNNING``.
ACTIVE_RAY_STATUSES = ("PENDING", "RUNNING")
#: ``Retry-After`` (seconds) of a 429 when the service runs ``max_running`` sweeps already.
RETRY_AFTER_S = 60
#: ``GET /v1/sweeps`` answers at most this old are shared between concurrent callers (seconds).
LIST_CACHE_S = 1.0


# ---- request body: size limit, parsing --------------------------------------------------------


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, by ``Content-Length`` or by counting."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reply(send, 400, "malformed Content-Length")
                    return
                if declared > self.max_bytes:
                    await self._reply(send, 413, f"request body larger than {self.max_bytes} bytes")
                    return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._reply(send, 413, f"request body larger than {self.max_bytes} bytes")
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _reply(send: Callable, status: int, detail: str) -> None:
        payload = json.dumps({"detail": detail}).encode()
        await send({
            "type": "http.response.start", "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                        (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": payload})


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases (which can expand a small body into a huge one)."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not accepted", event.start_mark)
        return super().compose_node(parent, index)


#: YAML bodies up to this size are parsed with libyaml (fast, but it holds the GIL while it builds
#: the whole document: ~1.8 s per MiB here, which would stall the event loop); larger ones with
#: the pure-Python parser, which yields the GIL every few milliseconds.
C_YAML_MAX_BYTES = 64 * 1024


def _load_yaml(text: str) -> Any:
    """Safe YAML without anchors and aliases (libyaml for small bodies, see :data:`C_YAML_MAX_BYTES`).

    Raises:
        yaml.YAMLError: not YAML, or an alias (``*name``).
    """
    if not getattr(yaml, "__with_libyaml__", False) or len(text) > C_YAML_MAX_BYTES:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not accepted", event.start_mark)
    return yaml.load(text, Loader=yaml.CSafeLoader)  # noqa: S506 - safe constructor


class _BodyError(ValueError):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(content_type: str | None, body: bytes) -> SweepSpec:
    """The spec in a request body (YAML or JSON by ``Content-Type``).

    Raises:
        _BodyError: 415 for another media type.
        SpecError: not parseable, or invalid fields (each named by its path).
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    is_json = media in JSON_TYPES or media.endswith("+json")
    if not is_json and media not in YAML_TYPES:
        raise _BodyError(415, "send the spec as application/yaml or application/json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError([("<root>", "the body is not UTF-8 text")]) from None
    if not text.strip():
        raise SpecError([("<root>", "the body is empty: send a sweep spec")])
    try:
        data = json.loads(text, parse_constant=_reject_constant) if is_json else _load_yaml(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        kind = "JSON" if is_json else "YAML"
        raise SpecError([("<root>", f"not valid {kind}: {str(exc)[:500]}")]) from None
    try:
        return parse_spec(data)
    except RecursionError:
        raise SpecError([("<root>", "the spec is nested too deeply")]) from None


# ---- dependencies ------------------------------------------------------------------------------


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_jobs(request: Request) -> SweepJobs:
    return request.app.state.jobs


def require_token(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    settings: Settings = Depends(get_settings),
) -> None:
    """401 unless the request carries ``Authorization: Bearer <token>`` (constant-time compare)."""
    if settings.api_token is None:  # local-only on loopback, started explicitly so
        return
    given = credentials.credentials if credentials is not None and credentials.scheme.lower() == "bearer" else ""
    # digests first: equal lengths, so the comparison does not even reveal the token's length
    given_digest = hashlib.sha256(given.encode("utf-8", "surrogateescape")).digest()
    if not hmac.compare_digest(given_digest, hashlib.sha256(settings.api_token.encode("utf-8")).digest()):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


def reject_unknown_query(request: Request) -> None:
    """422 for query parameters the operation does not declare (a typo is not silently ignored)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    op = request.app.openapi().get("paths", {}).get(route.path_format, {}).get(request.method.lower(), {})
    known = {p["name"] for p in op.get("parameters", []) if p.get("in") == "query"}
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        raise RequestValidationError(
            [{"loc": ("query", k), "msg": "unknown query parameter", "type": "extra_forbidden"} for k in unknown]
        )


# ---- errors (HTTP errors are raised here, in the route layer, only) ------------------------------


def _invalid(errors: list[tuple[str, str]], detail: str = "invalid sweep spec") -> JSONResponse:
    return JSONResponse(
        status_code=422,
        content={"detail": detail, "errors": [{"path": p, "message": m} for p, m in errors]},
    )


def _http_error(exc: Exception) -> HTTPException | JSONResponse:
    if isinstance(exc, SweepNotFound):
        return HTTPException(status_code=404, detail=str(exc))
    if isinstance(exc, SweepExists):
        return JSONResponse(
            status_code=409,
            content={"detail": str(exc), "id": exc.sweep_id, "status": exc.status, "same_spec": exc.same_spec},
        )
    if isinstance(exc, ReportNotReady):
        return HTTPException(status_code=409, detail=str(exc))
    if isinstance(exc, TooManySweeps):
        return HTTPException(status_code=429, detail=str(exc), headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, BackendTimeout):
        return HTTPException(status_code=504, detail=str(exc))
    if isinstance(exc, ClusterUnavailable):
        return HTTPException(status_code=503, detail=str(exc))
    if isinstance(exc, StagingError):
        return _invalid([(exc.path, str(exc))], "the submission is too big")
    if isinstance(exc, InvalidInput):
        return _invalid([("<root>", str(exc))], "invalid request")
    raise exc


def _run(fn: Callable[[], Any]) -> Any:
    """Call a backend function, turning its known errors into HTTP responses."""
    try:
        return fn()
    except (SweepNotFound, SweepExists, ReportNotReady, ClusterUnavailable, InvalidInput, TooManySweeps) as exc:
        err = _http_error(exc)
        if isinstance(err, HTTPException):
            raise err from None
        return err


def _sweep_out(state: SweepState, **extra: Any) -> dict[str, Any]:
    d = finite(state.to_dict())
    d["links"] = {
        "self": f"/v1/sweeps/{state.id}",
        "logs": f"/v1/sweeps/{state.id}/logs",
        "report": f"/v1/sweeps/{state.id}/report",
    }
    d.update(extra)
    return d


_ERRORS = {
    401: {"model": ErrorOut, "description": "missing or wrong bearer token"},
    422: {"model": InvalidRequestOut, "description": "invalid request: every invalid field by its path"},
    413: {"model": ErrorOut, "description": "request body too large"},
    503: {"model": ErrorOut, "description": "the Ray cluster cannot be reached"},
    504: {"model": ErrorOut, "description": "the Ray cluster or MLflow did not answer in time"},
}
_NOT_FOUND = {404: {"model": ErrorOut, "description": "no sweep with this id"}}
_INVALID = {422: {"model": InvalidRequestOut, "description": "invalid request: every invalid field by its path"}}


def _json_errors(responses: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``responses`` with each model spelled out as an application/json content."""
    return {
        code: {"description": r["description"],
               "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{r['model'].__name__}"}}}}
        for code, r in responses.items()
    }


#: The id the schema shows as an example (the example spec's default id has this shape).
EXAMPLE_SWEEP_ID = "shakespeare-char-9d8711f3bc"


def _sweep_id_param() -> Any:
    return Path(description="the sweep id (also the Ray submission id)", max_length=200, examples=[EXAMPLE_SWEEP_ID])


# ---- the app -----------------------------------------------------------------------------------


def create_app(settings: Settings | None = None, *, jobs: SweepJobs | None = None) -> FastAPI:
    """The FastAPI app.

    Args:
        settings: default :meth:`Settings.from_env` (which refuses to start without a token).
        jobs: the Ray Jobs + MLflow backend; default one for ``settings.ray_address``.
    """
    settings = settings or Settings.from_env()
    jobs = jobs or SweepJobs(settings.ray_address, tracking_uri=settings.tracking_uri,
                             ray_timeout_s=settings.ray_timeout_s, list_cache_s=LIST_CACHE_S)
    # the service reads MLflow at its own tracking URI only, and its errors quote no backend
    jobs.only_tracking_uri = True
    jobs.public_errors = True
    if jobs.tracking_uri is None:
        jobs.tracking_uri = settings.tracking_uri
    # Backend calls and body parsing run on pools of their own: a stuck dependency or a flood of
    # large bodies can neither block the event loop (/healthz) nor take every thread.
    backend_pool = ThreadPoolExecutor(max_workers=settings.backend_threads, thread_name_prefix="critbatch-backend")
    parse_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="critbatch-parse")
    ready_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="critbatch-ready")
    submit_lock = threading.Lock()
    app = FastAPI(
        title="critbatch",
        version=API_VERSION,
        description="Submit critical-batch-size sweeps to a Ray cluster; read status, logs and reports "
        "from Ray Jobs and MLflow. Every route but /healthz needs `Authorization: Bearer <token>`.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind the token
    )
    app.state.settings = settings
    app.state.jobs = jobs
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette's Allow lists the methods of the first route matching the path only.
            path = request.url.path
            allowed = sorted({m for r in app.routes if isinstance(r, APIRoute) and r.path_regex.match(path)
                              for m in (r.methods or ())})
            return JSONResponse({"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": ", ".join(allowed)})
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [(".".join(str(p) for p in e.get("loc", ())) or "<root>", str(e.get("msg", ""))) for e in exc.errors()]
        return _invalid(errors, "invalid request")

    @app.get("/healthz", response_model=HealthOut, tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the event loop serves requests (no token; touches neither Ray nor MLflow, no thread)."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut, "description": "not ready"}},
             tags=["health"])
    async def readyz() -> JSONResponse:
        """Readiness: Ray's job server and MLflow answer within ``CRITBATCH_READY_TIMEOUT_S`` (no token)."""
        loop = asyncio.get_running_loop()
        checks: dict[str, str] = {}
        for name, fn in (("ray", jobs.ping_ray), ("mlflow", jobs.ping_mlflow)):
            try:
                checks[name] = await asyncio.wait_for(loop.run_in_executor(ready_pool, fn), settings.ready_timeout_s)
            except asyncio.TimeoutError:
                checks[name] = f"no answer within {settings.ready_timeout_s:g} s"
            except Exception as exc:  # noqa: BLE001 - any failure means not ready; no detail leaves the service
                log.warning("readiness check %s failed: %s", name, exc)
                checks[name] = f"unavailable ({type(exc).__name__})"
        ok = all(v in ("ok", "not configured") for v in checks.values())
        return JSONResponse(status_code=200 if ok else 503, content={"status": "ok" if ok else "unavailable", **checks})

    async def backend(fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """``fn()`` on the backend pool, its known errors turned into HTTP answers; 504 after ``timeout_s``."""
        limit = timeout_s if timeout_s is not None else settings.request_timeout_s
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(backend_pool, _run, fn), limit)
        except asyncio.TimeoutError:
            raise HTTPException(status_code=504, detail=f"the Ray cluster or MLflow did not answer within {limit:g} s") from None

    api = APIRouter(prefix="/v1", dependencies=[Depends(require_token), Depends(reject_unknown_query)], responses=_ERRORS)

    @api.post(
        "/sweeps",
        status_code=201,
        response_model=SweepCreatedOut,
        responses={**_INVALID, 409: {"model": ConflictOut, "description": "a sweep with this id was already submitted"},
                   415: {"model": ErrorOut, "description": "not YAML or JSON"},
                   429: {"model": ErrorOut, "description": "CRITBATCH_MAX_RUNNING sweeps are running: retry after Retry-After seconds"}},
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
            "application/yaml": {"schema": {"type": "string", "description": "the spec as YAML"}},
        }}},
        tags=["sweeps"],
    )
    async def submit_sweep(
        request: Request,
        sweep_id: str | None = Query(
            None, max_length=200,
            description="the sweep id (Ray submission id); default NAME-FINGERPRINT, so an identical spec is not run twice",
        ),
        settings: Settings = Depends(get_settings),
        jobs: SweepJobs = Depends(get_jobs),
    ) -> Any:
        """Validate the spec and submit it as a Ray Job. 201 with the sweep id; 409 if that id exists;
        429 (with ``Retry-After``) when ``CRITBATCH_MAX_RUNNING`` sweeps are pending or running."""
        body = await request.body()
        try:
            # parsing and validating a large body takes CPU seconds: never on the event loop
            spec = await asyncio.get_running_loop().run_in_executor(parse_pool, parse_body,
                                                                    request.headers.get("content-type"), body)
            if sweep_id is not None:
                check_sweep_id(sweep_id)
        except _BodyError as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from None
        except SpecError as exc:
            return _invalid(exc.errors)
        except InvalidInput as exc:
            return _invalid([("sweep_id", str(exc))], "invalid request")
        refused = policy_errors(spec, settings)
        if refused:
            return _invalid(refused, "the spec names a location the service does not allow")

        def submit() -> tuple[SweepState, list[str]]:
            with staged_sweep(
                spec,
                sweep_id=sweep_id,
                default_tracking_uri=settings.tracking_uri,
                data_root=settings.data_dir,
                ship_data=settings.data_dir is not None,
                limits=StagingLimits.from_mb(ship_data_max_mb=settings.ship_data_max_mb, upload_max_mb=settings.upload_max_mb),
                python=settings.job_python or default_job_python(jobs.address),
                storage_root=settings.storage_root,
            ) as staged:
                with submit_lock:  # the count and the submission as one step: the cap holds for concurrent POSTs
                    return jobs.submit(staged, max_active=settings.max_running), list(staged.warnings)

        out = await backend(submit)
        if isinstance(out, Response):
            return out
        state, warnings = out
        body_out = {"id": state.id, "status": state.status, "warnings": warnings,
                    "links": _sweep_out(state)["links"]}
        return JSONResponse(status_code=201, content=body_out, headers={"Location": f"/v1/sweeps/{state.id}"})

    @api.get("/sweeps", response_model=SweepPageOut, responses=_INVALID, tags=["sweeps"])
    async def list_sweeps(
        limit: int = Query(20, ge=1, le=100, description="page size"),
        offset: int = Query(0, ge=0, le=1_000_000, description="sweeps to skip (newest first)"),
        jobs: SweepJobs = Depends(get_jobs),
    ) -> Any:
        """Submitted sweeps, newest first, one page at a time (status only; no trial counts)."""
        out = await backend(lambda: jobs.list(limit=limit, offset=offset))
        if isinstance(out, Response):
            return out
        states, total = out
        nxt = offset + len(states)
        return {
            "items": [_sweep_out(s) for s in states], "total": total, "limit": limit, "offset": offset,
            "next_offset": nxt if nxt < total else None,
        }

    @api.get("/sweeps/{sweep_id}", response_model=SweepOut, responses=_NOT_FOUND, tags=["sweeps"])
    async def get_sweep(sweep_id: str = _sweep_id_param(), jobs: SweepJobs = Depends(get_jobs)) -> Any:
        """Status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), reason, trial counts, best trial so far."""
        if not is_valid_sweep_id(sweep_id):
            raise HTTPException(status_code=404, detail=f"no sweep with id {sweep_id!r}")
        out = await backend(lambda: jobs.get(sweep_id))
        return out if isinstance(out, Response) else _sweep_out(out)

    @api.delete(
        "/sweeps/{sweep_id}", response_model=SweepStoppedOut,
        responses={**_NOT_FOUND, **_INVALID, 202: {"model": SweepStoppedOut, "description": "stop sent, still stopping"}},
        tags=["sweeps"],
    )
    async def stop_sweep(
        sweep_id: str = _sweep_id_param(),
        wait_s: float = Query(30.0, ge=0, le=120, description="seconds to wait for the job to end"),
        jobs: SweepJobs = Depends(get_jobs),
    ) -> Any:
        """Stop the sweep (its Ray job). 200 once it has ended (STOPPED, or its earlier final status); 202 if still stopping."""
        if not is_valid_sweep_id(sweep_id):
            raise HTTPException(status_code=404, detail=f"no sweep with id {sweep_id!r}")
        out = await backend(lambda: jobs.stop(sweep_id, wait_s=wait_s), timeout_s=wait_s + settings.request_timeout_s)
        if isinstance(out, Response):
            return out
        state, sent = out
        return JSONResponse(status_code=200 if state.terminal else 202, content=_sweep_out(state, stop_sent=sent))

    @api.get(
        "/sweeps/{sweep_id}/logs",
        response_class=PlainTextResponse,
        # error bodies stay JSON (a response_class of text/plain would document them as text)
        responses={**_json_errors({**_ERRORS, **_NOT_FOUND, **_INVALID}),
                   200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
        tags=["sweeps"],
    )
    async def sweep_logs(
        sweep_id: str = _sweep_id_param(),
        tail: int | None = Query(None, ge=1, le=100_000, description="only the last N lines"),
        jobs: SweepJobs = Depends(get_jobs),
    ) -> Any:
        """The driver's log (the job's stdout and stderr), at most the last 5 MiB."""
        if not is_valid_sweep_id(sweep_id):
            raise HTTPException(status_code=404, detail=f"no sweep with id {sweep_id!r}")
        out = await backend(lambda: jobs.logs(sweep_id, tail_lines=tail))
        if isinstance(out, Response):
            return out
        data = out.encode("utf-8", "replace")
        if len(data) > LOG_MAX_BYTES:
            data = b"[... truncated ...]\n" + data[-LOG_MAX_BYTES:]
        return PlainTextResponse(data.decode("utf-8", "replace"))

    @api.get(
        "/sweeps/{sweep_id}/report", response_model=ReportOut,
        responses={**_NOT_FOUND, 409: {"model": ErrorOut, "description": "no report yet (running) or none (failed)"}},
        tags=["sweeps"],
    )
    async def sweep_report(sweep_id: str = _sweep_id_param(), settings: Settings = Depends(get_settings),
                           jobs: SweepJobs = Depends(get_jobs)) -> Any:
        """The sweep's cbs.json (from its MLflow parent run) with links to its MLflow runs."""
        if not is_valid_sweep_id(sweep_id):
            raise HTTPException(status_code=404, detail=f"no sweep with id {sweep_id!r}")
        out = await backend(lambda: jobs.report(sweep_id, ui_url=settings.mlflow_ui_url))
        return out if isinstance(out, Response) else finite(out)

    app.include_router(api)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
    def openapi_json() -> JSONResponse:
        """The OpenAPI schema (behind the token, like every route but /healthz)."""
        return JSONResponse(app.openapi())

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        spec_schema = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, sub in spec_schema.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components["SweepSpec"] = spec_schema
        # OpenAPI links: the id a submission returns addresses the other operations.
        created = schema["paths"]["/v1/sweeps"]["post"]["responses"]["201"]
        created["links"] = {
            name: {"operationId": op_id, "parameters": {"sweep_id": "$response.body#/id"}}
            for name, op_id in (
                ("GetSweep", "get_sweep_v1_sweeps__sweep_id__get"),
                ("StopSweep", "stop_sweep_v1_sweeps__sweep_id__delete"),
                ("SweepLogs", "sweep_logs_v1_sweeps__sweep_id__logs_get"),
                ("SweepReport", "sweep_report_v1_sweeps__sweep_id__report_get"),
            )
        }
        app.openapi_schema = schema
        return schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    return app
