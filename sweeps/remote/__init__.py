"""Sweeps on a remote Ray cluster: staging, submission as Ray Jobs, status read back, Kubernetes manifests.

The public face the REST service and the CLI use:

* :mod:`sweeps.remote.staging` (and :mod:`sweeps.remote.entrypoint`): a sweep's job working directory
  and its arguments (:func:`staged_sweep`, :class:`StagingLimits`, :class:`StagedSweep`).
* :mod:`sweeps.remote.jobs`: :class:`SweepJobs`, the Ray Jobs client (submit, get, list, logs, stop,
  wait, report).
* :mod:`sweeps.remote.status`: :class:`SweepStatus` and :class:`TrialCounts`, what a reader reports.
* :mod:`sweeps.remote.errors`: what these raise.
* the MLflow reads the service needs, from :mod:`sweeps.tracking.reader` (:func:`check_existing_store`,
  :func:`mlflow_ui_links`).

:mod:`sweeps.remote.k8s` (KubeRay manifests) is imported on its own by ``critbatch k8s``.
Nothing here imports torch or Ray Tune.
"""

from sweeps.remote.entrypoint import build_entrypoint, default_job_python
from sweeps.remote.errors import (
    BackendTimeout,
    ClusterUnavailable,
    ReportNotReady,
    StagingError,
    StoreRefused,
    SweepExists,
    SweepNotFound,
    TooManySweeps,
)
from sweeps.remote.jobs import SweepJobs
from sweeps.remote.staging import StagedSweep, StagingLimits, shippable_files, stage_sweep, staged_summary, staged_sweep
from sweeps.remote.status import SERVED_STATUSES, TERMINAL_STATUSES, SweepStatus, TrialCounts
from sweeps.tracking.reader import check_existing_store, mlflow_ui_links

__all__ = [
    "SERVED_STATUSES",
    "TERMINAL_STATUSES",
    "BackendTimeout",
    "ClusterUnavailable",
    "ReportNotReady",
    "StagedSweep",
    "StagingError",
    "StagingLimits",
    "StoreRefused",
    "SweepExists",
    "SweepJobs",
    "SweepNotFound",
    "SweepStatus",
    "TooManySweeps",
    "TrialCounts",
    "build_entrypoint",
    "check_existing_store",
    "default_job_python",
    "mlflow_ui_links",
    "shippable_files",
    "stage_sweep",
    "staged_summary",
    "staged_sweep",
]
