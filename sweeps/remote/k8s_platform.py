"""What the critbatch platform (``k8s/base``) provides to a sweep's pods, by name, for the manifests of
:mod:`sweeps.remote.k8s`: the MLflow server, the object store that holds Tune's state, and the Secret
holding the URL of the PostgreSQL database that keeps the Optuna studies. Both stores outlive a sweep's
Ray cluster, so a retried or preempted ``RayJob`` finds its trials and its studies again.

Plain data: imports neither Ray nor Kubernetes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sweeps.errors import InvalidInput

__all__ = [
    "MLFLOW_TRACKING_URI",
    "OPTUNA_STORAGE_ENV",
    "OPTUNA_STORAGE_SECRET",
    "S3_ENDPOINT_URL",
    "S3_REGION",
    "S3_SECRET",
    "TUNE_STORAGE_URI",
    "SecretKeyRef",
    "optuna_storage_env",
    "parse_secret_key_ref",
    "ray_env",
]

MLFLOW_TRACKING_URI = "http://critbatch-mlflow:5000"
S3_ENDPOINT_URL = "http://critbatch-minio:9000"
S3_SECRET = "critbatch-s3"  # keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
TUNE_STORAGE_URI = "s3://critbatch-tune"  # the driver keeps Tune state under <this>/<sweep id>
S3_REGION = "us-east-1"
#: the variable the sweep driver reads its Optuna study storage URL from (``sweeps.store.state.optuna_storage_url``)
OPTUNA_STORAGE_ENV = "CRITBATCH_OPTUNA_STORAGE"

_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # DNS-1123 subdomain
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True, kw_only=True)
class SecretKeyRef:
    """One key of a Kubernetes Secret in the sweep's namespace (a container's ``secretKeyRef``).

    Attributes:
        name: the Secret's name (a DNS-1123 subdomain, at most 253 characters).
        key: the key inside it (letters, digits, ``-``, ``_`` and ``.``, at most 253 characters).
    """

    name: str
    key: str

    def __post_init__(self) -> None:
        if not (len(self.name) <= 253 and _SECRET_NAME.fullmatch(self.name)):
            raise InvalidInput(f"Secret name {self.name!r}: not a DNS-1123 subdomain (lower case, digits, '-', '.')")
        if not (len(self.key) <= 253 and _SECRET_KEY.fullmatch(self.key)) or self.key in (".", ".."):
            raise InvalidInput(f"Secret key {self.key!r}: use letters, digits, '-', '_' and '.'")

    def env(self, variable: str) -> dict:
        """The container ``env`` entry that sets ``variable`` from this key (the pod does not start without it)."""
        return {"name": variable, "valueFrom": {"secretKeyRef": {"name": self.name, "key": self.key}}}


#: ``k8s/base/secrets.yaml``'s ``critbatch-optuna``: key ``url``, an Optuna RDB URL (``postgresql+psycopg2://...``)
OPTUNA_STORAGE_SECRET = SecretKeyRef(name="critbatch-optuna", key="url")


def parse_secret_key_ref(text: str, *, option: str) -> SecretKeyRef | None:
    """``NAME`` or ``NAME:KEY`` as a :class:`SecretKeyRef` (``KEY`` defaults to :data:`OPTUNA_STORAGE_SECRET`'s);
    ``""`` is None (no Secret).

    Raises:
        InvalidInput: not a Secret name or key, naming ``option``.
    """
    if not text:
        return None
    name, _, key = text.partition(":")
    try:
        return SecretKeyRef(name=name, key=key or OPTUNA_STORAGE_SECRET.key)
    except InvalidInput as exc:
        raise InvalidInput(f"{option} {text!r}: {exc}") from None


def ray_env() -> list[dict]:
    """Environment of every Ray container: the MLflow server, and Tune storage in the object store.

    ``k8s/base/raycluster.yaml`` gives the service's RayCluster the same list (a test holds them equal).
    """
    return [
        {"name": "MLFLOW_TRACKING_URI", "value": MLFLOW_TRACKING_URI},
        {"name": "CRITBATCH_STORAGE_PATH", "value": TUNE_STORAGE_URI},
        {"name": "AWS_ENDPOINT_URL", "value": S3_ENDPOINT_URL},
        {"name": "AWS_REGION", "value": S3_REGION},
        {"name": "AWS_DEFAULT_REGION", "value": S3_REGION},
        SecretKeyRef(name=S3_SECRET, key="AWS_ACCESS_KEY_ID").env("AWS_ACCESS_KEY_ID"),
        SecretKeyRef(name=S3_SECRET, key="AWS_SECRET_ACCESS_KEY").env("AWS_SECRET_ACCESS_KEY"),
    ]


def optuna_storage_env(secret: SecretKeyRef | None) -> list[dict]:
    """``CRITBATCH_OPTUNA_STORAGE`` from ``secret``, for the container that runs the sweep driver (the head);
    none without a Secret, so that the driver keeps its studies in ``sqlite:///OUT/optuna.db`` on the pod's disk."""
    return [] if secret is None else [secret.env(OPTUNA_STORAGE_ENV)]
