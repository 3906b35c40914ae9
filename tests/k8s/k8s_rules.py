"""What an API server with KubeRay v1.7.0 checks beyond the OpenAPI schemas: KubeRay's own rules
(``ray-operator/controllers/ray/utils/validation.go`` and the webhook) and the API server's (names,
label keys and values, port names, requests <= limits). Used by :mod:`k8s_validate`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from k8s_references import pod_specs

__all__ = [
    "CRD_DIR",
    "CRD_FILES",
    "ENDINGS",
    "K8S_VERSION",
    "KUBERAY_VERSION",
    "api_server_rules",
    "cluster_deleted_when_ended",
    "kuberay_rules",
    "parse_quantity",
]

K8S_VERSION = "1.33.0"
KUBERAY_VERSION = "1.7.0"
CRD_DIR = Path(__file__).parent / "crds"
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
MAX_RAYJOB_NAME = 47  # utils.MaxRayJobNameLength = MaxRayClusterNameLength - 6
MAX_RAYCLUSTER_NAME = 53  # utils.MaxRayClusterNameLength

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")

# ---- KubeRay's rules beyond the schema -------------------------------------------------------------


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def _cluster_rules(spec: dict, where: str) -> Iterator[str]:
    groups = [("Head", spec.get("headGroupSpec", {}))] + [
        (g.get("groupName", "?"), g) for g in spec.get("workerGroupSpecs", [])
    ]
    for name, group in groups:
        if not group.get("template", {}).get("spec", {}).get("containers"):
            yield f"{where}: group {name}: the pod template needs at least one container"
        params = group.get("rayStartParams", {})
        if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and group.get("resources"):
            yield f"{where}: group {name}: resources set in both rayStartParams and resources"
        if "labels" in params:
            yield f"{where}: group {name}: rayStartParams['labels'] is not supported; use labels"
        for key, value in (group.get("labels") or {}).items():
            yield from _label_problems(f"{where}: group {name}: labels", key, value)
    seen = set()
    for g in spec.get("workerGroupSpecs", []):
        name = g.get("groupName", "")
        if name in seen:
            yield f"{where}: worker group name {name!r} is used twice"
        seen.add(name)
        lo, hi = g.get("minReplicas", 0), g.get("maxReplicas", 2**31 - 1)
        if lo < 0 or hi < 0:
            yield f"{where}: worker group {name}: negative minReplicas/maxReplicas"
        if lo > hi:
            yield f"{where}: worker group {name}: minReplicas {lo} > maxReplicas {hi}"
        if g.get("suspend") and spec.get("enableInTreeAutoscaling"):
            yield f"{where}: worker group {name} cannot be suspended with the autoscaler enabled"
    head_env = {
        e.get("name"): e.get("value")
        for e in (spec.get("headGroupSpec", {}).get("template", {}).get("spec", {}).get("containers") or [{}])[0].get(
            "env", []
        )
    }
    if not spec.get("enableInTreeAutoscaling") and head_env.get("RAY_enable_autoscaler_v2") in ("1", "true"):
        yield f"{where}: RAY_enable_autoscaler_v2 set while enableInTreeAutoscaling is false"
    if (spec.get("authOptions") or {}).get("mode") == "token":
        version = spec.get("rayVersion", "")
        if not version:
            yield f"{where}: authOptions.mode token needs rayVersion (>= 2.52.0)"
        elif _version_tuple(version) < (2, 52, 0):
            yield f"{where}: authOptions.mode token needs Ray >= 2.52.0, got {version}"
    if spec.get("gcsFaultToleranceOptions") is not None or "redis-username" in spec.get("headGroupSpec", {}).get(
        "rayStartParams", {}
    ):
        yield f"{where}: GCS fault-tolerance settings are not checked by this validator"


def kuberay_rules(obj: dict) -> list[str]:
    """KubeRay v1.7.0's checks that the CRD schema does not express, on a defaulted object."""
    kind, meta, spec = obj.get("kind"), obj.get("metadata", {}), obj.get("spec", {})
    name = meta.get("name", "")
    out: list[str] = []
    limit = MAX_RAYJOB_NAME if kind == "RayJob" else MAX_RAYCLUSTER_NAME
    if len(name) > limit:
        out.append(f"metadata.name: {kind} names are at most {limit} characters ({len(name)})")
    if not DNS1035_LABEL.fullmatch(name):
        out.append(f"metadata.name: {kind} names must be DNS-1035 labels: {name!r}")
    if kind == "RayCluster":
        out.extend(_cluster_rules(spec, "spec"))
        return out
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    mode = spec.get("submissionMode", "K8sJobMode")
    if spec.get("suspend") and not shutdown:
        out.append("spec.suspend needs shutdownAfterJobFinishes: true")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        out.append("spec.ttlSecondsAfterFinished must be >= 0")
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not shutdown:
        out.append("spec.ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true")
    out.extend(_deletion_strategy_rules(spec))
    selector = spec.get("clusterSelector") or {}
    if spec.get("rayClusterSpec") is None and not selector:
        out.append("spec: one of rayClusterSpec and clusterSelector must be set")
    if selector and spec.get("suspend"):
        out.append("spec: clusterSelector mode cannot be suspended")
    if mode == "InteractiveMode" and spec.get("backoffLimit", 0) > 0:
        out.append("spec.backoffLimit is incompatible with InteractiveMode")
    if mode == "SidecarMode" and (spec.get("submitterPodTemplate") or spec.get("submitterConfig")):
        out.append("spec: SidecarMode supports neither submitterPodTemplate nor submitterConfig")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        out.append("spec.activeDeadlineSeconds must be > 0")
    if spec.get("backoffLimit", 0) < 0:
        out.append("spec.backoffLimit must be >= 0")
    if spec.get("runtimeEnvYAML"):
        try:
            env = yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError as exc:
            out.append(f"spec.runtimeEnvYAML is not YAML: {exc}")
        else:
            if not isinstance(env, dict):
                out.append("spec.runtimeEnvYAML must be a mapping")
    submitter = (spec.get("submitterPodTemplate") or {}).get("spec")
    if submitter is not None and submitter.get("restartPolicy") not in ("Never", "OnFailure"):
        out.append("spec.submitterPodTemplate.spec.restartPolicy must be Never or OnFailure (a Job's pod)")
    if spec.get("rayClusterSpec") is not None:
        out.extend(_cluster_rules(spec["rayClusterSpec"], "spec.rayClusterSpec"))
    return out


