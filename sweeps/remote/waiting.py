"""What a backend call is waiting on (the Ray job server or MLflow, and which request), so that a caller
that gives up on the call can say which one did not answer: the REST service's 504 names it.

The caller makes one :class:`Waiting` per call and runs the call through :meth:`Waiting.run` (on any
thread); :class:`~sweeps.remote.jobs.SweepJobs` marks each request it makes with :func:`waiting_on`. The
marks reach the call's own :class:`Waiting` through a context variable, so concurrent calls on a thread
pool never see each other's; outside :meth:`Waiting.run` they cost nothing and go nowhere.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["MLFLOW", "RAY_JOB_SERVER", "Waiting", "waiting_on"]

#: The backends a call may wait on, as a message names them (no address: the service's errors quote none).
RAY_JOB_SERVER = "the Ray job server"
MLFLOW = "MLflow"

T = TypeVar("T")
_CURRENT: contextvars.ContextVar[Waiting | None] = contextvars.ContextVar("critbatch_waiting", default=None)


class Waiting:
    """One call's record of what it waits on now.

    Attributes:
        started: the call has begun running (False: it still waits for a thread).
        on: ``(backend, request)`` while a marked request is under way, else None.
    """

    def __init__(self) -> None:
        self.started = False
        self.on: tuple[str, str] | None = None

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, with every :func:`waiting_on` inside it recorded here."""
        self.started = True
        token = _CURRENT.set(self)
        try:
            return fn(*args)
        finally:
            _CURRENT.reset(token)

    def describe(self, limit_s: float) -> str:
        """Who did not answer within ``limit_s`` seconds, as one sentence without addresses."""
        on = self.on  # one read: the call's thread may change it meanwhile
        if on is not None:
            return f"{on[0]} did not answer within {limit_s:g} s (waiting on {on[1]})"
        if not self.started:
            return f"no backend thread was free within {limit_s:g} s (each waits on the Ray job server or MLflow)"
        return f"the Ray job server or MLflow did not answer within {limit_s:g} s"


@contextlib.contextmanager
def waiting_on(backend: str, request: str) -> Iterator[None]:
    """Mark the block as waiting on ``backend`` (:data:`RAY_JOB_SERVER`, :data:`MLFLOW`) for ``request`` in the
    :class:`Waiting` of the call it runs in, if any; the previous mark is restored when the block ends."""
    waiting = _CURRENT.get()
    if waiting is None:
        yield
        return
    before = waiting.on
    waiting.on = (backend, request)
    try:
        yield
    finally:
        waiting.on = before
