"""Paths and cached renders shared by the Kubernetes tests."""

from __future__ import annotations

import functools
from pathlib import Path

from k8s_kustomize import build

__all__ = ["EXAMPLE_SPEC", "K8S", "ROOT", "kustomizations", "render"]

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
EXAMPLE_SPEC = ROOT / "sweeps" / "examples" / "shakespeare-char.yaml"


def kustomizations() -> list[str]:
    """Every directory under k8s/ with a kustomization.yaml (bases and overlays), relative to k8s/."""
    return sorted(str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml"))


@functools.cache
def _render(rel: str) -> tuple[dict, ...]:
    objs, _ = build(K8S / rel)
    return tuple(objs)


def render(rel: str) -> list[dict]:
    """The objects of ``k8s/<rel>`` (rendered once per session; callers get their own list)."""
    import copy

    return copy.deepcopy(list(_render(rel)))