_POLICIES_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")  # TTLs must not decrease along this order


def _deletion_strategy_rules(spec: dict) -> Iterator[str]:
    """``validateDeletionConfiguration`` of v1.7.0, with the RayJobDeletionPolicy gate on (Beta, on by default)."""
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return
    where = "spec.deletionStrategy"
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    selector = bool(spec.get("clusterSelector"))
    autoscaling = bool((spec.get("rayClusterSpec") or {}).get("enableInTreeAutoscaling"))
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = strategy.get("deletionRules") or []
    if rules and shutdown:
        yield "spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually exclusive"
        return
    if rules and legacy:
        yield f"{where}: legacy onSuccess/onFailure and deletionRules cannot be used together"
        return
    if legacy:
        policies = [(strategy.get(k) or {}).get("policy") for k in ("onSuccess", "onFailure")]
        if None in policies:
            yield f"{where}: onSuccess and onFailure must both be set, each with a policy"
            return
        if selector and {"DeleteCluster", "DeleteWorkers"} & set(policies):
            yield f"{where}: clusterSelector mode supports neither DeleteCluster nor DeleteWorkers"
        if autoscaling and "DeleteWorkers" in policies:
            yield f"{where}: DeleteWorkers is not supported with autoscaling"
        if shutdown and "DeleteNone" in policies:
            yield f"{where}: DeleteNone with shutdownAfterJobFinishes: true"
        return
    if not rules:
        yield f"{where}: needs both onSuccess and onFailure, or deletionRules"
        return
    ttls: dict[tuple[str, str], dict[str, int]] = {}
    for i, rule in enumerate(rules):
        cond, policy = rule.get("condition") or {}, rule.get("policy")
        keys = [k for k in ("jobStatus", "jobDeploymentStatus") if cond.get(k) is not None]
        if len(keys) != 1:
            yield f"{where}.deletionRules[{i}]: exactly one of jobStatus and jobDeploymentStatus must be set"
            continue
        if selector and policy in ("DeleteCluster", "DeleteWorkers"):
            yield f"{where}.deletionRules[{i}]: {policy} is not supported with clusterSelector"
            continue
        if autoscaling and policy == "DeleteWorkers":
            yield f"{where}.deletionRules[{i}]: DeleteWorkers is not supported with autoscaling"
            continue
        by_policy = ttls.setdefault((keys[0], cond[keys[0]]), {})
        if policy in by_policy:
            yield f"{where}.deletionRules[{i}]: duplicate rule for {policy} and {keys[0]} {cond[keys[0]]}"
            continue
        by_policy[policy] = cond.get("ttlSeconds", 0)
    for (key, value), by_policy in ttls.items():
        ordered = [(p, by_policy[p]) for p in _POLICIES_ORDER if p in by_policy]
        for (p0, t0), (p1, t1) in zip(ordered, ordered[1:]):
            if t1 < t0:
                yield f"{where}: for {key} {value}: {p1} TTL ({t1}) must be >= {p0} TTL ({t0})"


