"""The private Ray APIs of ``workloads.ray.compat``: each test fails when a Ray upgrade changes one."""

from __future__ import annotations

import inspect

from workloads.ray import compat as _ray_compat


def test_internal_kv_get_takes_a_key_and_is_what_kv_get_calls():
    from ray.experimental import internal_kv

    params = list(inspect.signature(internal_kv._internal_kv_get).parameters)
    assert params[0] == "key"
    assert callable(internal_kv._internal_kv_put)  # the scheduler's side of the same store (sweeps/_compat.py)
    assert "_internal_kv_get(key)" in inspect.getsource(_ray_compat.kv_get)


def test_train_session_is_none_outside_a_session_and_the_session_has_both_report_queues():
    from ray.train._internal import session

    assert _ray_compat.train_session() is None
    # both queues are (re)made by reset(), which __init__ calls
    reset = inspect.getsource(session._TrainSession.reset)
    assert "self._inter_actor_queue" in reset and "self.result_queue" in reset
    assert hasattr(session._TrainSession, "_get_or_create_inter_actor_queue")


def test_drain_report_queue_returns_at_once_outside_a_session():
    import time

    t0 = time.monotonic()
    _ray_compat.drain_report_queue(timeout_s=5)
    assert time.monotonic() - t0 < 1


def test_train_storage_path_is_none_outside_a_worker_and_ray_train_keeps_what_it_reads():
    from ray.train.v2._internal.execution.storage import StorageContext
    from ray.train.v2.api.context import TrainContext

    assert _ray_compat.train_storage_path() is None
    assert callable(TrainContext.get_storage) and isinstance(StorageContext.experiment_fs_path, property)
