"""Callbacks at a trial's milestone reports: the seam through which tests inject faults.

:func:`workloads.train.loop.run_loop` calls every hook of its ``on_milestone`` list just before and just
after each milestone report; in production the list is empty. Trial processes are reached only through
their environment, so the Ray worker entries (``workloads.ray.adapter``) build the list from
:data:`MILESTONE_HOOKS_VAR` (:func:`milestone_hooks_from_env`), a variable that the sweep's driver forwards
to every trial process (``sweeps.launch.cluster.trial_env`` forwards ``CRITBATCH_TEST_*``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence

from workloads.config import TrialConfig

__all__ = ["MILESTONE_HOOKS_VAR", "MilestoneHook", "milestone_hooks_from_env"]

#: ``module:factory``; ``factory(cfg: TrialConfig)`` returns the trial's hooks (a sequence, maybe empty)
MILESTONE_HOOKS_VAR = "CRITBATCH_TEST_MILESTONE_HOOKS"


class MilestoneHook:
    """Called by the loop around each milestone report; both methods do nothing here.

    ``milestone_index`` is the 0-based index of the milestone just reached; ``attempt`` is 0 for a trial's
    first attempt and 1 for one resumed from a checkpoint.
    """

    def before_report(self, milestone_index: int, attempt: int) -> None:
        """Before the report is handed on (an exception raised here ends the attempt without it)."""

    def after_report(self, milestone_index: int, attempt: int) -> None:
        """After the report is handed on (not after the trial's final report: the loop returns first)."""


def milestone_hooks_from_env(cfg: TrialConfig) -> tuple[MilestoneHook, ...]:
    """The hooks named by :data:`MILESTONE_HOOKS_VAR` for this trial, or none when it is unset (every real run).

    Raises:
        ValueError: the variable is not ``module:factory``.
        ImportError, AttributeError: the module or its factory cannot be found.
    """
    spec = os.environ.get(MILESTONE_HOOKS_VAR)
    if not spec:
        return ()
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{MILESTONE_HOOKS_VAR} must be 'module:factory', got {spec!r}")
    factory: Callable[[TrialConfig], Sequence[MilestoneHook]] = getattr(importlib.import_module(module), name)
    return tuple(factory(cfg))
