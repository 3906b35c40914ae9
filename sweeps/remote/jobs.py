"""Submitted sweeps on a Ray cluster: submit, and read back (status, trial counts, logs, report, stop).

A submitted sweep is a Ray Job whose submission id is the sweep id (staged by
:mod:`sweeps.remote.staging`). Ray Jobs and MLflow are the whole record; :class:`SweepJobs` keeps no
state. A sweep's status is Ray's job status corrected by its MLflow runs
(:mod:`sweeps.remote.status`). When Ray says a job has ended (stopped or failed), MLflow runs of the
sweep still marked RUNNING are closed, since the process that would have closed them no longer
exists (see :meth:`SweepJobs.get`).

Imports neither torch nor Ray Tune (Ray's job client only when it connects): the REST service uses it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from sweeps._compat import is_job_not_found, job_submission_client
from sweeps.remote.errors import (
    BackendTimeout,
    ClusterUnavailable,
    ReportNotReady,
    StoreRefused,
    SweepExists,
    SweepNotFound,
    TooManySweeps,
)
from sweeps.remote.staging import StagedSweep
from sweeps.remote.status import SweepRuns, SweepStatus, TrialCounts, from_job, planned_trials, with_runs
from sweeps.remote.waiting import MLFLOW, RAY_JOB_SERVER, waiting_on
from sweeps.spec import statuses
from sweeps.spec.identity import is_valid_sweep_id, redact_uri, same_tracking_uri
from sweeps.tracking.reader import (
    MlflowReader,
    mlflow_ui_links,
    ping_store,
    readable_here,
    trial_rows,
)
from sweeps.tracking.schema import (
    ARTIFACT_CBS,
    META_EXPERIMENT,
    META_FINGERPRINT,
    META_SWEEP_ID,
    META_TRACKING_URI,
    MLFLOW_RUN_RUNNING,
    TAG_STATUS,
    TRIAL_RUNNING,
)

__all__ = ["SUBMIT_ATTEMPTS", "WAIT_MAX_CONSECUTIVE_ERRORS", "SweepJobs"]

#: Tries of one submission when the connection drops (the upload and the submission id make it idempotent).
SUBMIT_ATTEMPTS = 3
#: ``wait`` gives up after this many reads in a row that could not reach the cluster.
WAIT_MAX_CONSECUTIVE_ERRORS = 5


class SweepJobs:
    """Submitted sweeps on one Ray cluster, read back from Ray Jobs and MLflow.

    Args:
        address: the cluster's job server (``http://HEAD:8265``), or any address Ray resolves.
        headers: extra HTTP headers for the job server (Ray's own token is added by Ray when
            ``RAY_AUTH_MODE=token``).
        tracking_uri: the MLflow URI used when a job's metadata does not record one.
        client: an object with ``JobSubmissionClient``'s methods (tests); default connects lazily.
        reader_factory: ``tracking_uri -> reader`` (tests); default an MLflow client.
        only_tracking_uri: read MLflow at ``tracking_uri`` only: a job whose metadata records
            another URI is shown with ``mlflow_error`` and never contacted (the service: it would
            call that URI with its own credentials).
        public_errors: error texts name no address and quote no remote answer (the service).
        ray_timeout_s: the longest one HTTP request to the job server may take
            (:class:`BackendTimeout` after it).
        list_cache_s: :meth:`list` answers at most this old are shared (0: every call reads).
    """

    def __init__(
        self,
        address: str | None,
        *,
        headers: dict[str, str] | None = None,
        tracking_uri: str | None = None,
        client: Any | None = None,
        reader_factory: Callable[[str], Any] | None = None,
        only_tracking_uri: bool = False,
        public_errors: bool = False,
        ray_timeout_s: float | None = None,
        list_cache_s: float = 0.0,
    ):
        self.address = address
        self._headers = headers
        self._client = client
        self._lock = threading.Lock()
        self.tracking_uri = tracking_uri
        self._reader_factory = reader_factory or MlflowReader
        self.only_tracking_uri = only_tracking_uri
        self.public_errors = public_errors
        self.ray_timeout_s = ray_timeout_s
        self.list_cache_s = list_cache_s
        self._list_lock = threading.Lock()
        self._list_cache: dict[tuple, tuple[float, Any]] = {}

    def serve_only(self, tracking_uri: str | None) -> None:
        """Set this client up for the REST service: read MLflow at this one store only
        (``only_tracking_uri``; ``tracking_uri`` is the default when none was given) and let no
        error text name a backend (``public_errors``)."""
        self.only_tracking_uri = True
        self.public_errors = True
        if self.tracking_uri is None:
            self.tracking_uri = tracking_uri

    # -- plumbing

    @property
    def client(self) -> Any:
        """Ray's job client, made on first use (:class:`ClusterUnavailable` if that fails)."""
        with self._lock:
            if self._client is None:
                try:
                    with waiting_on(RAY_JOB_SERVER, "its version check, GET /api/version"):
                        self._client = job_submission_client(self.address, self._headers, self.ray_timeout_s)
                except Exception as exc:  # noqa: BLE001 - requests/ConnectionError/RuntimeError
                    raise self._unavailable(exc) from None
            return self._client

    def _unavailable(self, exc: Exception, what: str = "cannot reach the Ray job server") -> ClusterUnavailable:
        timed_out = type(exc).__name__ in ("Timeout", "ReadTimeout", "ConnectTimeout", "TimeoutError")
        if timed_out:
            where = "" if self.public_errors else f" at {self.address or '(auto)'}"
            return BackendTimeout(f"the Ray job server{where} did not answer within {self.ray_timeout_s or 0:g} s")
        if self.public_errors:
            return ClusterUnavailable(f"{what} ({type(exc).__name__})")
        return ClusterUnavailable(f"{what} at {self.address or '(auto)'}: {exc}")

    def _call(self, fn: str, *args: Any, sweep_id: str | None = None, **kwargs: Any) -> Any:
        try:
            client = self.client
            with waiting_on(RAY_JOB_SERVER, fn):
                return getattr(client, fn)(*args, **kwargs)
        except (ClusterUnavailable, SweepNotFound):
            raise
        except RuntimeError as exc:
            if sweep_id is not None and is_job_not_found(exc):
                raise SweepNotFound(sweep_id) from None
            if self.public_errors:
                raise ClusterUnavailable("the Ray job server answered with an error") from None
            raise ClusterUnavailable(f"Ray job server error: {str(exc)[:2000]}") from None
        except Exception as exc:  # noqa: BLE001 - connection errors of requests
            raise self._unavailable(exc) from None

    def _job(self, sweep_id: str) -> Any:
        if not is_valid_sweep_id(sweep_id):
            raise SweepNotFound(sweep_id)
        job = self._call("get_job_info", sweep_id, sweep_id=sweep_id)
        if META_SWEEP_ID not in (job.metadata or {}):
            raise SweepNotFound(sweep_id)  # a Ray job, but not a sweep
        return job

    def _tracking_uri_of(self, job: Any) -> str | None:
        return (job.metadata or {}).get(META_TRACKING_URI) or self.tracking_uri

    def _foreign_uri(self, uri: str | None) -> bool:
        """``only_tracking_uri``: whether ``uri`` is not the one store this reader may contact."""
        return self.only_tracking_uri and not same_tracking_uri(uri, self.tracking_uri)

    # -- commands

    def active_count(self) -> int:
        """Sweeps (critbatch jobs) that Ray reports PENDING or RUNNING."""
        from ray.job_submission import JobStatus  # the client that listed the jobs has imported Ray

        return sum(
            1
            for j in self._call("list_jobs")
            if META_SWEEP_ID in (j.metadata or {})
            and str(getattr(j.status, "value", j.status)) in (JobStatus.PENDING, JobStatus.RUNNING)
        )

    def ping_ray(self) -> str:
        """``"ok"`` if the job server answers what a submission asks: its job list (``GET /api/jobs/``, which
        every submission under a cap on running sweeps reads; making the client first asks ``/api/version``).
        A version route alone is not enough: a dashboard whose job routes hang (its port taken over by
        another cluster's) still answers it.

        Raises:
            ClusterUnavailable: the job server cannot be reached or answered with an error
                (:class:`BackendTimeout`: not within ``ray_timeout_s``).
        """
        self._call("list_jobs")
        return "ok"

    def ping_mlflow(self, timeout_s: float = 2.0) -> str:
        """:func:`sweeps.tracking.reader.ping_store` of this client's tracking URI."""
        with waiting_on(MLFLOW, "a ping"):
            return ping_store(self.tracking_uri, timeout_s)

    def submit(self, staged: StagedSweep, *, max_active: int | None = None) -> SweepStatus:
        """Submit a staged sweep, unless a job with its id exists (then :class:`SweepExists`), or
        ``max_active`` sweeps are pending or running already (then :class:`TooManySweeps`).

        A dropped connection is retried (``SUBMIT_ATTEMPTS`` tries): the submission id makes it
        idempotent. Raises :class:`ClusterUnavailable` when the job server refuses or cannot be reached.
        """
        try:
            existing = self._job(staged.sweep_id)
        except SweepNotFound:
            existing = None
        if existing is not None:
            raise self._exists(existing, staged)
        if max_active is not None:
            active = self.active_count()
            if active >= max_active:
                raise TooManySweeps(active, max_active)
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                client = self.client
                with waiting_on(RAY_JOB_SERVER, "submit_job (the upload and the submission)"):
                    client.submit_job(
                        entrypoint=staged.entrypoint,
                        submission_id=staged.sweep_id,
                        runtime_env=staged.runtime_env,
                        metadata=dict(staged.metadata),
                    )
                break
            except ClusterUnavailable:
                raise
            except RuntimeError as exc:
                if "already exists" not in str(exc):
                    raise ClusterUnavailable(f"Ray job server refused the job: {str(exc)[:2000]}") from None
                # A lost race with another submission of this id (first attempt), or an earlier
                # attempt of ours that reached the server although its answer was lost.
                exists = self._exists(self._job(staged.sweep_id), staged)
                if attempt == 0 or not exists.same_spec:
                    raise exists from None
                break
            except Exception as exc:  # noqa: BLE001 - connection dropped (requests/urllib3 errors): retry
                if attempt + 1 == SUBMIT_ATTEMPTS:
                    raise ClusterUnavailable(f"cannot submit to the Ray job server at {self.address}: {exc}") from None
                time.sleep(2.0 * (attempt + 1))
        self._list_cache.clear()
        from ray.job_submission import JobStatus  # imported by the client that submitted the job

        return SweepStatus(
            id=staged.sweep_id,
            status=statuses.SweepStatus.PENDING,
            ray_status=JobStatus.PENDING.value,
            name=staged.spec.name,
            tracking_uri=staged.tracking_uri,
            trials=TrialCounts(planned=staged.spec.n_trials),
        )

    def _exists(self, job: Any, staged: StagedSweep) -> SweepExists:
        """The error for a submission whose id ``job`` already has (same spec: same fingerprint)."""
        same = (job.metadata or {}).get(META_FINGERPRINT) == staged.fingerprint
        return SweepExists(staged.sweep_id, self._state(job, with_mlflow=False).status, same)

    def get(self, sweep_id: str, *, with_mlflow: bool = True, reconcile: bool = True) -> SweepStatus:
        """The sweep's status, trial counts and best result so far.

        With ``reconcile``, a sweep whose job has ended as STOPPED or FAILED gets its MLflow runs
        that are still RUNNING closed (their writer is gone): no orphan RUNNING runs remain.

        Raises:
            SweepNotFound, ClusterUnavailable.
        """
        return self._state(self._job(sweep_id), with_mlflow=with_mlflow, reconcile=reconcile)

    def list(self, *, limit: int = 20, offset: int = 0, with_mlflow: bool = True) -> tuple[list[SweepStatus], int]:
        """Sweeps on the cluster, newest first: ``(page, total)``.

        With ``list_cache_s``, concurrent and repeated calls within that many seconds share one
        answer (one call to Ray's job list, one MLflow read per listed sweep): status only, so a
        second old at most.
        """
        key = (limit, offset, with_mlflow)
        if self.list_cache_s <= 0:
            return self._list(limit, offset, with_mlflow)
        with self._list_lock:  # single flight: callers arriving while one computes wait for its answer
            hit = self._list_cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.list_cache_s:
                return hit[1]
            out = self._list(limit, offset, with_mlflow)
            if len(self._list_cache) > 64:
                self._list_cache.clear()
            self._list_cache[key] = (time.monotonic(), out)
            return out

    def _list(self, limit: int, offset: int, with_mlflow: bool) -> tuple[list[SweepStatus], int]:
        jobs = [j for j in self._call("list_jobs") if META_SWEEP_ID in (j.metadata or {}) and j.submission_id]
        jobs.sort(key=lambda j: (j.start_time or 0, j.submission_id), reverse=True)
        page = jobs[offset : offset + limit]
        return [self._state(j, with_mlflow=with_mlflow, reconcile=False, with_trials=False) for j in page], len(jobs)

    def logs(self, sweep_id: str, *, tail_lines: int | None = None) -> str:
        """The job's log (the driver's stdout and stderr), or its last ``tail_lines`` lines.

        Raises:
            SweepNotFound, ClusterUnavailable.
        """
        self._job(sweep_id)
        text = self._call("get_job_logs", sweep_id, sweep_id=sweep_id) or ""
        if tail_lines is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail_lines:]) if tail_lines > 0 else ""
        return text

    async def follow_logs(self, sweep_id: str):
        """Yield chunks of the job's log as they are written, until the job ends."""
        self._job(sweep_id)
        async for chunk in self.client.tail_job_logs(sweep_id):
            yield chunk

    def stop(self, sweep_id: str, *, wait_s: float = 60.0, poll_s: float = 0.5) -> tuple[SweepStatus, bool]:
        """Stop the sweep's job and wait (up to ``wait_s``) until Ray reports it ended.

        Returns:
            ``(state, stop_sent)``: ``stop_sent`` is False when the job had already ended.
        """
        job = self._job(sweep_id)
        sent = False
        if not job.status.is_terminal():
            sent = bool(self._call("stop_job", sweep_id, sweep_id=sweep_id))
        deadline = time.monotonic() + wait_s
        while not job.status.is_terminal() and time.monotonic() < deadline:
            time.sleep(poll_s)
            job = self._job(sweep_id)
        return self._state(job, with_mlflow=True, reconcile=True), sent

    def wait(
        self,
        sweep_id: str,
        *,
        timeout_s: float = 3600.0,
        poll_s: float = 2.0,
        on_update: Callable[[SweepStatus], None] | None = None,
    ) -> SweepStatus:
        """Poll until the sweep ends (or ``timeout_s`` passes); return the last state."""
        deadline = time.monotonic() + timeout_s
        errors = 0
        while True:
            try:
                state = self.get(sweep_id)
                errors = 0
            except ClusterUnavailable:
                errors += 1  # a busy head node may drop a request now and then
                if errors >= WAIT_MAX_CONSECUTIVE_ERRORS or time.monotonic() >= deadline:
                    raise
                time.sleep(poll_s)
                continue
            if on_update is not None:
                on_update(state)
            if state.terminal or time.monotonic() >= deadline:
                return state
            time.sleep(poll_s)

    def report(self, sweep_id: str, *, ui_url: str | None = None) -> dict[str, Any]:
        """The sweep's ``cbs.json`` (from its MLflow parent run) with links to its MLflow runs.

        Raises:
            SweepNotFound; ReportNotReady while it runs, or when it ended without a report.
        """
        job = self._job(sweep_id)
        uri = self._tracking_uri_of(job)
        state = self._state(job, with_mlflow=True, reconcile=True)
        if not state.terminal:
            raise ReportNotReady(sweep_id, state.status, "the sweep has not finished")
        if state.mlflow_error or state.parent_run_id is None or uri is None or self._foreign_uri(uri):
            raise ReportNotReady(sweep_id, state.status, state.mlflow_error or state.reason or "no MLflow parent run")
        reader = self._reader_factory(uri)
        with waiting_on(MLFLOW, "the sweep's cbs.json"):
            cbs = reader.load_json_artifact(state.parent_run_id, ARTIFACT_CBS)
        if cbs is None:
            raise ReportNotReady(sweep_id, state.status, state.reason or "the parent run has no cbs.json")
        exp_ids = [state.experiment_id] if state.experiment_id else []
        if ui_url is None and urlsplit(uri or "").scheme in ("http", "https"):
            ui_url = redact_uri(uri)
        with waiting_on(MLFLOW, "the sweep's trial runs"):
            trials = reader.trials(sweep_id, exp_ids)
        rows = trial_rows(trials, ui_url, state.experiment_id)
        return {
            "id": sweep_id,
            "status": state.status,
            "cbs": cbs,
            "mlflow": {
                "tracking_uri": redact_uri(uri),
                "experiment_id": state.experiment_id,
                "parent_run_id": state.parent_run_id,
                "trial_runs": rows,
                "links": mlflow_ui_links(ui_url, state.experiment_id, state.parent_run_id, [t["run_id"] for t in rows]),
            },
        }

    # -- composing a status

    def _state(self, job: Any, *, with_mlflow: bool, reconcile: bool = False, with_trials: bool = True) -> SweepStatus:
        """Ray's view of ``job``, completed from MLflow when ``with_mlflow`` and the store may be read
        here; an MLflow failure leaves Ray's view with ``mlflow_error`` set."""
        uri = self._tracking_uri_of(job)
        ray = from_job(job, uri)
        if not with_mlflow:
            return ray
        ok, why = readable_here(uri)
        if ok and self._foreign_uri(uri):
            ok, why = False, "the sweep logs to a tracking URI that this service does not read"
        if not ok or uri is None:
            return replace(ray, mlflow_error=why)
        try:
            with waiting_on(MLFLOW, "the sweep's runs"):
                runs = self._read_runs(job, uri, ray.id, ray.status, reconcile=reconcile, with_trials=with_trials)
        except Exception as exc:  # noqa: BLE001 - MLflow unreachable or erroring: Ray's view still stands
            if self.public_errors:  # neither the server's answer nor its address goes to the client
                why = (
                    "no MLflow store there"
                    if isinstance(exc, StoreRefused)
                    else f"MLflow could not be read ({type(exc).__name__})"
                )
            else:
                why = f"cannot read MLflow at {redact_uri(uri)}: {exc}"[:2000]
            return replace(ray, mlflow_error=why)
        return with_runs(ray, runs, planned_trials(job, runs.parent), with_trials=with_trials)

    def _read_runs(
        self, job: Any, uri: str, sweep_id: str, status: str, *, reconcile: bool, with_trials: bool
    ) -> SweepRuns:
        """The sweep's runs at ``uri``; with ``reconcile``, runs left RUNNING by an ended job
        (``status`` STOPPED or FAILED) are closed first and read again."""
        reader = self._reader_factory(uri)
        exp_ids = reader.experiment_ids((job.metadata or {}).get(META_EXPERIMENT))
        parent = reader.parent(sweep_id, exp_ids)
        ended = (statuses.SweepStatus.STOPPED, statuses.SweepStatus.FAILED)
        trials = reader.trials(sweep_id, exp_ids) if (with_trials or status == statuses.SweepStatus.SUCCEEDED) else []
        if (
            reconcile
            and status in ended
            and (
                (parent is not None and parent.info.status == MLFLOW_RUN_RUNNING)
                or any(
                    r.info.status == MLFLOW_RUN_RUNNING or r.data.tags.get(TAG_STATUS) == TRIAL_RUNNING for r in trials
                )
            )
        ):
            reader.close_orphans(parent, trials, status)
            parent = reader.parent(sweep_id, exp_ids)
            trials = reader.trials(sweep_id, exp_ids)
        name = (job.metadata or {}).get(META_EXPERIMENT)
        note = None
        if parent is None and reader.experiment_deleted(name):
            note = (
                f"the sweep's MLflow experiment {name!r} was deleted: its runs, trial counts and result cannot be "
                "read (restore it with `mlflow experiments restore`)"
            )
        return SweepRuns(exp_ids, parent, trials, note)
