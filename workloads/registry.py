"""The workloads the sweep can run, by name: the only surface ``sweeps`` uses."""

from __future__ import annotations

from typing import Callable

__all__ = ["WORKLOADS", "get_entry"]

#: workload name -> "module:function" of its entry, ``fn(cfg, *, device, report, resume_state, save_dir)``.
WORKLOADS: dict[str, str] = {
    "pretrain": "workloads.pretrain:run_pretrain",
    "finetune": "workloads.finetune:run_finetune",
}


def get_entry(name: str) -> Callable:
    """The entry function of workload ``name``.

    Raises:
        KeyError: unknown workload.
    """
    import importlib

    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}")
    mod, fn = WORKLOADS[name].split(":")
    return getattr(importlib.import_module(mod), fn)
