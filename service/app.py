"""The REST API: submit sweeps to a Ray cluster as Ray Jobs and read them back from Ray and MLflow.

The service keeps no state: Ray Jobs (one job per sweep, submission id = sweep id) and MLflow
(the sweep's runs) are the record, so a restart loses nothing. Every route but ``/healthz`` and
``/readyz`` requires ``Authorization: Bearer <CRITBATCH_API_TOKEN>``; request bodies are size-limited.

Create the app with :func:`create_app` (``critbatch serve`` does, or
``uvicorn --factory service.app:create_app``, which reads the settings from the environment). The
routes are in :mod:`service.routes`, their dependencies in :mod:`service.deps`, the error answers in
:mod:`service.errors`, the bodies in :mod:`service.body` and :mod:`service.schemas`.
"""

from __future__ import annotations

from fastapi import FastAPI

from service.body import BodyLimitMiddleware
from service.deps import Backend
from service.errors import install_error_handlers
from service.openapi import install_openapi
from service.routes import health_router, sweeps_router
from service.settings import Settings
from sweeps.remote import SweepJobs

__all__ = ["API_VERSION", "LIST_CACHE_S", "create_app"]

API_VERSION = "1.0.0"
#: ``GET /v1/sweeps`` answers at most this old are shared between concurrent callers (seconds).
LIST_CACHE_S = 1.0


def create_app(settings: Settings | None = None, *, jobs: SweepJobs | None = None) -> FastAPI:
    """The FastAPI app.

    Args:
        settings: default :meth:`Settings.from_env` (which refuses to start without a token).
        jobs: the Ray Jobs + MLflow backend; default one for ``settings.ray_address``. Either way it
            reads MLflow at the service's tracking URI only and its errors quote no backend
            (:meth:`SweepJobs.serve_only`).

    Raises:
        SettingsError: from :meth:`Settings.from_env` when ``settings`` is not given.
    """
    settings = settings or Settings.from_env()
    jobs = jobs or SweepJobs(
        settings.ray_address,
        tracking_uri=settings.tracking_uri,
        ray_timeout_s=settings.ray_timeout_s,
        list_cache_s=LIST_CACHE_S,
    )
    jobs.serve_only(settings.tracking_uri)
    app = FastAPI(
        title="critbatch",
        version=API_VERSION,
        description="Submit critical-batch-size sweeps to a Ray cluster; read status, logs and reports "
        "from Ray Jobs and MLflow. Every route but /healthz needs `Authorization: Bearer <token>`.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by install_openapi, behind the token
    )
    app.state.settings = settings
    app.state.jobs = jobs
    app.state.backend = Backend(settings)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.include_router(health_router)
    app.include_router(sweeps_router)
    install_openapi(app)
    return app
