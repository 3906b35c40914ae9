"""The MLflow UI over a sweep's store: how critbatch's experiments open in MLflow 3, and the local
``mlflow server`` that ``critbatch ui`` starts.

MLflow 3 opens an experiment on its GenAI side (overview, traces) unless told otherwise. In MLflow 3.17
what tells it is the page's address, not the store: the query ``workflowType=machine_learning`` (the
sidebar's "Model training" toggle, kept in the browser) makes the experiment page the runs table. The store
holds two experiment tags that MLflow's UI reads, and critbatch sets both on every experiment it creates
(:func:`experiment_tags`, through ``sweeps.tracking.writer.create_experiment``):

* ``mlflow.experimentKind = custom_model_development``: the experiment-type selector's "Machine
  learning". 3.17's UI writes it from that selector but picks the side from the toggle (a feature flag
  of its bundle); it is the store's record of what the experiment is, for UIs that read it;
* ``mlflow.sharedViewState.critbatch``: a saved view of the runs table (the UI's "Views" menu, or
  ``viewStateShareKey=critbatch`` in the address) that shows the columns a sweep's trials differ in,
  :data:`VIEW_PARAMS` and :data:`VIEW_METRICS`, instead of MLflow's defaults (source, models, dataset).
  MLflow shows the chosen metric columns before the parameter columns and keeps each group in its own
  order; a saved view chooses which columns show, not their order.

:func:`sweeps.tracking.reader.runs_table_url` is the address that opens that table with that view;
:func:`mark_experiment` adds the tags to an experiment made before critbatch set them. Everything else here
is the server process (:class:`UiConfig`, :func:`start_ui`, :func:`stop_ui`): one worker and MLflow's job
runner off, so that it starts on a 2-core machine.

Imports neither MLflow nor Ray: the client is handed in.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sweeps.errors import CritbatchError, InvalidInput
from sweeps.spec.identity import DEFAULT_TRACKING_URI, redact_uri
from sweeps.tracking.reader import StoreRefused, check_existing_store
from sweeps.tracking.schema import (
    EXPERIMENT_KIND_MODEL_TRAINING,
    METRIC_VAL_LOSS,
    PARAM_BATCH_SIZE_SEQUENCES,
    PARAM_BETA2,
    PARAM_LR,
    PARAM_LR_RULE,
    ROLE_SWEEP,
    SAVED_VIEW_ID,
    TAG_EXPERIMENT_KIND,
    TAG_ROLE,
    TAG_SAVED_VIEW_PREFIX,
)

__all__ = [
    "VIEW_METRICS",
    "VIEW_NAME",
    "VIEW_PARAMS",
    "UiConfig",
    "UiFailed",
    "UiServer",
    "experiment_tags",
    "mark_experiment",
    "newest_sweep_experiment",
    "start_ui",
    "stop_ui",
]

#: The trial parameters the saved view shows: what tells a sweep's trials apart.
VIEW_PARAMS = (PARAM_BATCH_SIZE_SEQUENCES, PARAM_LR, PARAM_LR_RULE, PARAM_BETA2, "seed")
#: The metrics it shows: a trial's validation loss (the latest, at its last tokens) and the sweep's answer
#: on the parent run (the headline target loss, b_crit in sequences).
VIEW_METRICS = (METRIC_VAL_LOSS, "target_loss", "b_crit")
#: The view's name in the UI's "Views" menu.
VIEW_NAME = "critbatch: trials by batch size, LR, beta2, seed"
#: The environment variable that turns MLflow's server-side job runner (GenAI jobs, a Huey consumer) off.
_JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def _column(group: str, name: str) -> str:
    """A runs-table column as MLflow's UI keys it: ``params.`lr```."""
    return f"{group}.`{name}`"


def experiment_tags(*, now_ms: int | None = None) -> dict[str, str]:
    """The tags critbatch gives an experiment it creates: ``mlflow.experimentKind`` (model training) and the
    saved view ``mlflow.sharedViewState.critbatch``.

    The view's value is MLflow's saved-view envelope (``name``, ``createdAt`` and ``updatedAt`` in
    milliseconds since the epoch, ``state`` a JSON string of the runs table's state), as the UI's "Save
    view" writes it, uncompressed (the UI reads both).

    Args:
        now_ms: the view's creation time, milliseconds since the epoch (default: now).
    """
    now_ms = int(time.time() * 1000) if now_ms is None else int(now_ms)
    state = {
        "selectedColumns": [_column("params", p) for p in VIEW_PARAMS] + [_column("metrics", m) for m in VIEW_METRICS]
    }
    view = {"name": VIEW_NAME, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(state)}
    return {
        TAG_EXPERIMENT_KIND: EXPERIMENT_KIND_MODEL_TRAINING,
        TAG_SAVED_VIEW_PREFIX + SAVED_VIEW_ID: json.dumps(view),
    }


