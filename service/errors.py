"""HTTP errors: the one mapping from the backend's errors to responses, and the app's handlers.

The backend (:mod:`sweeps.remote`) raises plain exceptions; the routes let them propagate, and the
handlers installed by :func:`install_error_handlers` answer each with :func:`error_response`:

| error | status |
|---|---|
| ``SweepNotFound`` | 404 |
| ``SweepExists`` | 409 with ``id``, ``status``, ``same_spec`` |
| ``ReportNotReady`` | 409 |
| ``TooManySweeps`` | 429 with ``Retry-After: RETRY_AFTER_S`` |
| ``BackendTimeout`` | 504 |
| ``ClusterUnavailable`` | 503 |
| ``SpecError`` | 422 with ``errors`` (every invalid field of the spec by its path) |
| ``StagingError`` / other ``InvalidInput`` | 422 with ``errors`` (every field by its path) |

Any other exception is a bug and answers 500.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.schemas import ErrorOut, InvalidRequestOut
from sweeps.errors import InvalidInput
from sweeps.remote import (
    BackendTimeout,
    ClusterUnavailable,
    ReportNotReady,
    StagingError,
    SweepExists,
    SweepNotFound,
    TooManySweeps,
)
from sweeps.spec import SpecError

__all__ = [
    "BACKEND_ERRORS",
    "ERROR_RESPONSES",
    "INVALID_RESPONSE",
    "NOT_FOUND_RESPONSE",
    "RETRY_AFTER_S",
    "error_response",
    "install_error_handlers",
    "invalid_response",
    "json_error_responses",
]

#: ``Retry-After`` (seconds) of a 429 when the service runs ``max_running`` sweeps already.
RETRY_AFTER_S = 60
#: The backend errors a route may raise and :func:`error_response` answers.
BACKEND_ERRORS = (SweepNotFound, SweepExists, ReportNotReady, ClusterUnavailable, InvalidInput, TooManySweeps)
#: Errors answered ``{"detail": message}``, by status; the first class that matches wins.
_DETAIL_STATUS = (
    (SweepNotFound, 404),
    (ReportNotReady, 409),
    (TooManySweeps, 429),
    (BackendTimeout, 504),
    (ClusterUnavailable, 503),
)

#: The error answers every ``/v1`` route documents.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "missing or wrong bearer token"},
    422: {"model": InvalidRequestOut, "description": "invalid request: every invalid field by its path"},
    413: {"model": ErrorOut, "description": "request body too large"},
    503: {"model": ErrorOut, "description": "the Ray cluster cannot be reached"},
    504: {
        "model": ErrorOut,
        "description": "the Ray job server or MLflow did not answer in time (the detail names which)",
    },
}
NOT_FOUND_RESPONSE: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no sweep with this id"}}
INVALID_RESPONSE: dict[int | str, dict[str, Any]] = {
    422: {"model": InvalidRequestOut, "description": "invalid request: every invalid field by its path"}
}


def json_error_responses(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """``responses`` with each model spelled out as an application/json content (for a route whose
    own response class is not JSON)."""
    return {
        code: {
            "description": r["description"],
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{r['model'].__name__}"}}},
        }
        for code, r in responses.items()
    }


def invalid_response(errors: list[tuple[str, str]], detail: str = "invalid sweep spec") -> JSONResponse:
    """422 with ``detail`` and ``errors``: ``[{"path", "message"}]`` for each ``(field path, message)``."""
    return JSONResponse(
        status_code=422,
        content={"detail": detail, "errors": [{"path": p, "message": m} for p, m in errors]},
    )


def error_response(exc: Exception) -> JSONResponse:
    """The answer to one of :data:`BACKEND_ERRORS` (see the module's table); 500 for anything else."""
    if isinstance(exc, SweepExists):
        return JSONResponse(
            status_code=409,
            # a REST client picks the id with the query parameter, not the CLI's --sweep-id
            content={
                "detail": exc.describe("id with ?sweep_id="),
                "id": exc.sweep_id,
                "status": exc.status,
                "same_spec": exc.same_spec,
            },
        )
    if isinstance(exc, SpecError):
        return invalid_response(exc.errors)
    if isinstance(exc, StagingError):
        return invalid_response([(exc.path, str(exc))], "an input of the submission is refused")
    if isinstance(exc, InvalidInput):
        return invalid_response([("<root>", str(exc))], "invalid request")
    for cls, status in _DETAIL_STATUS:
        if isinstance(exc, cls):
            headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None
            return JSONResponse(status_code=status, content={"detail": str(exc)}, headers=headers)
    return JSONResponse(status_code=500, content={"detail": "Internal Server Error"})


async def _backend_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code == 405:
        # Starlette's Allow lists the methods of the first route matching the path only.
        path = request.url.path
        allowed = sorted(
            {
                m
                for r in request.app.routes
                if isinstance(r, APIRoute) and r.path_regex.match(path)
                for m in (r.methods or ())
            }
        )
        return JSONResponse({"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": ", ".join(allowed)})
    return await http_exception_handler(request, exc)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [(".".join(str(p) for p in e.get("loc", ())) or "<root>", str(e.get("msg", ""))) for e in exc.errors()]
    return invalid_response(errors, "invalid request")


def install_error_handlers(app: FastAPI) -> None:
    """Answer HTTP errors (405 with the full ``Allow``), validation errors (422 by field path) and
    :data:`BACKEND_ERRORS` (:func:`error_response`) on ``app``."""
    # Starlette types every handler as taking Exception; it calls each only with its own class
    app.add_exception_handler(StarletteHTTPException, _http_error)  # pyright: ignore[reportArgumentType]
    app.add_exception_handler(RequestValidationError, _validation_error)  # pyright: ignore[reportArgumentType]
    for cls in BACKEND_ERRORS:
        app.add_exception_handler(cls, _backend_error)
