"""Kubernetes manifests for one sweep: a KubeRay ``RayJob`` and a ``ConfigMap`` holding the spec.

:func:`render_rayjob` is a pure function of the validated spec, its YAML text, the image, the
namespace and two options (the Optuna storage Secret, a Kueue queue). The ``RayJob`` brings up a
``RayCluster`` of its own (``K8sJobMode``), submits ``critbatch run`` to it, and deletes the cluster
shortly after the sweep ends, however it ends. It
assumes the platform from ``k8s/base`` runs in the same namespace (:mod:`sweeps.remote.k8s_platform`):
the MLflow server (``critbatch-mlflow``), the S3-compatible object store (``critbatch-minio``, holding
Tune storage so that a retried job finds the trials already done), the ``critbatch-s3`` Secret with
the store's access keys, and the ``critbatch-optuna`` Secret with the URL of the PostgreSQL database
that keeps the Optuna studies (so that the retried job finds them too).

Sizing (one pod per concurrently running trial):

* each worker pod holds one trial: ``workers_per_trial x cpus_per_worker + trial_driver_cpus``
  CPUs rounded up to a whole CPU (Ray counts whole CPUs per node), and
  ``workers_per_trial x gpus_per_worker`` GPUs rounded up;
* there are ``min(max_concurrent_trials, planned trials)`` worker pods, a fixed number
  (``minReplicas == replicas == maxReplicas``);
* memory is not in the spec: ``max(4, 2 x CPUs + 8 x GPUs)`` GiB per worker pod;
* every container's requests equal its limits (Guaranteed QoS), and the head has
  ``num-cpus: "0"`` so that no trial runs beside the GCS, the dashboard and the sweep driver;
* the head's memory is 6 GiB plus 1 GiB per trial runner (:func:`head_memory_gib`): each runner's host
  actor and Ray Train controller take no CPU and run on the head.

The ``RayJob`` is allowed ``budget.wall_clock_s`` (24 h when the spec sets none) plus 30 minutes
for the cluster to start and the report to be written. With a Kueue queue the ``RayJob`` carries the
label ``kueue.x-k8s.io/queue-name``; Kueue's webhook suspends it on creation until it is admitted.
What the image carries (its working directory, the inputs it leaves out): :mod:`sweeps.remote.k8s_image`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from sweeps.errors import InvalidInput
from sweeps.remote.k8s_image import WORKDIR, image_data_warnings
from sweeps.remote.k8s_platform import (
    MLFLOW_TRACKING_URI,
    OPTUNA_STORAGE_SECRET,
    S3_SECRET,
    SecretKeyRef,
    optuna_storage_env,
    parse_secret_key_ref,
    ray_env,
)
from sweeps.spec import SweepSpec

__all__ = [
    "KUEUE_QUEUE_LABEL",
    "MAX_RAYJOB_NAME_LENGTH",
    "MLFLOW_TRACKING_URI",
    "OPTUNA_STORAGE_SECRET",
    "RAY_VERSION",
    "S3_SECRET",
    "SecretKeyRef",
    "TrialPodResources",
    "active_deadline_s",
    "dump_manifests",
    "head_memory_gib",
    "image_data_warnings",
    "parse_secret_key_ref",
    "ray_env",
    "rayjob_name",
    "render_rayjob",
    "trial_pod_resources",
]

# ---- KubeRay and Ray ----------------------------------------------------------------------------

RAY_VERSION = "2.60.0"  # the ray pinned in pyproject.toml, and so in the image
MAX_RAYJOB_NAME_LENGTH = 47  # KubeRay: RayCluster names <= 53, and it appends 6 characters
TTL_AFTER_FINISHED_S = 300  # keep the finished cluster 5 minutes for `kubectl logs`
DEADLINE_GRACE_S = 1800  # cluster start, image pulls, analysis and report
DEFAULT_DEADLINE_S = 86400  # when the spec sets no budget.wall_clock_s
RAYJOB_BACKOFF_LIMIT = 1  # one retry on a new cluster; Tune storage in S3 and the studies in PostgreSQL let it resume
SUBMITTER_BACKOFF_LIMIT = 2  # the submitter only submits (or follows) the Ray job: cheap to retry
INT32_MAX = 2**31 - 1
#: Kueue's label naming the LocalQueue a job waits in (kueue.sigs.k8s.io, "Run A RayJob")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# ---- pods ---------------------------------------------------------------------------------------

SPEC_MOUNT_DIR = "/critbatch/spec"
OUTPUT_DIR = "/tmp/critbatch-out"
HEAD_CPUS = "2"
#: the head's memory without trial runners: the GCS, the dashboard, the sweep's driver and Tune
HEAD_BASE_MEMORY_GIB = 6
#: the head's memory per trial runner: its host actor and Ray Train controller (0 CPU each, so Ray places them
#: beside the driver on the head) and Ray Train's synchronization actor. Measured on a local sweep (peak RSS,
#: 2026-12-05: host 386, controller 379, synchronization actor 189 MiB), rounded up; docs/benchmarks.md
RUNNER_MEMORY_GIB = 1
SUBMITTER_CPU = "500m"
SUBMITTER_MEMORY = "512Mi"
MIN_MEMORY_GIB = 4
MEMORY_GIB_PER_CPU = 2
MEMORY_GIB_PER_GPU = 8
WORKER_GROUP = "trials"

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HASH_CHARS = 8
_EPS = 1e-9


def rayjob_name(sweep_name: str) -> str:
    """The ``RayJob`` name for a sweep: a DNS-1035 label of at most 47 characters.

    A sweep name that already is such a label is used as it is. Any other (upper case, ``_`` or
    ``.``, a leading digit, or too long) is lowered, its other characters turned into ``-``, cut
    to fit, and given ``-`` and the first 8 hex digits of the SHA-256 of the original name, so that
    the result is stable and two names that clean up alike still differ.

    >>> rayjob_name("shakespeare-char")
    'shakespeare-char'
    >>> rayjob_name("Shakespeare_char")
    'shakespeare-char-7bed2ad2'
    """
    if len(sweep_name) <= MAX_RAYJOB_NAME_LENGTH and _DNS1035_LABEL.fullmatch(sweep_name):
        return sweep_name
    base = re.sub(r"[^a-z0-9]+", "-", sweep_name.lower()).strip("-")
    if not base[:1].isalpha():
        base = f"sweep-{base}".rstrip("-")
    digest = hashlib.sha256(sweep_name.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    head = base[: MAX_RAYJOB_NAME_LENGTH - 1 - _HASH_CHARS].rstrip("-")
    return f"{head}-{digest}"


@dataclass(frozen=True, kw_only=True)
class TrialPodResources:
    """One Ray worker pod, sized for one trial.

    Attributes:
        cpus: whole CPUs (requests = limits = Ray's ``num-cpus``).
        gpus: whole GPUs (``nvidia.com/gpu``), 0 for CPU-only sweeps.
        memory_gib: memory in GiB (requests = limits).
        replicas: worker pods, one per concurrently running trial.
    """

    cpus: int
    gpus: int
    memory_gib: int
    replicas: int


def trial_pod_resources(spec: SweepSpec) -> TrialPodResources:
    """Size the worker pods from the spec's per-trial needs and its trial concurrency.

    A trial needs ``workers_per_trial x cpus_per_worker`` CPUs for its Ray Train workers plus
    ``trial_driver_cpus`` for its Tune trainable, and ``workers_per_trial x gpus_per_worker``
    GPUs; both are rounded up to whole units. Example (the Tiny Shakespeare sweep): 1 worker x
    1 CPU + 0.01 = 1.01, so 2 CPUs, 4 GiB, and 2 pods for ``max_concurrent_trials: 2``.
    """
    r = spec.resources
    cpus = math.ceil(r.workers_per_trial * r.cpus_per_worker + r.trial_driver_cpus - _EPS)
    gpus = math.ceil(r.workers_per_trial * r.gpus_per_worker - _EPS) if r.gpus_per_worker > 0 else 0
    memory_gib = max(MIN_MEMORY_GIB, MEMORY_GIB_PER_CPU * cpus + MEMORY_GIB_PER_GPU * gpus)
    replicas = min(r.max_concurrent_trials, spec.n_trials)
    return TrialPodResources(cpus=cpus, gpus=gpus, memory_gib=memory_gib, replicas=replicas)


def head_memory_gib(spec: SweepSpec) -> int:
    """The head pod's memory in GiB: :data:`HEAD_BASE_MEMORY_GIB` plus :data:`RUNNER_MEMORY_GIB` for each trial
    runner (``min(max_concurrent_trials, max_trials)`` of them, ``sweeps.launch.launcher.sweep_runners``), whose
    host actor and Ray Train controller take no CPU and so run on the head beside the driver. Example (the Tiny
    Shakespeare sweep, 2 at a time): 6 + 2 x 1 = 8 GiB."""
    return HEAD_BASE_MEMORY_GIB + RUNNER_MEMORY_GIB * min(spec.resources.max_concurrent_trials, spec.max_trials)


def active_deadline_s(spec: SweepSpec) -> int:
    """Seconds the ``RayJob`` may run: the sweep's wall-clock budget (24 h if unset) + 30 min."""
    wall = spec.budget.wall_clock_s
    budget_s = DEFAULT_DEADLINE_S if wall is None else math.ceil(wall)
    return min(budget_s + DEADLINE_GRACE_S, INT32_MAX)


def _check_args(image: str, namespace: str | None, queue_name: str | None) -> None:
    if not image or any(c.isspace() for c in image):
        raise InvalidInput(f"--image: not a container image reference: {image!r}")
    if namespace is not None and not (len(namespace) <= 63 and _DNS1123_LABEL.fullmatch(namespace)):
        raise InvalidInput(f"--namespace: not a valid namespace name (a DNS-1123 label): {namespace!r}")
    # a LocalQueue's name (a DNS-1123 subdomain) that is also a label value (at most 63 characters)
    if queue_name is not None and not (len(queue_name) <= 63 and _DNS1123_SUBDOMAIN.fullmatch(queue_name)):
        raise InvalidInput(
            f"--queue-name: not a Kueue LocalQueue name (a DNS-1123 subdomain of at most 63 characters): {queue_name!r}"
        )


def _metadata(name: str, namespace: str | None, labels: dict[str, str], annotations: dict[str, str]) -> dict:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _pod_security() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _guaranteed(resources: dict[str, str]) -> dict:
    return {"requests": dict(resources), "limits": dict(resources)}


def _ray_pod(
    *,
    container: str,
    image: str,
    labels: dict[str, str],
    resources: dict[str, str],
    spec_configmap: str,
    ports: list[dict] | None = None,
    extra_env: list[dict] | None = None,
) -> dict:
    c: dict[str, Any] = {
        "name": container,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": WORKDIR,
        "env": ray_env() + list(extra_env or []),
    }
    if ports:
        c["ports"] = ports
    c["resources"] = _guaranteed(resources)
    c["securityContext"] = _container_security()
    c["volumeMounts"] = [
        {"name": "spec", "mountPath": SPEC_MOUNT_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": _pod_security(),
            "containers": [c],
            "volumes": [
                {"name": "spec", "configMap": {"name": spec_configmap}},
                # Ray's object store lives in /dev/shm; the default 64 MiB would push it to disk.
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }


def render_rayjob(
    spec: SweepSpec,
    spec_yaml_text: str,
    image: str,
    namespace: str | None,
    *,
    optuna_storage: SecretKeyRef | None = OPTUNA_STORAGE_SECRET,
    queue_name: str | None = None,
) -> list[dict]:
    """Render the manifests that run one sweep on Kubernetes: ``[ConfigMap, RayJob]``.

    Args:
        spec: the validated sweep spec.
        spec_yaml_text: the spec file's text, stored as ``spec.yaml`` in the ConfigMap and mounted
            at ``/critbatch/spec`` in the Ray pods.
        image: the critbatch container image (see the ``Dockerfile``) for the head, the workers
            and the submitter.
        namespace: the namespace of the platform (``k8s/base``); None leaves it out, so that
            ``kubectl`` or a kustomize overlay decides.
        optuna_storage: the Secret key holding the Optuna study storage URL, set as
            ``CRITBATCH_OPTUNA_STORAGE`` on the head (where the driver runs); None keeps the studies in
            ``sqlite:///OUT/optuna.db`` on the head's disk, which a retried job does not find.
        queue_name: a Kueue LocalQueue: the RayJob gets the label ``kueue.x-k8s.io/queue-name``.

    Returns:
        Two plain dicts, ready for ``yaml.safe_dump_all``: the ConfigMap ``<name>-spec`` and the
        RayJob ``<name>``, where ``<name>`` is :func:`rayjob_name` of the sweep name.

    Raises:
        InvalidInput: the image, the namespace or the queue is not a valid reference/name.
    """
    _check_args(image, namespace, queue_name)
    name = rayjob_name(spec.name)
    configmap = f"{name}-spec"
    labels = {
        "app.kubernetes.io/name": "critbatch",
        "app.kubernetes.io/component": "sweep",
        "app.kubernetes.io/part-of": "critbatch",
        "critbatch.io/sweep": name,
    }
    annotations = {
        "critbatch.io/sweep-name": spec.name,
        "critbatch.io/spec-fingerprint": spec.fingerprint(),
    }
    entrypoint = (
        f"critbatch run {SPEC_MOUNT_DIR}/spec.yaml --output {OUTPUT_DIR} "
        f"--tracking-uri $MLFLOW_TRACKING_URI --sweep-id {name} --no-progress"
    )
    queue = {} if queue_name is None else {KUEUE_QUEUE_LABEL: queue_name}
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(name, namespace, {**labels, **queue}, annotations),
        "spec": {
            "submissionMode": "K8sJobMode",
            "entrypoint": entrypoint,
            # KubeRay deletes the cluster ttlSecondsAfterFinished after the deployment ends, Complete or Failed
            # (activeDeadlineSeconds too), whatever the Ray job's status says. deletionStrategy.deletionRules
            # cannot be set beside it, and Kueue requires it (docs/kubernetes.md, "Lifetime").
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "activeDeadlineSeconds": active_deadline_s(spec),
            "backoffLimit": RAYJOB_BACKOFF_LIMIT,
            "submitterConfig": {"backoffLimit": SUBMITTER_BACKOFF_LIMIT},
            "submitterPodTemplate": _submitter_pod(image, labels),
            "rayClusterSpec": _ray_cluster_spec(spec, image, labels, configmap, optuna_storage_env(optuna_storage)),
        },
    }
    configmap_obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(configmap, namespace, labels, annotations),
        "data": {"spec.yaml": spec_yaml_text},
    }
    return [configmap_obj, rayjob]


def _submitter_pod(image: str, labels: dict[str, str]) -> dict:
    """The pod template of KubeRay's submitter (it submits the Ray job and follows it)."""
    return {
        "metadata": {"labels": {**labels, "app.kubernetes.io/component": "ray-job-submitter"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": _pod_security(),
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    # KubeRay pastes the entrypoint into the submitter's shell command, so
                    # $MLFLOW_TRACKING_URI is expanded here (and must have the same value).
                    "env": [{"name": "MLFLOW_TRACKING_URI", "value": MLFLOW_TRACKING_URI}],
                    "resources": _guaranteed({"cpu": SUBMITTER_CPU, "memory": SUBMITTER_MEMORY}),
                    "securityContext": _container_security(),
                }
            ],
        },
    }


