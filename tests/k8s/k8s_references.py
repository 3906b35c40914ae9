"""References between the Kubernetes objects of one render, which must resolve within it.

:func:`reference_problems` checks Secrets, ConfigMaps and ServiceAccounts named by pods, Services'
selectors and named target ports, workload selectors, StatefulSets' governing Services,
RoleBindings, and KubeRay's ``authOptions.secretName``. Used by :mod:`k8s_validate`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["ident", "pod_specs", "reference_problems"]

#: The annotation of a Secret that lists the keys an overlay must fill (comma-separated).
REQUIRED_KEYS_ANNOTATION = "critbatch.io/required-keys"


def ident(obj: dict) -> str:
    """``Kind/name`` of an object, as problems name it."""
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


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


def _template_labels(objs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(object, pod labels, pod spec) for the pod templates of the workloads (not operator-made pods)."""
    out = []
    for o in objs:
        if o.get("kind") in ("Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"):
            t = o["spec"]["template"]
            out.append((ident(o), t.get("metadata", {}).get("labels", {}), t["spec"]))
    return out


class _Render:
    """The objects of one render by kind and name, and the problems found so far (``out``)."""

    def __init__(self, objs: list[dict], complete: bool):
        self.objs = objs
        self.complete = complete
        self.out: list[str] = []
        self.by_kind: dict[str, dict[str, dict]] = {}
        for o in objs:
            self.by_kind.setdefault(o.get("kind"), {})[o["metadata"]["name"]] = o

    def named(self, kind: str) -> dict[str, dict]:
        return self.by_kind.get(kind, {})

    def secret_keys(self, name: str) -> tuple[set[str], set[str]]:
        """``(keys holding data, keys declared required)`` of Secret ``name``."""
        s = self.named("Secret").get(name)
        if s is None:
            return set(), set()
        provided = set(s.get("data") or {}) | set(s.get("stringData") or {})
        declared = set(
            filter(None, (s["metadata"].get("annotations") or {}).get(REQUIRED_KEYS_ANNOTATION, "").split(","))
        )
        return provided, declared

    def need_secret(self, where: str, name: str, key: str | None) -> None:
        if name not in self.named("Secret"):
            self.out.append(f"{where}: Secret {name!r} is not in the render")
            return
        if key is None:
            return
        provided, declared = self.secret_keys(name)
        if key not in provided and (self.complete or key not in declared):
            self.out.append(f"{where}: Secret {name!r} has no key {key!r}")

    def need_configmap(self, where: str, name: str, key: str | None) -> None:
        cm = self.named("ConfigMap").get(name)
        if cm is None:
            self.out.append(f"{where}: ConfigMap {name!r} is not in the render")
        elif key is not None and key not in (cm.get("data") or {}) | (cm.get("binaryData") or {}):
            self.out.append(f"{where}: ConfigMap {name!r} has no key {key!r}")


def _declared_keys_hold_data(r: _Render) -> None:
    for name in r.named("Secret"):
        provided, declared = r.secret_keys(name)
        for key in sorted(declared - provided):
            r.out.append(f"Secret/{name}: declared key {key!r} holds no data")


