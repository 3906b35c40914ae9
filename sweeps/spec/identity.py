"""The one owner of a sweep's identity and of where it logs: the sweep-id rule, the default id, the
default tracking URI and the tracking-URI precedence (local runs and submitted jobs), where a new
experiment's artifacts go, loopback detection and URI redaction. The driver, the Ray Jobs client, the CLI and the service all use these.

Plain data: imports neither torch, Ray nor MLflow.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from sweeps.errors import InvalidInput
from sweeps.spec.sweep import SweepSpec

__all__ = [
    "ARTIFACTS_DIR_NAME",
    "DEFAULT_TRACKING_URI",
    "SWEEP_ID_PATTERN",
    "check_sweep_id",
    "default_sweep_id",
    "experiment_artifact_location",
    "is_file_store",
    "is_loopback_address",
    "is_loopback_host",
    "is_valid_sweep_id",
    "job_tracking_uri",
    "local_tracking_uri",
    "redact_uri",
    "run_sweep_id",
    "same_tracking_uri",
    "tracking_uri_source",
]

#: A sweep id: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit. It is also the Ray
#: submission id, a folder name (``outputs/<id>``, ``tune/<id>``) and an MLflow tag value.
SWEEP_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_SWEEP_ID_RE = re.compile(SWEEP_ID_PATTERN)

#: Where a sweep logs when nothing else says: a SQLite MLflow store in the working directory.
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def check_sweep_id(sweep_id: str) -> str:
    """Return ``sweep_id`` if it matches :data:`SWEEP_ID_PATTERN`.

    Raises:
        InvalidInput: it does not (the message says the rule).
    """
    if not is_valid_sweep_id(sweep_id):
        raise InvalidInput(
            f"invalid sweep id {sweep_id!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return sweep_id


def is_valid_sweep_id(sweep_id: object) -> bool:
    """Whether ``sweep_id`` is a string matching :data:`SWEEP_ID_PATTERN`."""
    return isinstance(sweep_id, str) and _SWEEP_ID_RE.fullmatch(sweep_id) is not None


def default_sweep_id(spec: SweepSpec) -> str:
    """``NAME-FINGERPRINT``: resubmitting an identical spec gives the same id (so no second job)."""
    return f"{spec.name}-{spec.fingerprint()}"


def run_sweep_id(name: str) -> str:
    """``NAME-YYYYMMDD-HHMMSS-xxxxxx``, a local ``critbatch run``'s default: the random tail keeps two runs of
    one spec started in the same second apart (in MLflow and in Ray's staging folders). A submitted job
    takes :func:`default_sweep_id` instead, so that resubmitting it starts no second job."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def is_file_store(uri: str) -> bool:
    """Whether an MLflow tracking URI is a local file store (a path, ``file:`` or ``sqlite:``)."""
    return urlsplit(uri).scheme.lower() in ("", "file", "sqlite")


#: The folder beside a SQLite tracking database that holds the artifacts of the experiments critbatch creates.
ARTIFACTS_DIR_NAME = "mlartifacts"


def experiment_artifact_location(tracking_uri: str | None) -> str | None:
    """The ``artifact_location`` to give a *new* MLflow experiment on ``tracking_uri`` (None: pass none).

    Without one, MLflow roots a SQLite store's artifacts at ``./mlruns`` of whatever folder the process
    runs in, so cbs.json, report.html and checkpoints would land wherever the command was started.

    * ``sqlite:///PATH/NAME.db`` -> ``file:///PATH/mlartifacts`` (absolute, beside the database). A
      relative ``PATH`` is resolved against the working directory at call time, which is also where
      SQLite opens it; :func:`local_tracking_uri` already makes a local run's path absolute. A query
      string (``?mode=ro``) is ignored; an in-memory ``sqlite://`` gets None. MLflow then stores a
      run's artifacts in ``PATH/mlartifacts/<run id>/artifacts`` (run ids are unique across experiments).
    * a file store (a bare path or a ``file:`` URI) -> None: MLflow's own default, which is inside the
      store (``<store>/<experiment id>``), never the working directory.
    * a server (``http``, ``https``, ``databricks``) or another database -> None: the server's (or
      MLflow's) configured artifact root decides.

    Existing experiments keep the location they were created with; callers use this only on creation.
    """
    if not tracking_uri or not tracking_uri.lower().startswith("sqlite:///"):
        return None
    path = unquote(tracking_uri[len("sqlite:///") :].split("?", 1)[0])
    if path.startswith("file:"):  # sqlite:///file:PATH?uri=true (SQLite URI filenames)
        path = path[len("file:") :]
    if not path or path == ":memory:":
        return None
    return (Path(path).resolve().parent / ARTIFACTS_DIR_NAME).as_uri()


def local_tracking_uri(spec: SweepSpec, flag: str | None, env: str | None = None) -> str:
    """Where a local ``critbatch run`` logs: ``--tracking-uri`` (``flag``), else the spec's
    ``tracking.uri``, else ``env`` (default: ``MLFLOW_TRACKING_URI``), else :data:`DEFAULT_TRACKING_URI`.

    A relative ``sqlite:///`` path or a bare path is made absolute, so that workers and the MLflow UI
    agree on the file.
    """
    env = os.environ.get("MLFLOW_TRACKING_URI") if env is None else env
    uri = flag or spec.tracking.uri or env or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    elif "://" not in uri:
        uri = str(Path(uri).resolve())
    return uri


def same_tracking_uri(a: str | None, b: str | None) -> bool:
    """Whether two tracking URIs name the same store (a trailing slash aside); False if either is empty."""
    if not a or not b:
        return False
    return a.rstrip("/") == b.rstrip("/")


def tracking_uri_source(spec: SweepSpec, flag: str | None) -> str:
    """Which setting gave :func:`local_tracking_uri` its value (named in error messages)."""
    if flag:
        return "--tracking-uri"
    if spec.tracking.uri:
        return "tracking.uri"
    return "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI"


def job_tracking_uri(spec: SweepSpec, flag: str | None, env: str | None) -> str:
    """Where a *submitted* sweep logs: ``flag``; else the spec's ``tracking.uri`` if it names a
    server; else ``env`` (the submitter's ``MLFLOW_TRACKING_URI``); else the spec's file store,
    else :data:`DEFAULT_TRACKING_URI` (as ``critbatch run``).

    A file store would be a file on the cluster node that nobody else can read, so the
    environment's server wins over it; a server named in the spec is a deliberate choice and wins
    over the environment.
    """
    if flag:
        return flag
    if spec.tracking.uri and not is_file_store(spec.tracking.uri):
        return spec.tracking.uri
    return env or spec.tracking.uri or DEFAULT_TRACKING_URI


def is_loopback_host(host: str) -> bool:
    """Whether a host name or IP literal (``localhost``, ``127.0.0.1``, ``::1``, ``[::1]``) is this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_address(address: str | None) -> bool:
    """Whether a Ray address (``host:port``, ``ray://host:port``, ``http://host:port``) is this machine.
    ``None`` or empty is Ray's default, a cluster on this machine."""
    if not address:
        return True
    if is_loopback_host(address):
        return True
    return is_loopback_host(urlsplit(address if "://" in address else f"x://{address}").hostname or "")


def redact_uri(uri: str | None) -> str | None:
    """``uri`` without a password (``http://user:***@host``), for display."""
    if not uri:
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
