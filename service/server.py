"""Run the service with uvicorn (``critbatch serve``)."""

from __future__ import annotations

import os

from service.settings import Settings, SettingsError
from sweeps.spec.identity import is_loopback_host

__all__ = ["SettingsError", "check_serve_settings", "serve"]


def check_serve_settings(*, host: str, local_only: bool) -> Settings:
    """The settings to serve with, or :class:`SettingsError` on a refused combination.

    Without ``CRITBATCH_API_TOKEN`` the service starts only with ``local_only`` on a loopback
    host; ``local_only`` on any other host is refused even with a token.
    """
    if local_only and not is_loopback_host(host):
        raise SettingsError(f"--local-only serves on a loopback address (127.0.0.1, ::1, localhost) only, not {host!r}")
    return Settings.from_env(local_only=local_only)


def serve(*, host: str, port: int, local_only: bool = False, log_level: str = "info") -> None:
    """Serve the API until interrupted.

    Raises:
        SettingsError: no token (and not local-only on loopback), or a malformed setting.
    """
    settings = check_serve_settings(host=host, local_only=local_only)
    # Reads of an unreachable MLflow server fail within seconds instead of retrying for minutes.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, round(settings.mlflow_timeout_s)))
    import uvicorn

    from service.app import create_app

    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
