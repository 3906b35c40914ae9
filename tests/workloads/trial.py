"""Tiny trial configs for the workload tests: a base config with some sections changed."""

from __future__ import annotations

from typing import Any

from workloads.config import TrialConfig, WorkloadConfig, replace  # replace: also for the pydantic sections

__all__ = ["with_sections"]


def with_sections(base: TrialConfig, **changes: Any) -> TrialConfig:
    """``base`` with top-level fields replaced; a dict value updates that section's fields.

    ``model``, ``data``, ``finetune`` and ``name`` go to ``base.workload`` (``finetune=None`` drops it).
    Example: ``with_sections(c, optimizer={"lr": 50.0}, model={"context_length_tokens": 96})``.
    """
    wl_changes = {k: changes.pop(k) for k in ("model", "data", "finetune", "name") if k in changes}
    if wl_changes:
        wl = base.workload
        kw = {
            k: replace(getattr(wl, k), **v) if isinstance(v, dict) and getattr(wl, k) is not None else v
            for k, v in wl_changes.items()
        }
        # WorkloadConfig validates at construction: build it whole, not field by field
        changes["workload"] = WorkloadConfig(
            **{**{f: getattr(wl, f) for f in ("name", "model", "data", "finetune")}, **kw}
        )
    out = {k: replace(getattr(base, k), **v) if isinstance(v, dict) else v for k, v in changes.items()}
    return replace(base, **out)
