"""Reading a sweep's MLflow runs back (the Ray Jobs client and, through it, the REST service).

A reader never creates or migrates a store (:func:`check_existing_store`), uses an explicit
``MlflowClient`` (no active-run state), and writes only one thing: it closes runs still marked
RUNNING after the process that would have closed them has ended (:meth:`MlflowReader.close_orphans`).
Names of tags, params and metrics come from :mod:`sweeps.tracking.schema`.

Imports MLflow only when a reader is made, and never Ray Tune: the REST service uses this module.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from sweeps.errors import CritbatchError
from sweeps.spec.identity import redact_uri
from sweeps.spec.statuses import SweepStatus
from sweeps.tracking.schema import (
    CLOSED_BY_JOBS,
    METRIC_VAL_LOSS,
    MLFLOW_RUN_FAILED,
    MLFLOW_RUN_KILLED,
    MLFLOW_RUN_RUNNING,
    PARAM_BATCH_SIZE_SEQUENCES,
    ROLE_SWEEP,
    ROLE_TRIAL,
    SAVED_VIEW_ID,
    TAG_CLOSED_BY,
    TAG_MESSAGE,
    TAG_ROLE,
    TAG_STATUS,
    TAG_SWEEP_ID,
    TAG_TRIAL_ID,
    TRIAL_FAILED,
    TRIAL_RUNNING,
    TRIAL_STOPPED,
)

__all__ = [
    "MlflowReader",
    "StoreRefused",
    "check_existing_store",
    "mlflow_ui_links",
    "ping_store",
    "readable_here",
    "runs_table_url",
    "trial_rows",
]

_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


class StoreRefused(CritbatchError):
    """The tracking URI does not name an existing MLflow store: a reader never creates or migrates one."""


def readable_here(uri: str | None) -> tuple[bool, str | None]:
    """``(readable, why not)``: whether this process can read the MLflow store at ``uri`` (a server,
    or a local file that exists).

    A relative ``sqlite:///mlflow.db`` recorded by a job names a file on the cluster node.
    """
    if not uri:
        return False, "no tracking URI recorded"
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        p = Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else Path("")
    elif scheme == "file":
        p = Path(parts.path)
    elif scheme == "":
        p = Path(uri)
    else:
        return True, None
    if p.is_absolute() and p.exists():
        return True, None
    return False, f"tracking URI {redact_uri(uri)!r} is a file on the cluster node, not readable here"


def _sql_store_url(uri: str, scheme: str) -> str:
    """The SQLAlchemy URL that opens ``uri`` without creating it (SQLite read-only).

    Raises:
        StoreRefused: a SQLite file that does not exist (or ``:memory:``).
    """
    if scheme != "sqlite":
        return uri
    path = uri.split(":///", 1)[1] if ":///" in uri else ""
    if not path or path == ":memory:" or not Path(path).is_file():
        raise StoreRefused(f"no MLflow database at {redact_uri(uri)!r} (a reader creates none)")
    return f"sqlite:///file:{quote(str(Path(path).resolve()))}?mode=ro&uri=true"


def _check_sql_store(uri: str, scheme: str) -> None:
    """Refuse a SQL database that lacks one of MLflow's tables or the default experiment."""
    import sqlalchemy

    url = _sql_store_url(uri, scheme)
    try:
        import mlflow.store.tracking.dbmodels.models  # noqa: F401 - defines MLflow's tables on Base.metadata
        from mlflow.store.db.base_sql_model import Base
        from mlflow.store.db.db_types import DATABASE_ENGINES  # noqa: F401 - MLflow's drivers

        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 10} if scheme != "sqlite" else {})
        try:
            tables = set(sqlalchemy.inspect(engine).get_table_names())
            missing = set(Base.metadata.tables) - tables
            has_default = False
            if not missing:
                with engine.connect() as conn:
                    has_default = (
                        conn.execute(sqlalchemy.text("SELECT 1 FROM experiments WHERE experiment_id = 0")).first()
                        is not None
                    )
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - driver errors of any kind
        raise StoreRefused(f"cannot open {redact_uri(uri)!r} read-only ({type(exc).__name__})") from None
    if missing or not has_default:
        raise StoreRefused(f"{redact_uri(uri)!r} is not an MLflow store (no MLflow tables): a reader creates none")


