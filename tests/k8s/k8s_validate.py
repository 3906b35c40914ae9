"""Validate rendered Kubernetes objects the way an API server with KubeRay v1.7.0 would.

:func:`validate_objects` returns a list of problems (empty when all is well), each naming the
object and the field. It checks:

* core kinds against the Kubernetes OpenAPI schemas of :data:`K8S_VERSION` (``kubernetes-validate``,
  strict: an unknown field is an error, as with ``kubectl apply --validate=strict``);
* ``RayJob``/``RayCluster`` against the v1 ``openAPIV3Schema`` of the vendored KubeRay v1.7.0 CRDs
  (``crds/``), read as a structural schema: schema defaults are applied first, an unknown field is
  an error unless ``x-kubernetes-preserve-unknown-fields`` allows it, ``x-kubernetes-list-type``
  ``map``/``set`` keys must be unique, int32/int64 formats must fit, and the object's own
  ``metadata`` is checked against the core ``ObjectMeta``. CEL rules
  (``x-kubernetes-validations``) are not evaluated: a field that carries one is reported, so that
  nothing is waved through unchecked;
* KubeRay's own rules that its schema does not hold (``ray-operator/controllers/ray/utils/
  validation.go`` and the webhook at v1.7.0): :func:`kuberay_rules`;
* what the API server checks beyond the schema for the fields used here (names, label keys and
  values, port names, requests <= limits): :func:`api_server_rules`;
* references between the objects of one render: :func:`reference_problems`.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

__all__ = [
    "K8S_VERSION",
    "KUBERAY_VERSION",
    "api_server_rules",
    "crd_schema",
    "defaulted",
    "kuberay_rules",
    "pod_specs",
    "parse_quantity",
    "reference_problems",
    "validate_objects",
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

# ---- the structural schema of a CRD --------------------------------------------------------------

_PASS_KEYWORDS = {
    "type",
    "format",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "required",
    "default",
}
_K8S_KEYWORDS = {
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "nullable",
    "description",
    "title",
    "example",
}


def _structural(schema: dict, path: str = "") -> dict:
    """Turn an ``openAPIV3Schema`` node into JSON Schema with the API server's pruning semantics."""
    unknown = (
        set(schema)
        - _PASS_KEYWORDS
        - _K8S_KEYWORDS
        - {
            "properties",
            "items",
            "additionalProperties",
            "anyOf",
            "allOf",
            "oneOf",
            "not",
        }
    )
    if unknown:
        raise NotImplementedError(f"CRD schema keyword(s) {sorted(unknown)} at {path or '<root>'}")
    out = {k: v for k, v in schema.items() if k in _PASS_KEYWORDS or k.startswith("x-kubernetes-")}
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    props = schema.get("properties")
    if props is not None:
        out["properties"] = {k: _structural(v, f"{path}.{k}") for k, v in props.items()}
    if schema.get("x-kubernetes-embedded-resource"):
        out.setdefault("properties", {})
        for key in ("apiVersion", "kind"):
            out["properties"].setdefault(key, {"type": "string"})
        out["properties"].setdefault("metadata", {"type": "object"})
    if "items" in schema:
        out["items"] = _structural(schema["items"], f"{path}[]")
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_structural(s, f"{path}/{key}") for s in schema[key]]
    if "not" in schema:
        out["not"] = _structural(schema["not"], f"{path}/not")
    addl = schema.get("additionalProperties")
    if isinstance(addl, dict):
        out["additionalProperties"] = _structural(addl, f"{path}{{}}")
    elif addl is not None:
        out["additionalProperties"] = addl
    elif schema.get("type") == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
        # A structural object keeps only the fields its schema names: the API server prunes the
        # rest (or refuses them under strict field validation). We refuse them.
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str) -> dict:
    """The structural JSON Schema of ``kind``'s v1 version in the vendored KubeRay CRD."""
    crd = yaml.load((CRD_DIR / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    if not (version["served"] and version["storage"]):
        raise AssertionError(f"{kind} v1 is not the served storage version in {CRD_FILES[kind]}")
    schema = _structural(version["schema"]["openAPIV3Schema"])
    # The object's own metadata is ObjectMeta, checked by the API server itself (below).
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def _list_type(validator, list_type, instance, schema):  # noqa: ANN001 - jsonschema keyword hook
    if not isinstance(instance, list):
        return
    if list_type == "set":
        seen = [json.dumps(i, sort_keys=True) for i in instance]
        if len(set(seen)) != len(seen):
            yield jsonschema.ValidationError("x-kubernetes-list-type set: duplicate items")
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen_keys = set()
        for item in instance:
            key = tuple(json.dumps(item.get(k)) for k in keys) if isinstance(item, dict) else None
            if key in seen_keys:
                yield jsonschema.ValidationError(f"x-kubernetes-list-type map: duplicate entry for keys {keys}: {key}")
            seen_keys.add(key)


def _cel(validator, rules, instance, schema):  # noqa: ANN001
    text = "; ".join(r.get("rule", "?") for r in rules)
    yield jsonschema.ValidationError(f"field carries CEL rules that this validator does not evaluate: {text}")


_CrdValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator,
    {"x-kubernetes-list-type": _list_type, "x-kubernetes-validations": _cel},
)
_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMATS.checks("int64")
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def _apply_defaults(node: Any, schema: dict) -> None:
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                _apply_defaults(node[key], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for key, value in node.items():
                if key not in schema.get("properties", {}):
                    _apply_defaults(value, addl)
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for item in node:
            _apply_defaults(item, schema["items"])


def defaulted(obj: dict) -> dict:
    """A copy of a KubeRay object with its CRD's schema defaults applied (as the API server stores it)."""
    out = copy.deepcopy(obj)
    if obj.get("kind") in CRD_FILES:
        _apply_defaults(out, crd_schema(obj["kind"]))
    return out


@functools.cache
def _core_definitions() -> Registry:
    base = files("kubernetes_validate").joinpath("kubernetes-json-schema", f"v{K8S_VERSION}-local-strict")
    defs = json.loads(base.joinpath("_definitions.json").read_text())
    return Resource.from_contents(defs) @ Registry()


def _object_meta_problems(obj: dict) -> Iterator[str]:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    }
    validator = jsonschema.Draft202012Validator(schema, registry=_core_definitions())
    for err in validator.iter_errors(obj.get("metadata", {})):
        sub = _path(err)
        yield f"metadata{'' if sub == '<root>' else '.' + sub}: {err.message}"


def _path(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "<root>"


def _crd_problems(obj: dict) -> Iterator[str]:
    if obj.get("apiVersion") != "ray.io/v1":
        yield f"apiVersion {obj.get('apiVersion')!r}: use ray.io/v1 (the storage version)"
        return
    yield from _object_meta_problems(obj)
    validator = _CrdValidator(crd_schema(obj["kind"]), format_checker=_FORMATS)
    for err in sorted(validator.iter_errors(defaulted(obj)), key=lambda e: list(map(str, e.absolute_path))):
        yield f"{_path(err)}: {err.message}"


def _core_problems(obj: dict) -> Iterator[str]:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        yield f"{_path(err)}: {err.message}"
    except kubernetes_validate.SchemaNotFoundError as err:
        yield f"no Kubernetes {K8S_VERSION} schema: {err.message}"


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
    if spec.get("deletionStrategy") is not None:
        out.append("spec.deletionStrategy needs the RayJobDeletionPolicy feature gate (not checked here)")
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


def parse_quantity(q: str | int | float) -> Decimal:
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


def pod_specs(obj: dict) -> Iterator[tuple[str, dict]]:
    """Every pod spec inside an object (any mapping that holds a ``containers`` list), with its path."""

    def walk(node: Any, path: str) -> Iterator[tuple[str, dict]]:
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                yield path, node
            for key, value in node.items():
                yield from walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                yield from walk(item, f"{path}.{i}")

    yield from walk(obj, "")


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


# ---- references between objects ---------------------------------------------------------------------


def _ident(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def _template_labels(objs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(object, pod labels, pod spec) for the pod templates of the workloads (not operator-made pods)."""
    out = []
    for o in objs:
        if o.get("kind") in ("Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"):
            t = o["spec"]["template"]
            out.append((_ident(o), t.get("metadata", {}).get("labels", {}), t["spec"]))
    return out


def reference_problems(objs: list[dict], *, complete: bool = True) -> list[str]:
    """References between objects that must resolve within one render (one namespace).

    Secrets, ConfigMaps and ServiceAccounts named by pods, Services' selectors and named target
    ports, workload selectors, StatefulSets' governing Services, RoleBindings, and KubeRay's
    ``authOptions.secretName``. With ``complete`` (an overlay), every Secret key that is used or
    declared in the ``critbatch.io/required-keys`` annotation must hold data; without it (a base
    whose overlay fills the Secrets), a key used must at least be declared.
    """
    out: list[str] = []
    by_kind: dict[str, dict[str, dict]] = {}
    for o in objs:
        by_kind.setdefault(o.get("kind"), {})[o["metadata"]["name"]] = o

    def secret_keys(name: str) -> tuple[set[str], set[str]]:
        s = by_kind.get("Secret", {}).get(name)
        if s is None:
            return set(), set()
        provided = set(s.get("data") or {}) | set(s.get("stringData") or {})
        declared = set(
            filter(None, (s["metadata"].get("annotations") or {}).get("critbatch.io/required-keys", "").split(","))
        )
        return provided, declared

    def need_secret(where: str, name: str, key: str | None) -> None:
        if name not in by_kind.get("Secret", {}):
            out.append(f"{where}: Secret {name!r} is not in the render")
            return
        if key is None:
            return
        provided, declared = secret_keys(name)
        if key not in provided and (complete or key not in declared):
            out.append(f"{where}: Secret {name!r} has no key {key!r}")

    def need_configmap(where: str, name: str, key: str | None) -> None:
        cm = by_kind.get("ConfigMap", {}).get(name)
        if cm is None:
            out.append(f"{where}: ConfigMap {name!r} is not in the render")
        elif key is not None and key not in (cm.get("data") or {}) | (cm.get("binaryData") or {}):
            out.append(f"{where}: ConfigMap {name!r} has no key {key!r}")

    if complete:
        for name in by_kind.get("Secret", {}):
            provided, declared = secret_keys(name)
            for key in sorted(declared - provided):
                out.append(f"Secret/{name}: declared key {key!r} holds no data")

    for o in objs:
        for path, pod in pod_specs(o):
            where = f"{_ident(o)}: {path}"
            sa = pod.get("serviceAccountName")
            if sa and sa != "default" and sa not in by_kind.get("ServiceAccount", {}):
                out.append(f"{where}: ServiceAccount {sa!r} is not in the render")
            for v in pod.get("volumes") or []:
                if "secret" in v and not v["secret"].get("optional"):
                    need_secret(where, v["secret"]["secretName"], None)
                if "configMap" in v and not v["configMap"].get("optional"):
                    need_configmap(where, v["configMap"]["name"], None)
            for group in ("initContainers", "containers"):
                for c in pod.get(group) or []:
                    for e in c.get("env") or []:
                        ref = e.get("valueFrom") or {}
                        if "secretKeyRef" in ref and not ref["secretKeyRef"].get("optional"):
                            need_secret(where, ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
                        if "configMapKeyRef" in ref and not ref["configMapKeyRef"].get("optional"):
                            need_configmap(where, ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"])
                    for e in c.get("envFrom") or []:
                        if "secretRef" in e and not e["secretRef"].get("optional"):
                            need_secret(where, e["secretRef"]["name"], None)
                        if "configMapRef" in e and not e["configMapRef"].get("optional"):
                            need_configmap(where, e["configMapRef"]["name"], None)
        auth = ((o.get("spec") or {}).get("authOptions") or {}) if o.get("kind") == "RayCluster" else {}
        if auth.get("secretName"):
            need_secret(f"{_ident(o)}: spec.authOptions", auth["secretName"], "auth_token")

    templates = _template_labels(objs)
    for svc in by_kind.get("Service", {}).values():
        selector = svc["spec"].get("selector") or {}
        hits = [(who, spec) for who, labels, spec in templates if selector.items() <= labels.items()]
        if selector and not hits:
            out.append(f"Service/{svc['metadata']['name']}: selector {selector} matches no pod template")
        for port in svc["spec"].get("ports") or []:
            target = port.get("targetPort")
            if isinstance(target, str):
                for who, spec in hits:
                    names = {p.get("name") for c in spec["containers"] for p in c.get("ports") or []}
                    if target not in names:
                        out.append(f"Service/{svc['metadata']['name']}: targetPort {target!r} is no port of {who}")
    for kind in ("Deployment", "StatefulSet"):
        for o in by_kind.get(kind, {}).values():
            match = (o["spec"].get("selector") or {}).get("matchLabels") or {}
            labels = o["spec"]["template"].get("metadata", {}).get("labels", {})
            if not match or not match.items() <= labels.items():
                out.append(f"{_ident(o)}: spec.selector.matchLabels {match} does not select its template")
            if kind == "StatefulSet" and o["spec"].get("serviceName") not in by_kind.get("Service", {}):
                out.append(f"{_ident(o)}: serviceName {o['spec'].get('serviceName')!r} is not in the render")
    for rb in by_kind.get("RoleBinding", {}).values():
        ref = rb["roleRef"]
        if ref["kind"] == "Role" and ref["name"] not in by_kind.get("Role", {}):
            out.append(f"{_ident(rb)}: roleRef Role {ref['name']!r} is not in the render")
        for s in rb.get("subjects") or []:
            if s["kind"] == "ServiceAccount" and s["name"] not in by_kind.get("ServiceAccount", {}):
                out.append(f"{_ident(rb)}: subject ServiceAccount {s['name']!r} is not in the render")
    return out


# ---- all of it ----------------------------------------------------------------------------------------


def validate_objects(objs: list[dict], *, complete: bool = True, references: bool = True) -> list[str]:
    """Every problem with a set of rendered objects, each as ``"Kind/name: field: message"``.

    Args:
        objs: the objects of one render (one namespace).
        complete: the render is deployable as it is (an overlay): Secrets must hold their keys.
        references: check references between the objects (off for a lone object).
    """
    out: list[str] = []
    seen = set()
    for obj in objs:
        ident = (
            obj.get("apiVersion"),
            obj.get("kind"),
            obj.get("metadata", {}).get("namespace"),
            obj.get("metadata", {}).get("name"),
        )
        if ident in seen:
            out.append(f"{_ident(obj)}: defined twice")
        seen.add(ident)
        if obj.get("kind") in CRD_FILES:
            problems = list(_crd_problems(obj)) + kuberay_rules(defaulted(obj))
        else:
            problems = list(_core_problems(obj))
        problems += api_server_rules(obj)
        out.extend(f"{_ident(obj)}: {p}" for p in problems)
    if references:
        out.extend(reference_problems(objs, complete=complete))
    return out
