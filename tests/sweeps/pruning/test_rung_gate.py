"""The rung gate of pruning mode "pause": a worker waits at a rung until the scheduler lets it go on."""

import threading
import time

import pytest

from sweeps.pruning.rungs import rung_gate_key
from sweeps.pruning.scheduler import EqualComputeScheduler
from workloads.config import (
    BatchConfig,
    DataConfig,
    EvalConfig,
    OptimizerConfig,
    RungGateConfig,
    TrialConfig,
    WorkloadConfig,
)
from workloads.ray.adapter import reaches_rung, wait_for_rung_decision


def cfg(milestones, rungs=None) -> TrialConfig:
    return TrialConfig(
        trial_id="t",
        workload=WorkloadConfig(data=DataConfig(path="x")),
        budget_tokens=milestones[-1],
        optimizer=OptimizerConfig(lr=1e-3, beta2_half_life_tokens=8192.0),
        batch=BatchConfig(batch_size_sequences=4),
        eval=EvalConfig(milestones_tokens=tuple(milestones)),
        rung_gate=RungGateConfig(barrier_tokens=tuple(rungs), key="k") if rungs is not None else None,
    )


def gated(c: TrialConfig, reports: list[float]) -> list[float]:
    """The reports (tokens seen, in order) after which the worker waits at a rung."""
    return [t for prev, t in zip([0.0, *reports], reports) if reaches_rung(c, t, prev)]


def test_reaches_rung_is_the_first_report_at_or_past_each_rung():
    c = cfg([1024 * (i + 1) for i in range(8)], [2048.0, 4096.0])
    assert gated(c, list(c.eval.milestones_tokens)) == [2048, 4096]
    coarse = cfg([3000, 6000, 8192], [2048.0, 4096.0])  # one report past each rung
    assert gated(coarse, [3000, 6000, 8192]) == [3000, 6000]
    jump = cfg([1000, 8192], [2048.0, 4096.0])  # one report past both
    assert gated(jump, [1000, 8192]) == [8192]
    assert not reaches_rung(cfg([2048]), 2048, 0.0)


def test_the_gate_holds_a_trial_wherever_the_scheduler_pauses_it_reports_off_their_milestones():
    """A report is made at the tokens seen, not at its milestone. Milestones 1000/2000/3000 with
    steps of 600 tokens give reports at 1200, 2400 and 3000: the scheduler pauses the trial at 2400 (the
    rung at 1500 lies between 1200 and 2400). The gate judged on the milestones (1500 <= 2000, the last
    one below 2400) let the worker train on past its rung. Whenever the scheduler pauses a trial, its
    worker must be waiting (it may wait where the scheduler lets it go at once: a rung before the first
    report, which nothing brackets). Likewise with steps of 1200 tokens that pass two milestones of 500."""
    from sweeps.pruning.halving import SuccessiveHalving

    every_500 = [500 * (i + 1) for i in range(6)]
    for milestones, reports in (
        ([1000, 2000, 3000], [1200.0, 2400.0, 3000.0]),
        ([1000, 2000, 3000], [700.0, 1400.0, 2100.0, 2800.0, 3500.0]),
        (every_500, [1200.0, 2400.0, 3600.0]),
    ):  # steps of 1200 pass two milestones each
        c = cfg(milestones, [750.0, 1500.0])
        s = SuccessiveHalving(budget_tokens=3000, mode="pause", trials_per_group=2)
        s.add_member("b", 4)
        paused = []
        for t in reports:
            if s.report("a", 4, flops=6.0 * t, tokens=t, loss=5.0 - t / 1000) == "pause":
                paused.append(t)
                s.end("b")  # the peer ends: the rung is decided and the trial promoted
        assert paused, reports
        assert set(paused) <= set(gated(c, reports)), (reports, paused, gated(c, reports))
    assert gated(cfg([1000, 2000, 3000], [750.0, 1500.0]), [1200.0, 2400.0, 3000.0]) == [1200.0, 2400.0]


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
