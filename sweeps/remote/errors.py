"""The errors of the Ray Jobs side: an unreachable cluster, a refused submission, an unknown sweep.

The REST service maps each to one HTTP status (``service/errors.py``); the CLI to an exit code
(2 for what is the user's input: :class:`StagingError`, a different spec under a taken id).
"""

from __future__ import annotations

from sweeps.errors import CritbatchError, InvalidInput
from sweeps.tracking.reader import StoreRefused

__all__ = [
    "BackendTimeout",
    "ClusterUnavailable",
    "ReportNotReady",
    "StagingError",
    "StoreRefused",
    "SweepExists",
    "SweepNotFound",
    "TooManySweeps",
]


class ClusterUnavailable(CritbatchError):
    """The Ray cluster's job server cannot be reached, or answered with an error."""


class BackendTimeout(ClusterUnavailable):
    """Ray's job server (or MLflow) did not answer in time."""


class TooManySweeps(CritbatchError):
    """``max_active`` sweeps are already pending or running on the cluster; nothing was submitted.

    Attributes:
        active: sweeps pending or running when the submission was refused.
        max_active: the cap.
    """

    def __init__(self, active: int, max_active: int):
        self.active = active
        self.max_active = max_active
        super().__init__(f"{active} sweeps are pending or running (at most {max_active} at once): submit again later")


class SweepNotFound(CritbatchError):
    """No submitted sweep has this id on the cluster (``sweep_id`` attribute)."""

    def __init__(self, sweep_id: str):
        self.sweep_id = sweep_id
        super().__init__(f"no sweep with id {sweep_id!r} on this cluster")


class SweepExists(CritbatchError):
    """A job with this sweep id was already submitted; no second job was started.

    Attributes:
        sweep_id: the id.
        status: the existing sweep's status.
        same_spec: True when the existing job runs the same spec (same fingerprint).
    """

    def __init__(self, sweep_id: str, status: str, same_spec: bool):
        self.sweep_id = sweep_id
        self.status = status
        self.same_spec = same_spec
        super().__init__(self.describe())

    def describe(self, another: str = "--sweep-id") -> str:
        """The message, naming how its reader picks another id: ``another`` is the CLI's ``--sweep-id``
        (``str(exc)``) or, from the REST service, its query parameter (``id with ?sweep_id=``)."""
        what = "the same spec" if self.same_spec else "a different spec"
        return (
            f"sweep {self.sweep_id!r} was already submitted ({what}; status {self.status}); "
            f"no second job started (choose another {another} to run it again)"
        )


class StagingError(InvalidInput):
    """What a submission would upload is refused (too big, hidden, or a ``model.hf_config`` that does not parse);
    ``path`` names the spec field or ``<root>``."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


class ReportNotReady(CritbatchError):
    """The sweep has no report (yet): it is still running, or ended without one.

    Attributes:
        sweep_id, status: the sweep and its status.
        reason: why there is no report, or None.
    """

    def __init__(self, sweep_id: str, status: str, reason: str | None = None):
        self.sweep_id = sweep_id
        self.status = status
        self.reason = reason
        tail = f": {reason}" if reason else ""
        super().__init__(f"sweep {sweep_id!r} has no report (status {status}){tail}")
