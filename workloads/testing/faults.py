"""Fault injection for the suite's sweeps: a :class:`~workloads.train.hooks.MilestoneHook` that fails or holds
a trial at a milestone, configured from the environment of the trial process.

Turned on by ``CRITBATCH_TEST_MILESTONE_HOOKS=workloads.testing.faults:hold_from_env`` together with
``CRITBATCH_TEST_HOLD_AT_MILESTONE`` (a milestone index) and ``CRITBATCH_TEST_HOLD_FILE`` (the file that
holds the worker after that report), ``CRITBATCH_TEST_HOLD_EVERY_ATTEMPT=1`` (hold a trial resumed from its
checkpoint too), and ``CRITBATCH_TEST_HOLD_BATCH_SIZES`` (comma-separated: only trials of these batch sizes,
in sequences, are held). :data:`HOLD_HOOKS` is the first variable's value.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from workloads.config import TrialConfig
from workloads.train.hooks import MilestoneHook

__all__ = ["HOLD_HOOKS", "FaultPlan", "hold_from_env"]

#: the value of ``CRITBATCH_TEST_MILESTONE_HOOKS`` that turns on :func:`hold_from_env`
HOLD_HOOKS = "workloads.testing.faults:hold_from_env"


@dataclass(frozen=True, kw_only=True)
class FaultPlan(MilestoneHook):
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


def hold_from_env(cfg: TrialConfig) -> list[FaultPlan]:
    """The trial's hold plan from the ``CRITBATCH_TEST_HOLD_*`` variables (module docstring), or none.

    ``cfg.batch.batch_size_sequences`` is matched against ``CRITBATCH_TEST_HOLD_BATCH_SIZES``.
    """
    hold_at = os.environ.get("CRITBATCH_TEST_HOLD_AT_MILESTONE")
    hold_file = os.environ.get("CRITBATCH_TEST_HOLD_FILE") or None
    if not hold_at and not hold_file:
        return []
    only = os.environ.get("CRITBATCH_TEST_HOLD_BATCH_SIZES")
    if only and cfg.batch.batch_size_sequences not in {int(b) for b in only.split(",")}:
        return []
    return [
        FaultPlan(
            hold_at_milestone=int(hold_at) if hold_at else None,
            hold_file=hold_file,
            hold_every_attempt=os.environ.get("CRITBATCH_TEST_HOLD_EVERY_ATTEMPT") == "1",
        )
    ]
