"""Render a kustomization: with the kustomize binary when there is one, else with a small Python copy.

:func:`build` runs ``kubectl kustomize DIR`` (or ``kustomize build DIR``) when either is on the
PATH, and otherwise :func:`build_python`, a faithful implementation of the subset of kustomize that
``k8s/`` uses, and only that subset: anything else in a ``kustomization.yaml`` raises
:class:`Unsupported` rather than being ignored. When the binary exists, the tests also check that
both give the same objects in the same order, so the Python copy cannot drift from kustomize.

The subset (kustomize v5 semantics):

* ``resources``: YAML files and directories holding a ``kustomization.yaml``;
* ``secretGenerator`` with ``envs``/``literals``, ``behavior`` ``create``/``replace``/``merge``,
  and name-suffix hashing disabled (``generatorOptions`` or per-generator ``options``);
* ``patches``: inline JSON 6902 patches (``op`` lists) with a ``target`` of kind/name/group/version;
* ``namespace``: set on every namespaced object, and on ``ServiceAccount`` subjects of
  ``RoleBinding``/``ClusterRoleBinding`` that name a ServiceAccount of the build;
* ``labels`` with ``pairs`` (no selectors, no templates): added to ``metadata.labels``;
* ``images``: ``newName``/``newTag``/``digest`` for every ``containers``/``initContainers`` image;
* output in kustomize's default ("legacy") order.
"""

from __future__ import annotations

import base64
import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Unsupported", "build", "build_python", "build_with_binary", "kustomize_command"]


class Unsupported(ValueError):
    """The kustomization uses a feature that :func:`build_python` does not implement."""


_KNOWN_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "patches",
    "secretGenerator",
    "generatorOptions",
}

# kustomize's legacy sort order (api/resid/gvk.go: orderFirst / orderLast)
_ORDER_FIRST = [
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
]
_ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]

_CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "PodSecurityPolicy",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "APIService",
    "IngressClass",
    "RuntimeClass",
    "CSIDriver",
    "CSINode",
    "VolumeAttachment",
    "Node",
}


def kustomize_command() -> list[str] | None:
    """The command that renders a kustomization on this machine, or None if there is none."""
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


def build_with_binary(path: Path, command: list[str]) -> list[dict]:
    """Render ``path`` with the kustomize binary; raise on failure with its stderr."""
    proc = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} {path} failed:\n{proc.stderr}")
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for o in objs:  # kustomize wraps a long Secret value's base64 at 76 columns; the API server skips the newlines
        if o.get("kind") == "Secret" and o.get("data"):
            o["data"] = {key: "".join(value.split()) for key, value in o["data"].items()}
    return objs


def build(path: Path) -> tuple[list[dict], str]:
    """Render ``path``; return the objects and what rendered them (the command, or "python")."""
    command = kustomize_command()
    if command:
        return build_with_binary(path, command), " ".join(command)
    return build_python(path), "python"


# ---- the Python implementation --------------------------------------------------------------------


def build_python(path: Path) -> list[dict]:
    """Render the kustomization in directory ``path`` (the subset in the module docstring)."""
    return _sort(_build(Path(path)))


def _load_kustomization(path: Path) -> dict:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        f = path / name
        if f.is_file():
            k = yaml.safe_load(f.read_text()) or {}
            break
    else:
        raise FileNotFoundError(f"no kustomization file in {path}")
    if k.get("kind", "Kustomization") != "Kustomization":
        raise Unsupported(f"{path}: kind {k.get('kind')!r}")
    unknown = set(k) - _KNOWN_KEYS
    if unknown:
        raise Unsupported(f"{path}: fields not implemented: {sorted(unknown)}")
    return k


def _build(path: Path) -> list[dict]:
    k = _load_kustomization(path)
    objs: list[dict] = []
    for r in k.get("resources", []):
        p = path / r
        if p.is_dir():
            objs.extend(_build(p))
        elif p.is_file():
            objs.extend(d for d in yaml.safe_load_all(p.read_text()) if d)
        else:
            raise Unsupported(f"{path}: resource {r!r} is neither a file nor a directory (remote?)")
    objs = [copy.deepcopy(o) for o in objs]
    _generate_secrets(path, k, objs)
    for patch in k.get("patches", []):
        _apply_patch(path, patch, objs)
    if "namespace" in k:
        _set_namespace(objs, k["namespace"])
    for entry in k.get("labels", []):
        _add_labels(path, entry, objs)
    for image in k.get("images", []):
        _set_images(objs, image)
    return objs


def _read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise Unsupported(f"{path}: env line without '=': {line!r}")
        key, value = line.split("=", 1)
        out[key.strip()] = value
    return out


