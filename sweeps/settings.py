"""The product's settings from ``CRITBATCH_*`` environment variables, read once into one :class:`Settings`.

The CLI builds it (:meth:`Settings.from_env`) and hands it to the sweep (:func:`sweeps.run.api.run_sweep`); the
REST service builds the same object (:class:`service.settings.Settings` extends it with the variables that are not
``CRITBATCH_*`` and the checks only a serving process makes), so each variable is read in one place. Where a value must reach a Ray worker or a subprocess, the environment is still how it
travels; this object is what the product reads. Test-only ``CRITBATCH_TEST_*`` variables are not settings.

=================================== ============================================================ ==========
variable                            meaning                                                      default
=================================== ============================================================ ==========
``CRITBATCH_OPTUNA_STORAGE``        Optuna RDB URL that outlives the cluster                     ``OUT/optuna.db``
``CRITBATCH_STORAGE_PATH``          Tune/Train state shared by every node (folder or URI)        the output folder
``CRITBATCH_TRIAL_RUNNERS``         ``0``: a Ray Train run per trial instead of trial runners    ``1``
``CRITBATCH_RAY_CONNECT_TIMEOUT_S`` how long a given Ray address may take to answer (seconds)    30
``CRITBATCH_MLFLOW_DRAIN_S``        how long the end of a sweep retries MLflow writes (seconds)  300
``CRITBATCH_TRACKING_SINKS``        comma-separated tracking sinks (``sweeps.tracking.registry``) ``mlflow``
=================================== ============================================================ ==========

The REST service's variables are fields here too (``api_token`` ... ``job_python``; their meanings and defaults:
the table of :mod:`service.settings`, which checks them); the driver does not read them.

Imports nothing but the standard library and :mod:`sweeps.errors`: the service may import it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from sweeps.errors import InvalidInput

__all__ = ["Settings", "SettingsError", "env_float", "env_int", "env_positive"]


class SettingsError(InvalidInput):
    """The product (the sweep driver, or the service) cannot run with these settings: a ``CRITBATCH_*``
    variable holds a value it cannot use, named in the message. Invalid input: the CLI exits 2."""


def env_float(env: Mapping[str, str], name: str, *, positive: bool = False) -> float | None:
    """``env[name]`` as a finite number of seconds (or other unit), or None when it is unset or blank.

    Raises:
        SettingsError: not a finite number (or, with ``positive``, not above 0; else below 0); the message
            names ``name``.
    """
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number of seconds") from None
    if not (0 < value if positive else 0 <= value) or not math.isfinite(value):
        raise SettingsError(
            f"{name} must be a {'positive' if positive else 'non-negative'} number of seconds, got {raw!r}"
        )
    return value


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """``env[name]`` as an int, or None when it is unset or blank.

    Raises:
        SettingsError: not an integer; the message names ``name``.
    """
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


def env_positive(env: Mapping[str, str], name: str) -> float | None:
    """``env[name]`` as a positive number (megabytes, seconds: the variable's unit), or None when it is unset or
    empty.

    Raises:
        SettingsError: not a number, or not above 0; the message names ``name``.
    """
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise SettingsError(f"{name} must be positive, got {raw!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the sweep driver reads from its environment (see the module's table).

    Attributes:
        optuna_storage: an Optuna RDB URL shared beyond the output folder, or None (``OUT/optuna.db``).
        storage_path: the base of Tune/Train state shared by every node, or None (the output folder).
        trial_runners: long-lived trial runners (``sweeps.launch.runners``), else a Ray Train run per trial.
        ray_connect_timeout_s: how long a given Ray address may take to answer, in seconds; None: the
            default (:data:`sweeps.launch.reach.DEFAULT_CONNECT_TIMEOUT_S`).
        mlflow_drain_s: how long the end of a sweep retries writes its tracker could not deliver, in seconds.
        tracking_sinks: the tracking sinks by name (:data:`sweeps.tracking.registry.SINKS`), the primary first.

    The REST service's fields, from ``api_token`` on, are described (and checked) in :mod:`service.settings`.
    """

    optuna_storage: str | None = None
    storage_path: str | None = None
    trial_runners: bool = True
    ray_connect_timeout_s: float | None = None
    mlflow_drain_s: float = 300.0
    tracking_sinks: tuple[str, ...] = ("mlflow",)
    # the REST service's
    api_token: str | None = None
    max_body_bytes: int = 1024 * 1024
    data_dir: str | None = None
    mlflow_ui_url: str | None = None
    ship_data_max_mb: float | None = None
    upload_max_mb: float | None = None
    job_python: str | None = None
    cluster_data_dir: str | None = None
    storage_root: str | None = None
    max_running: int = 4
    ray_timeout_s: float = 10.0
    mlflow_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    ready_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.tracking_sinks:
            raise SettingsError("CRITBATCH_TRACKING_SINKS names no sink")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **others: Any) -> Self:
        """Read the settings from ``env`` (default ``os.environ``); unset or blank variables take the defaults.
        ``others``: the fields of a subclass that are not ``CRITBATCH_*`` variables (the service's).

        Raises:
            SettingsError: a malformed value; the message names the variable.
        """
        env = os.environ if env is None else env
        return cls(**_driver_fields(env), **_service_fields(env), **others)