#: How a RayJob's deployment can end under KubeRay v1.7.0, as (JobDeploymentStatus, JobStatus), the states in which
#: it applies the deletion settings. Complete: the Ray job SUCCEEDED or was STOPPED; Failed: the Ray job FAILED, or
#: the deployment failed with the Ray job as last seen, RUNNING included, when activeDeadlineSeconds
#: (DeadlineExceeded) or the submitter ends it while Ray runs on (rayjob_controller.go; kuberay#2314, #5184).
ENDINGS = (("Complete", "SUCCEEDED"), ("Complete", "STOPPED")) + tuple(
    ("Failed", job) for job in ("", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")
)


def cluster_deleted_when_ended(obj: dict, deployment_status: str, job_status: str) -> bool:
    """Whether KubeRay v1.7.0 deletes a RayJob's RayCluster (once the TTLs pass) when its deployment ended in
    ``deployment_status`` with the Ray job last seen as ``job_status``; ``obj`` a defaulted RayJob.

    ``rayjob_controller.go``, case ``JobDeploymentStatusComplete, JobDeploymentStatusFailed``: nothing with a
    ``clusterSelector``; with a ``deletionStrategy`` (the RayJobDeletionPolicy gate on, its v1.7.0 default) its
    ``deletionRules`` (``isDeletionRuleMatched``: a rule's ``jobStatus`` or ``jobDeploymentStatus`` equals the
    RayJob's; ``DeleteCluster`` removes the cluster, ``DeleteSelf`` the RayJob that owns it) or the legacy
    ``onSuccess``/``onFailure`` (by ``jobStatus`` SUCCEEDED/FAILED only); else ``shutdownAfterJobFinishes``.
    """
    assert (deployment_status, job_status) in ENDINGS
    spec = obj["spec"]
    if spec.get("clusterSelector"):
        return False
    strategy = spec.get("deletionStrategy")
    removes = {"DeleteCluster", "DeleteSelf"}
    if strategy is not None and strategy.get("deletionRules"):
        status = {"jobStatus": job_status, "jobDeploymentStatus": deployment_status}
        return any(
            rule["policy"] in removes
            and any(rule["condition"].get(k) is not None and rule["condition"][k] == v for k, v in status.items())
            for rule in strategy["deletionRules"]
        )
    if strategy is not None:
        side = {"SUCCEEDED": "onSuccess", "FAILED": "onFailure"}.get(job_status)
        return side is not None and strategy[side]["policy"] in removes
    return bool(spec.get("shutdownAfterJobFinishes"))


# ---- what the API server checks beyond the OpenAPI schema ---------------------------------------------

_SUFFIX = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(q: str | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2", "6Gi", "1e3") as a Decimal."""
    text = str(q)
    m = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+))(.*)", text)
    if m and m.group(2) in _SUFFIX:
        return Decimal(m.group(1)) * Decimal(_SUFFIX[m.group(2)])
    if m and re.fullmatch(r"[eE][+-]?\d+", m.group(2)):
        return Decimal(text)
    raise ValueError(f"not a quantity: {q!r}")


