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
  (``x-kubernetes-validations``) are evaluated for the RayJob's ``deletionStrategy`` only
  (:data:`_CEL_RULES`): a field that carries any other is reported, so that nothing is waved
  through unchecked;
* KubeRay's own rules that its schema does not hold (``ray-operator/controllers/ray/utils/
  validation.go`` and the webhook at v1.7.0): :func:`kuberay_rules` (in ``k8s_rules``);
* what the API server checks beyond the schema for the fields used here (names, label keys and
  values, port names, requests <= limits): :func:`api_server_rules` (in ``k8s_rules``);
* references between the objects of one render: :func:`reference_problems` (in ``k8s_references``).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from k8s_references import ident as _ident
from k8s_references import pod_specs, reference_problems
from k8s_rules import (
    CRD_DIR,
    CRD_FILES,
    K8S_VERSION,
    KUBERAY_VERSION,
    api_server_rules,
    kuberay_rules,
    parse_quantity,
)
from referencing import Registry, Resource

__all__ = [
    "K8S_VERSION",
    "KUBERAY_VERSION",
    "api_server_rules",
    "crd_schema",
    "defaulted",
    "kuberay_rules",
    "parse_quantity",
    "pod_specs",
    "reference_problems",
    "validate_objects",
]

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


def _list_type(validator, list_type, instance, schema):
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


#: The CEL rules of the vendored CRDs that this validator evaluates, by their exact text (the RayJob's
#: ``deletionStrategy`` and its rules' ``condition``); any other rule is reported as not evaluated.
_CEL_RULES = {
    "!((has(self.onSuccess) || has(self.onFailure)) && has(self.deletionRules))": lambda s: (
        not (("onSuccess" in s or "onFailure" in s) and "deletionRules" in s)
    ),
    "((has(self.onSuccess) && has(self.onFailure)) || has(self.deletionRules))": lambda s: (
        ("onSuccess" in s and "onFailure" in s) or "deletionRules" in s
    ),
    "!(has(self.jobStatus) && has(self.jobDeploymentStatus))": lambda s: (
        not ("jobStatus" in s and "jobDeploymentStatus" in s)
    ),
    "has(self.jobStatus) || has(self.jobDeploymentStatus)": lambda s: "jobStatus" in s or "jobDeploymentStatus" in s,
}


def _cel(validator, rules, instance, schema):
    unknown = [r.get("rule", "?") for r in rules if r.get("rule") not in _CEL_RULES]
    if unknown:
        text = "; ".join(unknown)
        yield jsonschema.ValidationError(f"field carries CEL rules that this validator does not evaluate: {text}")
    for r in rules:
        check = _CEL_RULES.get(r.get("rule"))
        if check is not None and isinstance(instance, dict) and not check(instance):
            yield jsonschema.ValidationError(f"CEL rule failed: {r.get('message', r['rule'])}")


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
