"""Every private Ray API the worker side uses, in one place, each with why (Ray 2.60).

``tests/workloads/ray/test_ray_compat.py`` fails when a Ray upgrade removes or renames one of them;
fix it here, nowhere else.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["drain_report_queue", "kv_get", "train_session", "train_storage_path"]


def kv_get(key: str) -> bytes | None:
    """The value under ``key`` in the Ray cluster's internal key-value store, or None.

    Why private: the rung gate of pruning mode ``pause`` needs a cluster-wide flag the scheduler
    (in the driver) writes and every Train worker polls, without an actor to host it (an actor
    would hold resources and outlive a crashed driver). Ray's only store for that is
    ``ray.experimental.internal_kv`` (``_internal_kv_get``), which the scheduler writes with
    ``_internal_kv_put``.
    """
    from ray.experimental.internal_kv import _internal_kv_get

    return _internal_kv_get(key)


def train_session() -> Any:
    """The Ray Train/Tune session of this process (``ray.train._internal.session.get_session()``), or None.

    Why private: :func:`drain_report_queue` must see the session's report queues, which no public
    API exposes.
    """
    from ray.train._internal.session import get_session

    return get_session()


def train_storage_path() -> str | None:
    """Where Ray Train copies this worker group's checkpoints (its run's folder on the storage: a path,
    or a path in a bucket), or None outside a Ray Train worker.

    Why private: ``TrainContext.get_storage()`` is a DeveloperAPI returning Ray Train's internal
    ``StorageContext`` (its ``experiment_fs_path``); only the error of a failed checkpoint upload names it.
    """
    try:
        import ray.train

        storage = ray.train.get_context().get_storage()
        return None if storage is None else str(storage.experiment_fs_path)
    except Exception:  # noqa: BLE001 - not in a worker, or Ray changed it: the error goes without the path
        return None


def drain_report_queue(timeout_s: float = 300.0) -> None:
    """Wait until Tune has taken every metrics item that ``TuneReportCallback`` forwarded.

    Called by the Tune trainable after ``TorchTrainer.fit()``. The Train controller's last report
    can still sit in the Tune session's inter-actor queue (``_inter_actor_queue``) when ``fit()``
    returns; if the trainable function ends first, Ray 2.60's function-trainable session can block
    forever putting that item on its own ``result_queue`` (seen with restored trials under load).
    Returning only once both are empty, and quiet for half a second (the main thread moves an item
    from one to the other), keeps the consumer alive for it. Returns at once outside a session.
    """
    session = train_session()
    if session is None:
        return
    q = getattr(session, "_inter_actor_queue", None)
    if q is None:
        return

    def drained() -> bool:
        try:
            return q.empty() and session.result_queue.empty()
        except Exception:  # noqa: BLE001 - the queue actor is gone: nothing left to drain
            return True

    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        if drained():
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 0.5:
                return
        else:
            quiet_since = None
        time.sleep(0.05)
