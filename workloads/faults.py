"""Fault injection for tests: a plan that only tests set, checked by the loop at each report.

The loop calls :meth:`FaultPlan.before_report` and :meth:`FaultPlan.after_report` at every
milestone report; with ``TrialConfig.faults`` None (every real run) neither is called. The sweep
tests that run real Ray clusters in subprocesses reach the workers only through the environment:
``sweeps/run/trainable.py`` reads ``CRITBATCH_TEST_HOLD_AT_MILESTONE`` / ``CRITBATCH_TEST_HOLD_FILE``
there, in one place, into this object.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["FaultPlan"]


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """What to break, on the first attempt of a trial only (a restored worker group runs clean).

    Attributes:
        fail_at_milestone: raise ``RuntimeError`` at this milestone index (0-based), before its report.
        hold_at_milestone: after reporting this milestone index, wait while ``hold_file`` exists (a
            test kills the worker in that window, then deletes the file).
        hold_file: the file that holds the worker.
        hold_every_attempt: hold a trial restarted from its checkpoint too (a trial that pruning mode
            ``pause`` paused and resumed), not only its first attempt.
    """

    fail_at_milestone: int | None = None
    hold_at_milestone: int | None = None
    hold_file: str | None = None
    hold_every_attempt: bool = False

    def before_report(self, milestone_index: int, attempt: int) -> None:
        """Raises:
            RuntimeError: at ``fail_at_milestone`` on attempt 0.
        """
        if self.fail_at_milestone is not None and attempt == 0 and milestone_index == self.fail_at_milestone:
            raise RuntimeError(f"injected fault at milestone {self.fail_at_milestone}")

    def after_report(self, milestone_index: int, attempt: int, poll_s: float = 0.05) -> None:
        """Block while ``hold_file`` exists, at ``hold_at_milestone`` on attempt 0 (on every attempt with
        ``hold_every_attempt``)."""
        if self.hold_file and (attempt == 0 or self.hold_every_attempt) and milestone_index == self.hold_at_milestone:
            while os.path.exists(self.hold_file):
                time.sleep(poll_s)
