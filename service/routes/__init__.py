"""The service's routes: ``/healthz`` and ``/readyz`` (:mod:`service.routes.health`, no token) and
``/v1/sweeps...`` (:mod:`service.routes.sweeps`, behind the token)."""

from service.routes.health import router as health_router
from service.routes.sweeps import router as sweeps_router

__all__ = ["health_router", "sweeps_router"]