def _generate_secrets(path: Path, k: dict, objs: list[dict]) -> None:
    global_opts = k.get("generatorOptions", {})
    for gen in k.get("secretGenerator", []):
        allowed = {"name", "behavior", "envs", "literals", "options", "type"}
        if set(gen) - allowed:
            raise Unsupported(f"{path}: secretGenerator fields {sorted(set(gen) - allowed)}")
        opts = {**global_opts, **gen.get("options", {})}
        if set(opts) - {"disableNameSuffixHash"} or not opts.get("disableNameSuffixHash"):
            raise Unsupported(f"{path}: secretGenerator needs disableNameSuffixHash: true (and no other options)")
        data: dict[str, str] = {}
        for env in gen.get("envs", []):
            data.update(_read_env(path / env))
        for lit in gen.get("literals", []):
            key, value = lit.split("=", 1)
            data[key] = value
        encoded = {key: base64.b64encode(v.encode()).decode() for key, v in data.items()}
        behavior = gen.get("behavior", "create")
        existing = [o for o in objs if o.get("kind") == "Secret" and o["metadata"]["name"] == gen["name"]]
        if behavior == "create":
            if existing:
                raise Unsupported(f"{path}: secret {gen['name']} already exists (use behavior replace/merge)")
            objs.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": gen["name"]},
                    "type": gen.get("type", "Opaque"),
                    "data": encoded,
                }
            )
        elif behavior in ("replace", "merge"):
            if len(existing) != 1:
                raise ValueError(f"{path}: secret {gen['name']} to {behavior}: found {len(existing)}")
            secret = existing[0]
            if behavior == "replace":
                secret.pop("stringData", None)
                secret["data"] = encoded
            else:
                if secret.get("stringData"):
                    raise Unsupported(f"{path}: merge into a Secret with stringData")
                secret["data"] = {**secret.get("data", {}), **encoded}
            secret.setdefault("type", gen.get("type", "Opaque"))
        else:
            raise Unsupported(f"{path}: secretGenerator behavior {behavior!r}")


def _matches(obj: dict, target: dict) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    checks = {
        "kind": obj.get("kind"),
        "name": obj["metadata"].get("name"),
        "group": group,
        "version": version,
        "namespace": obj["metadata"].get("namespace"),
    }
    if set(target) - set(checks):
        raise Unsupported(f"patch target fields {sorted(set(target) - set(checks))}")
    return all(checks[key] == value for key, value in target.items())


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc, parts[-1]


def _json6902(doc: dict, ops: list[dict]) -> None:
    for op in ops:
        parent, key = _parent(doc, _pointer(op["path"]))
        kind = op["op"]
        if kind in ("add", "replace"):
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                if key == "-":
                    parent.append(value)
                elif kind == "add":
                    parent.insert(int(key), value)
                else:
                    parent[int(key)] = value
            else:
                if kind == "replace" and key not in parent:
                    raise KeyError(f"replace: no {op['path']}")
                parent[key] = value
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(key)]
            else:
                del parent[key]
        else:
            raise Unsupported(f"JSON 6902 op {kind!r}")


def _apply_patch(path: Path, patch: dict, objs: list[dict]) -> None:
    if set(patch) - {"target", "patch", "path"} or "target" not in patch:
        raise Unsupported(f"{path}: patches need a target and an inline or file JSON 6902 patch")
    text = patch["patch"] if "patch" in patch else (path / patch["path"]).read_text()
    ops = yaml.safe_load(text)
    if not isinstance(ops, list):
        raise Unsupported(f"{path}: strategic-merge patches are not implemented (use JSON 6902)")
    hits = [o for o in objs if _matches(o, patch["target"])]
    if not hits:
        raise ValueError(f"{path}: patch target {patch['target']} matches nothing")
    for o in hits:
        _json6902(o, ops)


def _set_namespace(objs: list[dict], namespace: str) -> None:
    service_accounts = {
        (o["metadata"]["name"], o["metadata"].get("namespace", "default"))
        for o in objs
        if o.get("kind") == "ServiceAccount"
    }
    for o in objs:
        if o.get("kind") in _CLUSTER_SCOPED:
            continue
        o["metadata"]["namespace"] = namespace
    for o in objs:
        if o.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for subject in o.get("subjects", []):
            if subject.get("kind") != "ServiceAccount":
                continue
            if (subject["name"], subject.get("namespace", "default")) in service_accounts:
                subject["namespace"] = namespace


def _add_labels(path: Path, entry: dict, objs: list[dict]) -> None:
    if set(entry) - {"pairs", "includeSelectors", "includeTemplates"}:
        raise Unsupported(f"{path}: labels fields {sorted(set(entry) - {'pairs'})}")
    if entry.get("includeSelectors") or entry.get("includeTemplates"):
        raise Unsupported(f"{path}: labels with includeSelectors/includeTemplates")
    for o in objs:
        o["metadata"].setdefault("labels", {}).update(entry["pairs"])


def _split_image(image: str) -> tuple[str, str]:
    """Split ``name[:tag][@digest]`` into (name, the rest including its separator)."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _new_image(image: str, rule: dict) -> str:
    name, rest = _split_image(image)
    if name != rule["name"]:
        return image
    if "digest" in rule:
        rest = "@" + rule["digest"]
    elif "newTag" in rule:
        rest = ":" + str(rule["newTag"])
    return rule.get("newName", name) + rest


def _set_images(objs: list[dict], rule: dict) -> None:
    if set(rule) - {"name", "newName", "newTag", "digest"}:
        raise Unsupported(f"images fields {sorted(set(rule) - {'name', 'newName', 'newTag', 'digest'})}")

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for c in value:
                        if isinstance(c, dict) and isinstance(c.get("image"), str):
                            c["image"] = _new_image(c["image"], rule)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for o in objs:
        walk(o)


def _gvk_string(obj: dict) -> str:
    group, _, version = obj["apiVersion"].rpartition("/")
    return f"{group or '~G'}_{version or '~V'}_{obj.get('kind') or '~K'}"


def _sort(objs: list[dict]) -> list[dict]:
    def key(o: dict) -> tuple:
        kind = o.get("kind", "")
        if kind in _ORDER_FIRST:
            rank = (0, _ORDER_FIRST.index(kind), "")
        elif kind in _ORDER_LAST:
            rank = (2, _ORDER_LAST.index(kind), "")
        else:
            rank = (1, 0, _gvk_string(o))
        meta = o.get("metadata", {})
        return (*rank, meta.get("namespace", ""), meta.get("name", ""))

    return sorted(objs, key=key)
