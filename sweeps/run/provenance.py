"""What a sweep's numbers were computed with: ``cbs.json``'s ``provenance`` and the MLflow parent run's
``critbatch.provenance.*`` tags (:func:`sweeps.tracking.schema.provenance_tags`).

Package versions come from the driver's environment (``importlib.metadata``; the workers of a cluster run
the same image). The worker settings are the ones every Ray Train worker applies before it builds its
model (``workloads.train.determinism.make_deterministic``): intra-op threads from ``resources.cpus_per_worker``
and, on CPU, torch's deterministic algorithms; each trial's first report echoes what its worker set
(``torch_num_threads`` and ``deterministic_algorithms``, metrics of its MLflow run).
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

from sweeps.spec import SweepSpec
from workloads.api import DETERMINISTIC_WARN_ONLY, torch_threads_per_worker

__all__ = ["PROVENANCE_PACKAGES", "sweep_provenance"]

#: the distributions whose versions are recorded (pip names)
PROVENANCE_PACKAGES = ("torch", "ray", "transformers", "optuna", "mlflow")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def sweep_provenance(spec: SweepSpec) -> dict[str, Any]:
    """``{"python", "platform", "packages": {name: version or None}, "driver": {"omp_num_threads",
    "torch_num_threads"}, "worker": {"device", "torch_num_threads", "deterministic_algorithms",
    "deterministic_warn_only"}}``: plain JSON values; thread counts are ints, ``omp_num_threads`` the
    driver's environment value (a string) or None.

    The same on every run of a spec on one machine and installation, so it takes part in the
    ``cbs.json`` comparison of two runs (tests/sweeps/run/test_sweep_integration.py).
    """
    import torch

    cpu = spec.resources.gpus_per_worker <= 0
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PROVENANCE_PACKAGES},
        "driver": {"omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch_num_threads": torch.get_num_threads()},
        "worker": {
            "device": "cpu" if cpu else "cuda",
            "torch_num_threads": torch_threads_per_worker(spec.resources.cpus_per_worker),
            "deterministic_algorithms": cpu,
            "deterministic_warn_only": DETERMINISTIC_WARN_ONLY if cpu else None,
        },
    }
