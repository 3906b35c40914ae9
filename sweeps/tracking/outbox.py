"""The :class:`Outbox`: MLflow writes queued in order and retried until they succeed, so a tracking server
that is down never blocks training and loses nothing once it is back (used by ``sweeps.tracking.writer``)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Outbox"]

log = logging.getLogger(__name__)


class Outbox:
    """An ordered queue of MLflow writes, retried until they succeed.

    Args:
        name: for log messages.
    """

    def __init__(self, name: str = "mlflow"):
        self.name = name
        self.pending: deque[tuple[str, Callable[[], Any]]] = deque()
        self.failures = 0
        self._warned = False

    def put(self, what: str, fn: Callable[[], Any]) -> None:
        """Queue the write ``fn`` (``what`` names it in logs) and try the queue."""
        self.pending.append((what, fn))
        self.flush()

    def flush(self) -> bool:
        """Try the queued writes in order; stop at the first failure. True when empty."""
        while self.pending:
            what, fn = self.pending[0]
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - any tracking failure is retried later
                self.failures += 1
                if not self._warned:
                    log.warning("MLflow write failed (%s): %s; buffering and retrying", what, exc)
                    self._warned = True
                return False
            self.pending.popleft()
            self._warned = False
        return True

    def drain(self, timeout_s: float = 60.0, interval_s: float = 1.0) -> bool:
        """Retry until the queue is empty or ``timeout_s`` passes. True when everything was written."""
        deadline = time.monotonic() + timeout_s
        while not self.flush():
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval_s)
        return True