def mark_experiment(client: Any, experiment: Any) -> list[str]:
    """Give ``experiment`` (an MLflow ``Experiment``) the tags of :func:`experiment_tags` it lacks: one
    made before critbatch set them, or by hand. A tag it has (a kind or view a user changed) is kept.

    Args:
        client: an ``MlflowClient`` on the experiment's store.
        experiment: the experiment, with its ``tags``.

    Returns:
        the keys of the tags set (empty when it had them all).

    Raises:
        whatever MLflow raises on ``set_experiment_tag`` (a read-only store, a server that is gone).
    """
    missing = {k: v for k, v in experiment_tags().items() if k not in (experiment.tags or {})}
    for key, value in missing.items():
        client.set_experiment_tag(experiment.experiment_id, key, value)
    return sorted(missing)


def newest_sweep_experiment(client: Any) -> Any | None:
    """The experiment of the newest critbatch sweep in ``client``'s store (its parent run, by start time),
    or None when the store holds no sweep.

    Raises:
        whatever MLflow raises on searching (a server that is gone).
    """
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = (
        client.search_runs(
            ids,
            filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_SWEEP}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if ids
        else []
    )
    return client.get_experiment(runs[0].info.experiment_id) if runs else None


class UiFailed(CritbatchError):
    """The MLflow server exited, or did not answer in time; the message ends with its log's tail."""


@dataclass(frozen=True, kw_only=True)
class UiConfig:
    """A local MLflow UI (``mlflow server``) over one store, on 127.0.0.1.

    Args:
        backend_store_uri: the store: ``sqlite:///PATH`` (a relative PATH is resolved against the working
            directory), another database URI, or a file store's path. Not a server (``http(s)://``): a
            server already serves its UI.
        port: TCP port on 127.0.0.1, 1 to 65535.

    Raises:
        InvalidInput: a port out of range, an empty URI or a server's URI (the field is named).
    """

    backend_store_uri: str = DEFAULT_TRACKING_URI
    port: int = 5000

    #: the interface: this machine only (port-forward it to reach it from elsewhere)
    host = "127.0.0.1"
    #: MLflow's request workers (uvicorn's): one, for a 2-core machine
    workers = 1

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise InvalidInput(f"port must be an integer from 1 to 65535, got {self.port!r}")
        uri = (self.backend_store_uri or "").strip()
        if not uri:
            raise InvalidInput("backend_store_uri is empty: give the MLflow store, e.g. sqlite:///mlflow.db")
        if urlsplit(uri).scheme.lower() in ("http", "https", "databricks"):
            raise InvalidInput(
                f"backend_store_uri {redact_uri(uri)!r} is a tracking server, which serves its "
                "own UI: open it in a browser, or give the store it serves (sqlite:///..., "
                "postgresql://...)"
            )
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            uri = "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
        elif "://" not in uri:
            uri = str(Path(uri).resolve())
        object.__setattr__(self, "backend_store_uri", uri)

    @property
    def url(self) -> str:
        """The UI's address, ``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The ``mlflow server`` command line (this Python's MLflow)."""
        return [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            self.backend_store_uri,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with MLflow's job runner off."""
        return {**(os.environ if base is None else base), _JOB_EXECUTION_ENV: "false"}


@dataclass(frozen=True)
class UiServer:
    """A running MLflow UI: its process, address and log file."""

    proc: subprocess.Popen
    url: str
    log: Path


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closing socket is no conflict
        try:
            s.bind((host, port))
        except OSError:
            raise InvalidInput(
                f"port {port} on {host} is in use (another MLflow UI?): choose another with --port"
            ) from None


def _log_tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def start_ui(config: UiConfig, *, log: Path, timeout_s: float = 180.0) -> UiServer:
    """Start ``mlflow server`` for ``config`` (its output to ``log``) and wait until ``/health`` answers 200.

    The server is a child in this process's group: Ctrl-C in a terminal reaches it too, and MLflow passes
    SIGINT and SIGTERM on to its uvicorn worker. About 45 s to answer on an idle 2-core machine.

    Args:
        config: the store and port.
        log: file for the server's stdout and stderr (created or replaced).
        timeout_s: seconds to wait for the server to answer.

    Raises:
        InvalidInput: the store does not exist (a reader creates none: ``check_existing_store``) or the
            port is in use.
        UiFailed: the server exited or did not answer within ``timeout_s`` (it is stopped first).
    """
    import requests

    try:
        check_existing_store(config.backend_store_uri)
    except StoreRefused as exc:
        raise InvalidInput(
            f"{exc}; `make run` writes sqlite:///mlflow.db in the repository, or pass --backend-store-uri"
        ) from None
    _check_port_free(config.host, config.port)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            config.command(), env=config.env(), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    server = UiServer(proc=proc, url=config.url, log=log)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise UiFailed(f"mlflow server exited with {proc.returncode}; the end of {log}:\n{_log_tail(log)}")
        try:
            if requests.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return server
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            stop_ui(server)
            raise UiFailed(f"mlflow server did not answer within {timeout_s:g} s; the end of {log}:\n{_log_tail(log)}")
        time.sleep(0.5)


def stop_ui(server: UiServer, grace_s: float = 10.0) -> int:
    """Stop the server: SIGTERM (MLflow passes it to its worker), SIGKILL after ``grace_s`` seconds.

    Returns:
        its exit status.
    """
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            return server.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
    return server.proc.wait()