def _ray_cluster_spec(
    spec: SweepSpec, image: str, labels: dict[str, str], configmap: str, head_env: list[dict]
) -> dict:
    """The RayJob's ``rayClusterSpec``: a head that runs no trials, and one worker group sized for
    the sweep's trials (:func:`trial_pod_resources`), token auth on. ``head_env`` is added to the head's
    environment only: the driver runs there, and the worker pods (trial code) need no database credentials."""
    pod = trial_pod_resources(spec)
    worker_resources = {"cpu": str(pod.cpus), "memory": f"{pod.memory_gib}Gi"}
    if pod.gpus:
        worker_resources["nvidia.com/gpu"] = str(pod.gpus)
    head = _ray_pod(
        container="ray-head",
        image=image,
        labels={**labels, "app.kubernetes.io/component": "ray-head"},
        resources={"cpu": HEAD_CPUS, "memory": f"{head_memory_gib(spec)}Gi"},
        spec_configmap=configmap,
        extra_env=head_env,
        ports=[
            {"name": "gcs-server", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "client", "containerPort": 10001},
        ],
    )
    worker = _ray_pod(
        container="ray-worker",
        image=image,
        labels={**labels, "app.kubernetes.io/component": "ray-worker"},
        resources=worker_resources,
        spec_configmap=configmap,
    )
    return {
        "rayVersion": RAY_VERSION,
        "enableInTreeAutoscaling": False,
        # KubeRay generates a token Secret for this cluster and hands it to every Ray
        # container and to the submitter: the dashboard runs any code it is sent.
        "authOptions": {"mode": "token"},
        "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": head},
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                "replicas": pod.replicas,
                "minReplicas": pod.replicas,
                "maxReplicas": pod.replicas,
                "rayStartParams": {},
                "template": worker,
            }
        ],
    }


class _BlockDumper(yaml.SafeDumper):
    """A YAML dumper that writes multi-line strings (the spec) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def dump_manifests(objects: list[dict]) -> str:
    """Write manifests as one multi-document YAML stream (``---`` between objects)."""
    return yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=120)