def _label_problems(where: str, key: str, value: Any) -> Iterator[str]:
    prefix, _, name = key.rpartition("/")
    if prefix and not (len(prefix) <= 253 and DNS1123_SUBDOMAIN.fullmatch(prefix)):
        yield f"{where}: key {key!r}: bad prefix"
    if not (len(name) <= 63 and QUALIFIED_NAME.fullmatch(name)):
        yield f"{where}: key {key!r}: bad name"
    if value is not None:
        if not isinstance(value, str):
            yield f"{where}: {key}: value must be a string, got {value!r}"
        elif value and not (len(value) <= 63 and QUALIFIED_NAME.fullmatch(value)):
            yield f"{where}: {key}: bad label value {value!r}"


def _metadata_nodes(obj: dict) -> Iterator[tuple[str, dict]]:
    def walk(node: Any, path: str) -> Iterator[tuple[str, dict]]:
        if isinstance(node, dict):
            for key, value in node.items():
                sub = f"{path}.{key}" if path else key
                if key == "metadata" and isinstance(value, dict):
                    yield sub, value
                yield from walk(value, sub)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                yield from walk(item, f"{path}.{i}")

    yield from walk(obj, "")


def api_server_rules(obj: dict) -> list[str]:
    """Checks the API server makes beyond the OpenAPI schema, for the fields these manifests use."""
    out: list[str] = []
    kind, name = obj.get("kind"), obj.get("metadata", {}).get("name", "")
    if kind in ("Service", "Namespace", "StatefulSet"):
        if not (len(name) <= 63 and (DNS1035_LABEL if kind == "Service" else DNS1123_LABEL).fullmatch(name)):
            out.append(
                f"metadata.name: {kind} names must be DNS-{'1035' if kind == 'Service' else '1123'} labels: {name!r}"
            )
    elif not (len(name) <= 253 and DNS1123_SUBDOMAIN.fullmatch(name)):
        out.append(f"metadata.name: not a DNS-1123 subdomain: {name!r}")
    ns = obj.get("metadata", {}).get("namespace")
    if ns is not None and not DNS1123_LABEL.fullmatch(ns):
        out.append(f"metadata.namespace: not a DNS-1123 label: {ns!r}")
    for path, meta in _metadata_nodes(obj):
        for key, value in (meta.get("labels") or {}).items():
            out.extend(_label_problems(f"{path}.labels", key, value))
        for key in meta.get("annotations") or {}:
            out.extend(_label_problems(f"{path}.annotations", key, None))
    for path, pod in pod_specs(obj):
        names = set()
        for group in ("initContainers", "containers"):
            for i, c in enumerate(pod.get(group) or []):
                where = f"{path}.{group}.{i}"
                cname = c.get("name", "")
                if not (len(cname) <= 63 and DNS1123_LABEL.fullmatch(cname)):
                    out.append(f"{where}.name: not a DNS-1123 label: {cname!r}")
                if cname in names:
                    out.append(f"{where}.name: {cname!r} used twice in one pod")
                names.add(cname)
                for p in c.get("ports") or []:
                    pname = p.get("name")
                    if pname is not None and not (
                        len(pname) <= 15
                        and IANA_SVC_NAME.fullmatch(pname)
                        and "--" not in pname
                        and re.search("[a-z]", pname)
                    ):
                        out.append(f"{where}.ports: bad port name {pname!r}")
                res = c.get("resources") or {}
                for rname, limit in (res.get("limits") or {}).items():
                    request = (res.get("requests") or {}).get(rname)
                    if request is not None and parse_quantity(request) > parse_quantity(limit):
                        out.append(f"{where}.resources: {rname} request {request} > limit {limit}")
                for e in c.get("env") or []:
                    if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", e.get("name", "")):
                        out.append(f"{where}.env: bad variable name {e.get('name')!r}")
        vol_names = [v.get("name") for v in pod.get("volumes") or []]
        if len(vol_names) != len(set(vol_names)):
            out.append(f"{path}.volumes: duplicate names")
        for group in ("initContainers", "containers"):
            for c in pod.get(group) or []:
                for m in c.get("volumeMounts") or []:
                    if m.get("name") not in vol_names and not _is_template_claim(obj, m.get("name")):
                        out.append(f"{path}.{group}: volumeMount {m.get('name')!r} names no volume")
    return out


def _is_template_claim(obj: dict, name: str | None) -> bool:
    claims = obj.get("spec", {}).get("volumeClaimTemplates") or []
    return any(c.get("metadata", {}).get("name") == name for c in claims)
