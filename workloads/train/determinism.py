"""Reproducible to the last digit on CPU: fixed intra-op threads and torch's deterministic algorithms.

What is already fixed elsewhere: the model's initialisation (``torch.manual_seed(cfg.seed)`` before it is
built), the data stream (a generator seeded per step from the seed, ``workloads.data.corpus``) and the RNG state in
every checkpoint. What this module adds, in every worker before the model is built: the number of intra-op
threads (CPU reductions split their work by thread, so it is part of the result; ``OMP_NUM_THREADS`` from
the environment no longer decides it) and, on CPU, ``torch.use_deterministic_algorithms(True,
warn_only=DETERMINISTIC_WARN_ONLY)``. CUDA workers keep torch's defaults (deterministic CUDA kernels need
``CUBLAS_WORKSPACE_CONFIG`` and cost speed; not asked of them here).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DETERMINISTIC_WARN_ONLY", "make_deterministic", "torch_threads_per_worker"]

#: ``torch.use_deterministic_algorithms(True, warn_only=...)`` on CPU workers: an op without a
#: deterministic implementation warns instead of failing the trial (none is known on this CPU path).
DETERMINISTIC_WARN_ONLY = True


def torch_threads_per_worker(cpus_per_worker: float) -> int:
    """The intra-op threads of a worker given ``cpus_per_worker`` CPUs: ``max(1, floor(cpus))``.

    Ray's own default for ``OMP_NUM_THREADS`` in a worker, but fixed here whatever the environment
    holds: CPU reductions split their work by thread, so the thread count is part of the result.
    Torch-free, like the rest of this module's top level (the driver reads it).
    """
    return max(1, math.floor(cpus_per_worker + 1e-9))


def make_deterministic(device: torch.device, threads: int | None) -> dict[str, Any]:
    """Fix this process's intra-op threads and, on CPU, turn on torch's deterministic algorithms.

    Args:
        device: the worker's device; deterministic algorithms are turned on for ``cpu`` only.
        threads: intra-op threads (:func:`torch_threads_per_worker`); None keeps the old rule
            (``OMP_NUM_THREADS``, else torch's current count), for callers that do not pass one.

    Returns:
        What the process now uses: ``{"torch_num_threads", "omp_num_threads" (the environment's, or
        None), "deterministic_algorithms", "deterministic_warn_only"}``.
    """
    import torch

    if threads is None:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    torch.set_num_threads(int(threads))
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=DETERMINISTIC_WARN_ONLY)
    return {
        "torch_num_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
    }
