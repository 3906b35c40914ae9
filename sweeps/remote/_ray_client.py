"""Ray's job client, made for exactly one address and with a timeout on every request.

The one place that touches the internals of ``ray.job_submission.JobSubmissionClient``: its
private ``_do_request`` (overridden to add a timeout) and the environment variables it reads its
address from. Imported by :mod:`sweeps.remote.jobs`; Ray is imported only when a client is made.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["make_client", "is_not_found"]

_ENV_LOCK = threading.Lock()


def make_client(address: str | None, headers: dict[str, str] | None, timeout_s: float | None = None) -> Any:
    """A ``JobSubmissionClient`` for exactly ``address``; with ``timeout_s``, every HTTP request it
    makes (the version check in its constructor included) gives up after that long.

    Ray lets ``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS`` override the ``address`` argument; an
    explicit address must win, so they are hidden while the client resolves its address.
    """
    from ray.job_submission import JobSubmissionClient

    if timeout_s is not None:
        class _TimedClient(JobSubmissionClient):
            def _do_request(self, method, endpoint, **kwargs):  # noqa: ANN001 - Ray's signature
                kwargs.setdefault("timeout", timeout_s)
                return super()._do_request(method, endpoint, **kwargs)

        JobSubmissionClient = _TimedClient  # noqa: N806

    if address is None:
        return JobSubmissionClient(None, headers=headers)
    keys = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
    if all(os.environ.get(k) in (None, address) for k in keys):
        return JobSubmissionClient(address, headers=headers)
    with _ENV_LOCK:
        saved = {k: os.environ.pop(k) for k in keys if k in os.environ}
        try:
            return JobSubmissionClient(address, headers=headers)
        finally:
            os.environ.update(saved)


def is_not_found(exc: Exception) -> bool:
    """Whether a ``RuntimeError`` of Ray's job client says the job does not exist."""
    s = str(exc)
    return "status code 404" in s or "does not exist" in s
