"""``/healthz`` (liveness) and ``/readyz`` (readiness); neither needs the token."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from service.deps import Backend, get_backend, get_jobs, get_settings
from service.schemas import HealthOut, ReadyOut
from service.settings import Settings
from sweeps.remote import BackendTimeout, SweepJobs

__all__ = ["router"]

log = logging.getLogger("critbatch.service")
router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> dict[str, str]:
    """Liveness: the event loop serves requests (no token; touches neither Ray nor MLflow, no thread)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut, "description": "not ready"}})
async def readyz(
    settings: Settings = Depends(get_settings),
    jobs: SweepJobs = Depends(get_jobs),
    backend: Backend = Depends(get_backend),
) -> JSONResponse:
    """Readiness: what a submission needs answers within ``CRITBATCH_READY_TIMEOUT_S`` (no token): Ray's job
    server lists its jobs (:meth:`SweepJobs.ping_ray`; its version route alone is not enough) and MLflow
    answers. A dependency that does not is named by its key, with the request that got no answer."""
    checks: dict[str, str] = {}
    for name, fn in (("ray", jobs.ping_ray), ("mlflow", jobs.ping_mlflow)):
        try:
            checks[name] = await backend.ready(fn, settings.ready_timeout_s)
        except BackendTimeout as exc:  # the check's limit, or the job client's own request timeout
            checks[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; no detail leaves the service
            log.warning("readiness check %s failed: %s", name, exc)
            checks[name] = f"unavailable ({type(exc).__name__})"
    ok = all(v in ("ok", "not configured") for v in checks.values())
    return JSONResponse(status_code=200 if ok else 503, content={"status": "ok" if ok else "unavailable", **checks})
