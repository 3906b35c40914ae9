"""Leaving a two-rank gloo test group (``torch.multiprocessing.spawn`` children of the workload tests)."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def leave_group_and_exit() -> None:
    """Barrier, destroy the process group, flush, and end the spawned rank with ``os._exit(0)``.

    Call it last in a rank whose results are already saved. Both ranks leave together (a rank whose peer
    had gone was seen to abort); the exit skips the interpreter's teardown, where gloo's threads were
    still seen to abort a rank now and then ("terminate called without an active exception", SIGABRT: 2 of
    12 runs of ``test_sync`` before the barrier, once in a full suite after it). A rank that raised never
    gets here: ``spawn`` reports its error as before.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