def _driver_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The sweep driver's fields of :class:`Settings` from ``env`` (unset: left out, the default)."""
    drain = env_float(env, "CRITBATCH_MLFLOW_DRAIN_S")
    sinks = tuple(s.strip() for s in (env.get("CRITBATCH_TRACKING_SINKS") or "").split(",") if s.strip())
    return {
        "optuna_storage": env.get("CRITBATCH_OPTUNA_STORAGE") or None,
        "storage_path": env.get("CRITBATCH_STORAGE_PATH") or None,
        "trial_runners": env.get("CRITBATCH_TRIAL_RUNNERS", "1") != "0",
        "ray_connect_timeout_s": env_float(env, "CRITBATCH_RAY_CONNECT_TIMEOUT_S", positive=True),
        "mlflow_drain_s": 300.0 if drain is None else drain,
        "tracking_sinks": sinks or ("mlflow",),
    }


def _service_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The REST service's fields of :class:`Settings` from ``env`` (``service.settings``' table)."""
    max_body = env_int(env, "CRITBATCH_MAX_BODY_BYTES")
    max_running = env_int(env, "CRITBATCH_MAX_RUNNING")
    return {
        "api_token": env.get("CRITBATCH_API_TOKEN") or None,
        "max_body_bytes": 1024 * 1024 if max_body is None else max_body,
        "data_dir": env.get("CRITBATCH_DATA_DIR") or None,
        "mlflow_ui_url": env.get("CRITBATCH_MLFLOW_UI_URL") or None,
        "ship_data_max_mb": env_positive(env, "CRITBATCH_SHIP_DATA_MAX_MB"),
        "upload_max_mb": env_positive(env, "CRITBATCH_UPLOAD_MAX_MB"),
        "job_python": env.get("CRITBATCH_JOB_PYTHON") or None,
        "cluster_data_dir": env.get("CRITBATCH_CLUSTER_DATA_DIR") or None,
        "storage_root": env.get("CRITBATCH_STORAGE_ROOT") or None,
        "max_running": 4 if max_running is None else max_running,
        "ray_timeout_s": env_positive(env, "CRITBATCH_RAY_TIMEOUT_S") or 10.0,
        "mlflow_timeout_s": env_positive(env, "CRITBATCH_MLFLOW_TIMEOUT_S") or 10.0,
        "request_timeout_s": env_positive(env, "CRITBATCH_REQUEST_TIMEOUT_S") or 30.0,
        "ready_timeout_s": env_positive(env, "CRITBATCH_READY_TIMEOUT_S") or 2.0,
    }