def check_existing_store(uri: str) -> None:
    """Refuse a tracking URI that does not name an existing MLflow store.

    MLflow's SQL store creates its tables (and runs its migrations) when a database lacks them,
    and adds a default experiment when it has none; its file store creates its folder. A reader
    must do neither: a SQL database is inspected first (SQLite opened read-only) and must hold
    every MLflow table and the default experiment; a file store's folder must hold experiment
    ``0``. HTTP(S) servers and other schemes are left to MLflow.

    Raises:
        StoreRefused: no such database or folder, or not an MLflow store.
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.lower().split("+", 1)[0]
    if scheme in ("http", "https", "databricks", "mlflow-artifacts"):
        return
    if scheme in _DB_SCHEMES:
        _check_sql_store(uri, scheme)
        return
    if scheme in ("", "file"):
        root = Path(parts.path if scheme == "file" else uri)
        if not (root / "0" / "meta.yaml").is_file():
            raise StoreRefused(f"{redact_uri(uri)!r} is not an MLflow file store: a reader creates none")


def ping_store(uri: str | None, timeout_s: float = 2.0) -> str:
    """``"ok"`` if the tracking store at ``uri`` answers (an HTTP server's ``/health`` within
    ``timeout_s`` seconds, or an existing store: :func:`check_existing_store`); ``"not configured"``
    without a URI.

    Raises:
        StoreRefused: the server answered another status, or no such store; ``requests`` errors
            when the server cannot be reached.
    """
    if not uri:
        return "not configured"
    if urlsplit(uri).scheme.lower() in ("http", "https"):
        import requests

        r = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
        if r.status_code != 200:
            raise StoreRefused(f"MLflow answered {r.status_code}")
        return "ok"
    check_existing_store(uri)
    return "ok"


def runs_table_url(ui_url: str, experiment_id: str, *, view: bool) -> str:
    """The address that opens experiment ``experiment_id``'s runs table in the MLflow UI at ``ui_url``, on the
    "Model training" side (``workflowType=machine_learning``), with critbatch's saved view where ``view``.

    Only give ``view=True`` for an experiment that holds the view's tag: MLflow answers a missing view with
    an error and the experiment's default page (the GenAI overview).
    """
    query = {"workflowType": "machine_learning"}  # MLflow's name for its "Model training" side
    if view:
        query["viewStateShareKey"] = SAVED_VIEW_ID
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def mlflow_ui_links(
    ui_url: str | None, experiment_id: str | None, parent_run_id: str | None, trial_run_ids: list[str]
) -> dict[str, Any]:
    """Links into the MLflow UI at ``ui_url``: ``experiment`` (its runs table, on MLflow 3's "Model training"
    side: :func:`runs_table_url`), ``parent_run`` and ``compare_trials`` (each present when
    its ids are); ``{}`` without a UI URL or an experiment."""
    if not ui_url or not experiment_id:
        return {}
    base = ui_url.rstrip("/")
    links: dict[str, Any] = {"experiment": runs_table_url(base, experiment_id, view=False)}
    if parent_run_id:
        links["parent_run"] = f"{base}/#/experiments/{experiment_id}/runs/{parent_run_id}"
    if trial_run_ids:
        runs = quote("[" + ",".join(f'"{r}"' for r in trial_run_ids) + "]", safe="")
        exps = quote(f'["{experiment_id}"]', safe="")
        links["compare_trials"] = f"{base}/#/compare-runs?runs={runs}&experiments={exps}"
    return links


def trial_rows(trials: list[Any], ui_url: str | None, experiment_id: str | None) -> list[dict[str, Any]]:
    """One row per trial run, sorted by trial id: ``trial_id``, ``run_id``, ``status``,
    ``batch_size_sequences`` (the param, a string), ``val_loss`` (the latest), and ``url`` (its page
    in the MLflow UI) when ``ui_url`` and ``experiment_id`` are given."""
    rows = sorted(
        (
            {
                "trial_id": r.data.tags.get(TAG_TRIAL_ID),
                "run_id": r.info.run_id,
                "status": r.data.tags.get(TAG_STATUS),
                "batch_size_sequences": r.data.params.get(PARAM_BATCH_SIZE_SEQUENCES),
                "val_loss": r.data.metrics.get(METRIC_VAL_LOSS),
            }
            for r in trials
        ),
        key=lambda t: str(t["trial_id"]),
    )
    if ui_url and experiment_id:
        for t in rows:
            t["url"] = f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{t['run_id']}"
    return rows


class MlflowReader:
    """The sweep's runs in one MLflow store (explicit client, no active-run state).

    Args:
        tracking_uri: the store; checked by :func:`check_existing_store` first.

    Raises:
        StoreRefused: ``tracking_uri`` names no existing MLflow store.
    """

    def __init__(self, tracking_uri: str):
        from mlflow import MlflowClient

        check_existing_store(tracking_uri)
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def experiment_ids(self, name: str | None) -> list[str]:
        """The id of experiment ``name`` (``[]`` if there is none); without a name, every experiment's."""
        if name:
            exp = self.client.get_experiment_by_name(name)
            return [exp.experiment_id] if exp is not None else []
        return [e.experiment_id for e in self.client.search_experiments(max_results=1000)]

    def experiment_deleted(self, name: str | None) -> bool:
        """Whether experiment ``name`` exists in the store but was deleted (its runs are no longer searched)."""
        if not name:
            return False
        exp = self.client.get_experiment_by_name(name)
        return exp is not None and exp.lifecycle_stage == "deleted"

    def parent(self, sweep_id: str, exp_ids: list[str]) -> Any | None:
        """The sweep's newest parent run in ``exp_ids``, or None."""
        if not exp_ids:
            return None
        runs = self.client.search_runs(
            exp_ids,
            filter_string=f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{TAG_ROLE}` = '{ROLE_SWEEP}'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0] if runs else None

    def trials(self, sweep_id: str, exp_ids: list[str]) -> list[Any]:
        """Every trial run of the sweep in ``exp_ids`` (all pages)."""
        out: list[Any] = []
        token = None
        while exp_ids:
            page = self.client.search_runs(
                exp_ids,
                filter_string=f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",
                max_results=1000,
                page_token=token,
            )
            out.extend(page)
            token = page.token
            if not token:
                break
        return out

    def close_orphans(self, parent: Any | None, trials: list[Any], sweep_status: str) -> int:
        """Close runs still RUNNING after the job ended (``sweep_status``: STOPPED or FAILED); return
        how many were closed. Trials get ``TRIAL_STOPPED`` (a stopped sweep) or ``TRIAL_FAILED``."""
        closed = 0
        trial_tag = TRIAL_STOPPED if sweep_status == SweepStatus.STOPPED else TRIAL_FAILED
        for r in trials:
            tag = r.data.tags.get(TAG_STATUS)
            if r.info.status == MLFLOW_RUN_RUNNING or tag == TRIAL_RUNNING:
                if tag in (None, TRIAL_RUNNING):
                    self.client.set_tag(r.info.run_id, TAG_STATUS, trial_tag)
                self._close(r, sweep_status)
                closed += 1
        running = SweepStatus.RUNNING
        if parent is not None and (
            parent.info.status == MLFLOW_RUN_RUNNING or parent.data.tags.get(TAG_STATUS) == running
        ):
            if parent.data.tags.get(TAG_STATUS) in (None, running):
                self.client.set_tag(parent.info.run_id, TAG_STATUS, sweep_status)
                if not parent.data.tags.get(TAG_MESSAGE):
                    self.client.set_tag(
                        parent.info.run_id, TAG_MESSAGE, f"closed after the Ray job ended ({sweep_status})"
                    )
            self._close(parent, sweep_status)
            closed += 1
        return closed

    def _close(self, run: Any, sweep_status: str) -> None:
        self.client.set_tag(run.info.run_id, TAG_CLOSED_BY, CLOSED_BY_JOBS)
        if run.info.status == MLFLOW_RUN_RUNNING:
            stopped = sweep_status == SweepStatus.STOPPED
            self.client.set_terminated(run.info.run_id, status=MLFLOW_RUN_KILLED if stopped else MLFLOW_RUN_FAILED)

    def load_json_artifact(self, run_id: str, path: str) -> Any | None:
        """The JSON artifact ``path`` of run ``run_id``, or None when the run has no such artifact."""
        with tempfile.TemporaryDirectory(prefix="critbatch-report-") as tmp:
            try:
                local = self.client.download_artifacts(run_id, path, tmp)
            except Exception:  # noqa: BLE001 - MLflow raises several types for a missing artifact
                return None
            return json.loads(Path(local).read_text(encoding="utf-8"))
