"""The one vocabulary of a sweep's status, for every layer: the driver's ``sweep.json``
(``sweeps.run.state``), what a client is told of a submitted sweep (``sweeps.remote.status``, the REST
service's ``SweepStatusName``), and the tests of a finished sweep (``sweeps.run.driver``, ``compare``)."""

from __future__ import annotations

__all__ = ["SWEEP_STATUSES", "SERVED_STATUSES", "TERMINAL_STATUSES", "FINISHED_STATUSES"]

#: ``sweep.json``'s ``status``: ``STARTING`` (the output folder claimed, the sweep not started), then the others.
SWEEP_STATUSES = ("STARTING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")
#: what a reader of a submitted sweep reports, in order of its life: ``PENDING`` while its job waits to run.
SERVED_STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")
#: a sweep that has ended, one way or another (a STOPPED one can be resumed).
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
#: a sweep that ended with its analysis: nothing is left to resume.
FINISHED_STATUSES = ("SUCCEEDED", "FAILED")
