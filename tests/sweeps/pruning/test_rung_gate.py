"""The rung gate of pruning mode "pause": a worker waits at a rung until the scheduler lets it go on."""

import threading
import time

import pytest

from sweeps.pruning.rungs import rung_gate_key
from sweeps.pruning.scheduler import EqualComputeScheduler
from workloads._ray_adapter import reaches_rung, wait_for_rung_decision
from workloads.config import (
    BatchConfig,
    DataConfig,
    EvalConfig,
    OptimizerConfig,
    RungGateConfig,
    TrialConfig,
    WorkloadConfig,
)


def cfg(milestones, rungs=None) -> TrialConfig:
    return TrialConfig(trial_id="t", workload=WorkloadConfig(data=DataConfig(path="x")), budget_tokens=milestones[-1],
                       optimizer=OptimizerConfig(lr=1e-3, beta2_half_life_tokens=8192.0),
                       batch=BatchConfig(batch_size_sequences=4), eval=EvalConfig(milestones_tokens=tuple(milestones)),
                       rung_gate=RungGateConfig(barrier_tokens=tuple(rungs), key="k") if rungs is not None else None)


def test_reaches_rung_is_the_first_report_at_or_past_each_rung():
    c = cfg([1024 * (i + 1) for i in range(8)], [2048.0, 4096.0])
    assert [m for m in c.eval.milestones_tokens if reaches_rung(c, m)] == [2048, 4096]
    coarse = cfg([3000, 6000, 8192], [2048.0, 4096.0])  # one report past each rung
    assert [m for m in coarse.eval.milestones_tokens if reaches_rung(coarse, m)] == [3000, 6000]
    jump = cfg([1000, 8192], [2048.0, 4096.0])  # one report past both
    assert [m for m in jump.eval.milestones_tokens if reaches_rung(jump, m)] == [8192]
    assert not reaches_rung(cfg([2048]), 2048)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def test_worker_waits_for_the_schedulers_go_through_the_ray_kv(ray_local):
    s = EqualComputeScheduler(budget_tokens=8192, mode="pause", trials_per_group=1)
    s.gate_prefix = "critbatch-rung-gate/test"
    key = rung_gate_key(s.gate_prefix, "trial-a")
    assert wait_for_rung_decision(key, 2048.0, timeout_s=0.3) is False  # nothing decided: it would go on
    t0 = time.monotonic()
    threading.Timer(0.5, lambda: s._let_go("trial-a", 2048.0)).start()
    assert wait_for_rung_decision(key, 2048.0, timeout_s=30) is True
    assert 0.4 <= time.monotonic() - t0 < 10
    # a go for an earlier report does not release a later rung
    assert wait_for_rung_decision(key, 4096.0, timeout_s=0.3) is False
