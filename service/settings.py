"""The service's settings, read from the environment once at start-up.

| variable | meaning | default |
|---|---|---|
| ``RAY_ADDRESS`` | the Ray cluster's job server, ``http://HEAD:8265`` | Ray's auto-detection |
| ``MLFLOW_TRACKING_URI`` | the MLflow server sweeps log to and the only one the service reads; a spec may name no other | none: sweeps log to a file on the cluster |
| ``CRITBATCH_API_TOKEN`` | bearer token every route but ``/healthz`` requires (>= 16 characters) | none: refuse to start |
| ``CRITBATCH_MAX_BODY_BYTES`` | largest request body | 1 MiB |
| ``CRITBATCH_DATA_DIR`` | a spec's relative input paths name files under this folder, shipped with the job | none: ship nothing |
| ``CRITBATCH_CLUSTER_DATA_DIR`` | a spec's absolute input paths must lie inside this folder (read on the cluster) | none: no absolute paths |
| ``CRITBATCH_STORAGE_ROOT`` | ``resources.storage_path`` must lie inside it (a path or URI prefix); jobs keep their Tune/Train state under ``ROOT/<sweep id>`` | none: a spec may not set one |
| ``CRITBATCH_MAX_RUNNING`` | sweeps running or pending at once; a submission past it gets 429 with ``Retry-After`` | 4 |
| ``CRITBATCH_RAY_TIMEOUT_S`` / ``CRITBATCH_MLFLOW_TIMEOUT_S`` | the longest one HTTP request to Ray's job server / MLflow may take | 10 / 10 |
| ``CRITBATCH_REQUEST_TIMEOUT_S`` | the longest a route waits for its backend calls (then 504; ``DELETE`` adds its ``wait_s``) | 30 |
| ``CRITBATCH_READY_TIMEOUT_S`` | ``/readyz``: the longest each dependency check may take | 2 |
| ``CRITBATCH_MLFLOW_UI_URL`` | base URL of the MLflow UI for report links | the tracking URI if it is http(s) |
| ``CRITBATCH_SHIP_DATA_MAX_MB`` | largest input shipped with a job | 20 |
| ``CRITBATCH_UPLOAD_MAX_MB`` | largest job working directory | 100 |
| ``CRITBATCH_JOB_PYTHON`` | the Python that runs a job on the cluster | see ``sweeps.remote.default_job_python`` |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from sweeps.settings import Settings as ProductSettings
from sweeps.settings import SettingsError

__all__ = ["MIN_TOKEN_CHARS", "Settings", "SettingsError"]

MIN_TOKEN_CHARS = 16


@dataclass(frozen=True, kw_only=True)
class Settings(ProductSettings):
    """Everything the service is configured with (see the module docstring for the variables): the product's
    :class:`sweeps.settings.Settings`, which reads every ``CRITBATCH_*`` variable, and the variables that are not
    ``CRITBATCH_*`` (``RAY_ADDRESS``, ``MLFLOW_TRACKING_URI``).

    Attributes:
        local_only: serve without a token; only allowed on a loopback host (``critbatch serve
            --local-only``).
        backend_threads: threads that run the routes' calls to Ray's job server and MLflow.

    Raises:
        SettingsError: no token without ``local_only``, a token under :data:`MIN_TOKEN_CHARS` characters, or a
            value the service cannot use; the message names the variable.
    """

    ray_address: str | None = None
    tracking_uri: str | None = None
    local_only: bool = False
    backend_threads: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.api_token is not None and len(self.api_token) < MIN_TOKEN_CHARS:
            raise SettingsError(f"CRITBATCH_API_TOKEN must be at least {MIN_TOKEN_CHARS} characters")
        if self.api_token is None and not self.local_only:
            raise SettingsError(
                "refusing to start without an API token: set CRITBATCH_API_TOKEN "
                "(or serve on a loopback address with --local-only)"
            )
        if self.max_body_bytes <= 0:
            raise SettingsError("CRITBATCH_MAX_BODY_BYTES must be positive")
        if self.cluster_data_dir is not None and not os.path.isabs(self.cluster_data_dir):
            raise SettingsError("CRITBATCH_CLUSTER_DATA_DIR must be an absolute path")
        if self.data_dir is not None and not os.path.isdir(self.data_dir):
            raise SettingsError("CRITBATCH_DATA_DIR must be an existing folder")
        if self.max_running < 1:
            raise SettingsError("CRITBATCH_MAX_RUNNING must be at least 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, local_only: bool = False) -> Self:
        """Read the settings from ``env`` (default ``os.environ``): the ``CRITBATCH_*`` variables as
        :meth:`sweeps.settings.Settings.from_env` reads them, then ``RAY_ADDRESS`` and ``MLFLOW_TRACKING_URI``.

        Raises:
            SettingsError: a malformed value, or no token without ``local_only``.
        """
        env = os.environ if env is None else env
        return super().from_env(
            env,
            ray_address=env.get("RAY_ADDRESS") or None,
            tracking_uri=env.get("MLFLOW_TRACKING_URI") or None,
            local_only=local_only,
        )
