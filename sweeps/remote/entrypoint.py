"""The command a submitted sweep's Ray job runs, and the Python that runs it on the cluster.

The entrypoint is ``python -m critbatch run spec.yaml --output ... --sweep-id ... --address auto
--no-progress``, every argument quoted by :func:`shlex.join`: the spec travels as a file in the job's
working directory (:mod:`sweeps.remote.staging`), never inside the command.
"""

from __future__ import annotations

import os
import shlex
import sys

from sweeps.spec.identity import check_sweep_id, is_loopback_address

__all__ = ["SPEC_FILE", "build_entrypoint", "default_job_python"]

#: The spec's file name in the job's working directory.
SPEC_FILE = "spec.yaml"


def default_job_python(address: str | None) -> str:
    """The Python that runs the job's entrypoint on the cluster.

    ``CRITBATCH_JOB_PYTHON`` if set; else this interpreter when the cluster is on this machine (a
    loopback address: same files, same environment); else ``python`` from the cluster's ``PATH``
    (the image's Python, with critbatch's dependencies installed).
    """
    env = os.environ.get("CRITBATCH_JOB_PYTHON")
    if env:
        return env
    return sys.executable if is_loopback_address(address) else "python"


def build_entrypoint(
    *, sweep_id: str, python: str = "python", tracking_uri: str | None = None, output_root: str = "outputs"
) -> str:
    """The job's shell command: ``critbatch run`` on the shipped ``spec.yaml``, every argument quoted.

    ``--address auto`` makes the driver join the cluster that runs the job (Ray sets
    ``RAY_ADDRESS`` for job entrypoints).

    Raises:
        InvalidInput: a bad sweep id.
    """
    check_sweep_id(sweep_id)
    args = [
        python,
        "-m",
        "critbatch",
        "run",
        SPEC_FILE,
        "--output",
        f"{output_root.rstrip('/') or '.'}/{sweep_id}",
        "--sweep-id",
        sweep_id,
        "--address",
        "auto",
        "--no-progress",
    ]
    if tracking_uri:
        args += ["--tracking-uri", tracking_uri]
    return shlex.join(args)
