"""What a spec submitted to the service may point at (server-side locations).

A sweep runs on the cluster with the cluster's credentials and writes with its nodes' rights, so
the service, not the client, decides where a submitted spec may read and write:

* ``tracking.uri``: unset, or exactly the service's ``MLFLOW_TRACKING_URI`` (the service calls
  that server with its own credentials; no other URI is ever contacted).
* ``resources.storage_path``: unset, or inside ``CRITBATCH_STORAGE_ROOT`` (a path, or a URI prefix
  such as ``s3://bucket/critbatch``); with no storage root, unset.
* ``data.path`` (or a ``data.shards`` folder), a ``data.tokenizer`` folder, ``finetune.checkpoint_dir``, a
  ``model.hf_config`` path: a relative path
  naming an input under ``CRITBATCH_DATA_DIR`` (shipped with the job), or an absolute path inside
  ``CRITBATCH_CLUSTER_DATA_DIR`` (read on the cluster, not shipped). No URI (``file://``, ``s3://``),
  no ``..`` component, no absolute path elsewhere.

The CLI runs as its user and keeps every freedom; only the service applies this policy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from service.settings import Settings
from sweeps.spec import SweepSpec
from sweeps.spec.identity import same_tracking_uri

__all__ = ["policy_errors"]

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _has_dotdot(path: str) -> bool:
    return ".." in PurePosixPath(path.replace("\\", "/")).parts


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def _input_errors(field: str, value: str, settings: Settings) -> list[tuple[str, str]]:
    if _URI_RE.match(value):
        return [
            (
                field,
                (
                    "URIs (file://, s3://, ...) are not accepted by the service: use a path under "
                    "the service's data root (CRITBATCH_DATA_DIR) or cluster data root (CRITBATCH_CLUSTER_DATA_DIR)"
                ),
            )
        ]
    if _has_dotdot(value):
        return [(field, "a path with '..' is not accepted by the service")]
    if os.path.isabs(value):
        cluster = settings.cluster_data_dir
        if cluster is None or not PurePosixPath(value).is_relative_to(PurePosixPath(cluster)):
            return [
                (
                    field,
                    "absolute paths are accepted only inside the service's cluster data root "
                    "(CRITBATCH_CLUSTER_DATA_DIR)" + ("" if cluster else ", which is not set"),
                )
            ]
        return []
    if settings.data_dir is None:
        return [
            (
                field,
                (
                    "the service ships no inputs (CRITBATCH_DATA_DIR is not set): use an absolute path inside "
                    "the cluster data root (CRITBATCH_CLUSTER_DATA_DIR)"
                ),
            )
        ]
    root = Path(settings.data_dir)
    local = root / value
    if not _inside(local, root):
        return [(field, "the path leaves the service's data root (CRITBATCH_DATA_DIR), through a symbolic link")]
    if not local.exists():
        return [(field, "no such input under the service's data root (CRITBATCH_DATA_DIR)")]
    return []


def policy_errors(spec: SweepSpec, settings: Settings) -> list[tuple[str, str]]:
    """``(field path, message)`` for every location in ``spec`` the service does not allow (empty: allowed).

    Messages name the field and the rule, never the server's own paths or addresses.
    """
    errors: list[tuple[str, str]] = []
    if spec.arms:  # each arm may name its own data and storage: run a comparison from the CLI
        errors.append(
            (
                "arms",
                (
                    "the service runs one sweep per request: submit each arm as its own sweep, or run "
                    "the comparison with `critbatch run`"
                ),
            )
        )
    uri = spec.tracking.uri
    if uri is not None and not same_tracking_uri(uri, settings.tracking_uri):
        errors.append(
            (
                "tracking.uri",
                "the service logs every sweep to its own MLflow server: leave tracking.uri "
                "unset" + ("" if settings.tracking_uri else " (the service has none set)"),
            )
        )
    storage = spec.resources.storage_path
    if storage is not None:
        root = settings.storage_root
        if root is None:
            errors.append(
                (
                    "resources.storage_path",
                    (
                        "the service sets where sweeps keep their state: leave "
                        "resources.storage_path unset (no CRITBATCH_STORAGE_ROOT)"
                    ),
                )
            )
        elif _has_dotdot(storage) or not (
            storage.rstrip("/") == root.rstrip("/") or storage.startswith(root.rstrip("/") + "/")
        ):
            errors.append(
                (
                    "resources.storage_path",
                    ("must be inside the service's storage root (CRITBATCH_STORAGE_ROOT), without '..'"),
                )
            )
    inputs: list[tuple[str, str | None]] = (
        [("data.path", spec.data.path)] if spec.data.shards is None else [("data.shards", spec.data.shards)]
    )
    if spec.data.tokenizer != "byte":
        inputs.append(("data.tokenizer", spec.data.tokenizer))
    if spec.finetune is not None:
        inputs.append(("finetune.checkpoint_dir", spec.finetune.checkpoint_dir))
    if isinstance(spec.model.hf_config, str):  # a config.json path (an inline mapping names no file)
        inputs.append(("model.hf_config", spec.model.hf_config))
    for field, value in inputs:
        if value is not None:
            errors += _input_errors(field, value, settings)
    return errors