def _container_refs(r: _Render, where: str, c: dict) -> None:
    for e in c.get("env") or []:
        ref = e.get("valueFrom") or {}
        if "secretKeyRef" in ref and not ref["secretKeyRef"].get("optional"):
            r.need_secret(where, ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        if "configMapKeyRef" in ref and not ref["configMapKeyRef"].get("optional"):
            r.need_configmap(where, ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"])
    for e in c.get("envFrom") or []:
        if "secretRef" in e and not e["secretRef"].get("optional"):
            r.need_secret(where, e["secretRef"]["name"], None)
        if "configMapRef" in e and not e["configMapRef"].get("optional"):
            r.need_configmap(where, e["configMapRef"]["name"], None)


def _pod_refs(r: _Render, o: dict) -> None:
    """What the pods of ``o`` name: a ServiceAccount, volumes, env sources; KubeRay's auth Secret."""
    for path, pod in pod_specs(o):
        where = f"{ident(o)}: {path}"
        sa = pod.get("serviceAccountName")
        if sa and sa != "default" and sa not in r.named("ServiceAccount"):
            r.out.append(f"{where}: ServiceAccount {sa!r} is not in the render")
        for v in pod.get("volumes") or []:
            if "secret" in v and not v["secret"].get("optional"):
                r.need_secret(where, v["secret"]["secretName"], None)
            if "configMap" in v and not v["configMap"].get("optional"):
                r.need_configmap(where, v["configMap"]["name"], None)
        for group in ("initContainers", "containers"):
            for c in pod.get(group) or []:
                _container_refs(r, where, c)
    auth = ((o.get("spec") or {}).get("authOptions") or {}) if o.get("kind") == "RayCluster" else {}
    if auth.get("secretName"):
        r.need_secret(f"{ident(o)}: spec.authOptions", auth["secretName"], "auth_token")


def _service_refs(r: _Render) -> None:
    """Each Service's selector matches a pod template, whose ports hold its named target ports."""
    templates = _template_labels(r.objs)
    for svc in r.named("Service").values():
        selector = svc["spec"].get("selector") or {}
        hits = [(who, spec) for who, labels, spec in templates if selector.items() <= labels.items()]
        if selector and not hits:
            r.out.append(f"Service/{svc['metadata']['name']}: selector {selector} matches no pod template")
        for port in svc["spec"].get("ports") or []:
            target = port.get("targetPort")
            if isinstance(target, str):
                for who, spec in hits:
                    names = {p.get("name") for c in spec["containers"] for p in c.get("ports") or []}
                    if target not in names:
                        r.out.append(f"Service/{svc['metadata']['name']}: targetPort {target!r} is no port of {who}")


def _workload_and_binding_refs(r: _Render) -> None:
    """Workload selectors select their templates, StatefulSets' Services and RoleBindings' targets exist."""
    for kind in ("Deployment", "StatefulSet"):
        for o in r.named(kind).values():
            match = (o["spec"].get("selector") or {}).get("matchLabels") or {}
            labels = o["spec"]["template"].get("metadata", {}).get("labels", {})
            if not match or not match.items() <= labels.items():
                r.out.append(f"{ident(o)}: spec.selector.matchLabels {match} does not select its template")
            if kind == "StatefulSet" and o["spec"].get("serviceName") not in r.named("Service"):
                r.out.append(f"{ident(o)}: serviceName {o['spec'].get('serviceName')!r} is not in the render")
    for rb in r.named("RoleBinding").values():
        ref = rb["roleRef"]
        if ref["kind"] == "Role" and ref["name"] not in r.named("Role"):
            r.out.append(f"{ident(rb)}: roleRef Role {ref['name']!r} is not in the render")
        for s in rb.get("subjects") or []:
            if s["kind"] == "ServiceAccount" and s["name"] not in r.named("ServiceAccount"):
                r.out.append(f"{ident(rb)}: subject ServiceAccount {s['name']!r} is not in the render")


def reference_problems(objs: list[dict], *, complete: bool = True) -> list[str]:
    """References between objects that must resolve within one render (one namespace).

    Secrets, ConfigMaps and ServiceAccounts named by pods, Services' selectors and named target
    ports, workload selectors, StatefulSets' governing Services, RoleBindings, and KubeRay's
    ``authOptions.secretName``. With ``complete`` (an overlay), every Secret key that is used or
    declared in the ``critbatch.io/required-keys`` annotation must hold data; without it (a base
    whose overlay fills the Secrets), a key used must at least be declared.
    """
    r = _Render(objs, complete)
    if complete:
        _declared_keys_hold_data(r)
    for o in objs:
        _pod_refs(r, o)
    _service_refs(r)
    _workload_and_binding_refs(r)
    return r.out
