"""The one vocabulary of a sweep's and a trial's status, for every layer: the driver's ``sweep.json``
(``sweeps.store.state``), what a client is told of a submitted sweep (``sweeps.remote.status``, the REST
service's ``SweepStatusName``), the MLflow ``critbatch.status`` tag of a trial run, ``trials.json``, and the
tests of a finished sweep (``sweeps.run.driver``, ``compare``).

``StrEnum`` members are their values: JSON files and MLflow tags hold the same upper-case strings as
before, and a member compares equal to its string.
"""

from __future__ import annotations

import enum

__all__ = [
    "COUNTED_TRIAL_STATUSES",
    "ENDED_TRIAL_STATUSES",
    "FINISHED_STATUSES",
    "SERVED_STATUSES",
    "SWEEP_STATUSES",
    "TERMINAL_STATUSES",
    "TRIAL_STATUSES",
    "SweepStatus",
    "TrialStatus",
]


class SweepStatus(enum.StrEnum):
    """A sweep's status: ``sweep.json``'s ``status`` and the parent run's ``critbatch.status`` tag.

    ``STARTING``: the output folder claimed, the sweep not started; ``PENDING``: a submitted sweep whose
    job waits to run (what a reader reports, never in ``sweep.json``).
    """

    STARTING = "STARTING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class TrialStatus(enum.StrEnum):
    """A trial's status: the ``critbatch.status`` tag of its MLflow run and ``trials.json``'s ``status``.

    ``PAUSED``: waiting at a rung (``pruning.mode: pause``); ``STOPPED``: cut short by a stopped sweep or a
    budget. The loop's own lower-case outcome of a report is ``workloads.api.TrialOutcome``.
    """

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    DIVERGED = "DIVERGED"
    PRUNED = "PRUNED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


S = SweepStatus
# the tuples hold plain strings (a pydantic ``Literal`` of them is the REST schema's, unchanged)
#: ``sweep.json``'s ``status``: ``STARTING``, then the others.
SWEEP_STATUSES = tuple(s.value for s in (S.STARTING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.STOPPED))
#: what a reader of a submitted sweep reports, in order of its life: ``PENDING`` while its job waits to run.
SERVED_STATUSES = tuple(s.value for s in (S.PENDING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.STOPPED))
#: a sweep that has ended, one way or another (a STOPPED one can be resumed).
TERMINAL_STATUSES = frozenset(s.value for s in (S.SUCCEEDED, S.FAILED, S.STOPPED))
#: a sweep that ended with its analysis: nothing is left to resume.
FINISHED_STATUSES = tuple(s.value for s in (S.SUCCEEDED, S.FAILED))
del S
#: every trial status, in the order a trial may pass them
TRIAL_STATUSES = tuple(s.value for s in TrialStatus)
#: the trial statuses ``cbs.json``'s ``trials`` counts, in its order (no RUNNING or PAUSED trial is analysed)
COUNTED_TRIAL_STATUSES = tuple(
    s.value
    for s in (TrialStatus.COMPLETED, TrialStatus.DIVERGED, TrialStatus.FAILED, TrialStatus.PRUNED, TrialStatus.STOPPED)
)
#: a trial that has ended and will not run again on resume (a STOPPED one does)
ENDED_TRIAL_STATUSES = tuple(
    s.value for s in (TrialStatus.COMPLETED, TrialStatus.DIVERGED, TrialStatus.PRUNED, TrialStatus.FAILED)
)
