"""Reproducible to the last digit on CPU: fixed intra-op threads and torch's deterministic algorithms.

What is already fixed elsewhere: the model's initialisation (``torch.manual_seed(cfg.seed)`` before it is
built), the data stream (a generator seeded per step from the seed, ``workloads.data``) and the RNG state in
every checkpoint. What this module adds, in every worker before the model is built: the number of intra-op
threads (CPU reductions split their work by thread, so it is part of the result; ``OMP_NUM_THREADS`` from
the environment no longer decides it) and, on CPU, ``torch.use_deterministic_algorithms(True,
warn_only=DETERMINISTIC_WARN_ONLY)``. CUDA workers keep torch's defaults (deterministic CUDA kernels need
``CUBLAS_WORKSPACE_CONFIG`` and cost speed; not asked of them here).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from workloads.config import DETERMINISTIC_WARN_ONLY

__all__ = ["make_deterministic"]


def make_deterministic(device: torch.device, threads: int | None) -> dict[str, Any]:
    """Fix this process's intra-op threads and, on CPU, turn on torch's deterministic algorithms.

    Args:
        device: the worker's device; deterministic algorithms are turned on for ``cpu`` only.
        threads: intra-op threads (``workloads.config.torch_threads_per_worker``); None keeps the old rule
            (``OMP_NUM_THREADS``, else torch's current count), for callers that do not pass one.

    Returns:
        What the process now uses: ``{"torch_num_threads", "omp_num_threads" (the environment's, or
        None), "deterministic_algorithms", "deterministic_warn_only"}``.
    """
    if threads is None:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    torch.set_num_threads(int(threads))
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=DETERMINISTIC_WARN_ONLY)
    return {"torch_num_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}
