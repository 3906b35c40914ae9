"""The routes' dependencies: settings, the token check, the Ray Jobs client, the thread pools
backend calls run on, and the sweep id of a path.

Everything a route needs is on ``app.state`` (set by :func:`service.app.create_app`) and reached
through these; no module-level state.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.settings import Settings
from sweeps.remote import BackendTimeout, SweepJobs
from sweeps.remote.waiting import RAY_JOB_SERVER, Waiting, waiting_on
from sweeps.spec.identity import is_valid_sweep_id

__all__ = [
    "EXAMPLE_SWEEP_ID",
    "Backend",
    "get_backend",
    "get_jobs",
    "get_settings",
    "reject_unknown_query",
    "require_token",
    "sweep_id_path",
]

_bearer = HTTPBearer(auto_error=False, description="the service's CRITBATCH_API_TOKEN")
#: The id the schema shows as an example (the example spec's default id has this shape).
EXAMPLE_SWEEP_ID = "shakespeare-char-9d8711f3bc"


class Backend:
    """The thread pools blocking work runs on, so that a stuck dependency or a flood of large bodies
    can neither block the event loop (``/healthz``) nor take every thread.

    Args:
        settings: ``backend_threads`` (Ray and MLflow calls) and ``request_timeout_s`` (the longest
            a route waits for them).

    Attributes:
        submit_lock: held while a submission counts the active sweeps and submits, so that
            ``CRITBATCH_MAX_RUNNING`` holds for concurrent POSTs.
    """

    def __init__(self, settings: Settings):
        self.request_timeout_s = settings.request_timeout_s
        self.pool = ThreadPoolExecutor(max_workers=settings.backend_threads, thread_name_prefix="critbatch-backend")
        self.parse_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="critbatch-parse")
        self.ready_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="critbatch-ready")
        self.submit_lock = threading.Lock()

    async def call(self, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """``fn()`` on the backend pool; its errors propagate (see :mod:`service.errors`).

        Raises:
            BackendTimeout: no answer within ``timeout_s`` seconds (default ``request_timeout_s``): 504, naming
                the backend and the request ``fn`` was waiting on (:class:`sweeps.remote.waiting.Waiting`), or
                that no backend thread was free.
        """
        limit = timeout_s if timeout_s is not None else self.request_timeout_s
        waiting = Waiting()
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(self.pool, waiting.run, fn), limit)
        except TimeoutError:
            raise BackendTimeout(waiting.describe(limit)) from None

    @contextlib.contextmanager
    def submitting(self) -> Iterator[None]:
        """Hold :attr:`submit_lock` for the block; the wait for it counts as a wait on the Ray job server, which
        the submission ahead is calling (a 504 then names it)."""
        with waiting_on(RAY_JOB_SERVER, "the submission ahead of this one"):
            self.submit_lock.acquire()
        try:
            yield
        finally:
            self.submit_lock.release()

    async def parse(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the parse pool (request bodies: CPU seconds for a large one)."""
        return await asyncio.get_running_loop().run_in_executor(self.parse_pool, fn, *args)

    async def ready(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """``fn()`` on the readiness pool.

        Raises:
            BackendTimeout: no answer within ``timeout_s`` seconds, naming what ``fn`` was waiting on.
        """
        waiting = Waiting()
        try:
            return await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(self.ready_pool, waiting.run, fn), timeout_s
            )
        except TimeoutError:
            raise BackendTimeout(waiting.describe(timeout_s)) from None


async def get_settings(request: Request) -> Settings:
    """The app's :class:`Settings`."""
    return request.app.state.settings


async def get_jobs(request: Request) -> SweepJobs:
    """The app's Ray Jobs + MLflow client."""
    return request.app.state.jobs


async def get_backend(request: Request) -> Backend:
    """The app's :class:`Backend` (thread pools)."""
    return request.app.state.backend


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
        raise HTTPException(
            status_code=401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )


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


async def sweep_id_path(
    sweep_id: str = Path(
        description="the sweep id (also the Ray submission id)", max_length=200, examples=[EXAMPLE_SWEEP_ID]
    ),
) -> str:
    """The ``{sweep_id}`` of the path; 404 when it cannot be a sweep id (the backend is not asked)."""
    if not is_valid_sweep_id(sweep_id):
        raise HTTPException(status_code=404, detail=f"no sweep with id {sweep_id!r}")
    return sweep_id
