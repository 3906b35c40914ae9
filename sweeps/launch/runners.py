"""Trial runners: long-lived Ray Train worker groups that run a sweep's trials one after another.

Why: a trial run as its own ``TorchTrainer`` starts five or more fresh processes (Tune's trainable,
Train's controller, its workers, ...), three of them importing torch, before its first step: about
12 s a trial on the 2-core machine (docs/benchmarks.md, "Per-trial start-up"). Here the driver starts
one Ray Train run per concurrent trial slot at the sweep's start (:class:`TrialRunners`, each in a
:class:`RunnerHost` actor, with the real
``ScalingConfig`` and ``FailureConfig``), each running ``workloads.ray.runner.runner_fn_per_worker``;
Tune's trainable becomes a relay that imports no torch (:func:`sweeps.launch.trainable.make_trainable`):
it hands its trial to the sweep's :class:`TrialExchange`, forwards the reports that come back to
``tune.report`` and returns when its trial ends. Tune, Optuna, the MLflow callback and the records see
what they saw with one worker group per trial.

Used by every sweep whose launcher is ``trial_runners`` (:class:`sweeps.launch.launcher.TrialRunnersLauncher`, the
default; ``CRITBATCH_TRIAL_RUNNERS=0`` goes back to one Ray Train run per trial). A trial that Tune pauses or stops (pruning, a budget, a signal) is
cancelled at the exchange by :class:`RunnerCancels`, which frees its runner at the trial's next report
(at once while it waits at a rung). Everything is owned by the driver: a driver that dies takes the
exchange and every runner with it, and a resumed sweep starts new ones (each trial continues from the
checkpoint in its own folder, ``workloads.ray.runner.latest_checkpoint``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ray.tune import Callback
from ray.tune.experiment.trial import Trial

from sweeps.launch.exchange import TrialExchange, exchange_name

__all__ = [
    "RunnerCancels",
    "RunnerHost",
    "RunnerPool",
    "TrialRunners",
    "active_pool",
    "runner_shape",
    "shared_runners",
]

log = logging.getLogger(__name__)

#: times a runner whose Ray Train run ended with an error is started again before its slot is given up
RUNNER_REPLACEMENTS = 3
#: worker-group restarts one runner's Ray Train run allows (each trial also has its own budget)
RUNNER_MAX_FAILURES = 50


class RunnerCancels(Callback):
    """The Tune callback that cancels, at the exchange, every trial that stopped running in Tune (paused or
    pruned by the scheduler, stopped by a budget, errored): its runner drops it at its next report, or at
    once while it waits at a rung, and takes the next trial.

    Tune has no hook for a pause, so after each step of its loop the trials that were running and are
    no longer are cancelled by trial id. A paused trial that Tune starts again submits a new ticket
    (its relay runs again), which this never cancels: that happens steps later.

    Args:
        exchange: the sweep's :class:`TrialExchange` actor name.
    """

    def __init__(self, exchange: str) -> None:
        self.exchange = exchange
        self._running: set[str] = set()
        self._handle: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"exchange": self.exchange, "_running": set(), "_handle": None}

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        running = {t.trial_id for t in trials if t.status == Trial.RUNNING}  # Tune's trial status
        gone = sorted(self._running - running)
        self._running = running
        if gone:
            import ray

            if self._handle is None:
                self._handle = ray.get_actor(self.exchange)
            self._handle.cancel_trials.remote(gone)


class RunnerHost:
    """A Ray actor (no CPU) that owns one runner slot's Ray Train run: ``TorchTrainer.fit()`` runs in it, so
    the run's controller and workers are its children, and killing it ends them all at once.

    A run that ends with an error fails its trial in flight (the exchange's ``runner_lost``) and is started
    again, up to :data:`RUNNER_REPLACEMENTS` times; then the slot tells the exchange it is gone
    (``runner_gone``). Not a thread of the driver: a driver whose threads still wait inside Ray when it
    exits (a force-quit while a trial is held) was seen to crash with SIGSEGV.
    """

    def warm(self) -> None:
        """Import what :meth:`run` needs (Ray Train's torch trainer, the runner's worker loop: about 3 s on
        the 2-core machine), ahead of it: the driver calls it while it still sets up MLflow."""
        from sweeps.launch.trainable import trial_torch_trainer
        from workloads.api import runner_fn_per_worker  # noqa: F401 - imported for its cost

        trial_torch_trainer()

    def run(
        self,
        *,
        exchange: str,
        namespace: str,
        runner_id: str,
        run_name: str,
        storage_path: str,
        resources: dict[str, Any],
    ) -> str:
        """Run the slot until the exchange shuts its runners down; returns how it ended."""
        import ray

        handle = ray.get_actor(exchange, namespace=namespace)
        for generation in range(RUNNER_REPLACEMENTS + 1):
            try:
                _trainer(exchange, namespace, runner_id, f"{run_name}-{generation}", storage_path, resources).fit()
                return "done"
            except Exception as exc:  # noqa: BLE001 - a runner's end is reported to the exchange, never raised
                log.warning("trial runner %s failed (%s: %s); starting it again", runner_id, type(exc).__name__, exc)
                try:
                    ray.get(handle.runner_lost.remote(runner_id, f"{type(exc).__name__}: {exc}"))
                except Exception:  # noqa: BLE001 - the exchange is gone: the sweep is over
                    return "exchange gone"
        why = f"runner {runner_id} failed {RUNNER_REPLACEMENTS + 1} times"
        log.warning("%s: its slot stays empty", why)
        try:
            ray.get(handle.runner_gone.remote(runner_id, why))
        except Exception:  # noqa: BLE001 - the exchange is gone: the sweep is over
            pass
        return "gone"


def _trainer(
    exchange: str, namespace: str, runner_id: str, run_name: str, storage_path: str, resources: dict[str, Any]
):
    """One runner slot's Ray Train run (``TrialTorchTrainer`` running ``runner_fn_per_worker``)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from sweeps.launch.trainable import trial_torch_trainer
    from workloads.api import runner_fn_per_worker

    use_gpu = resources["gpus_per_worker"] > 0
    per_worker = {"CPU": resources["cpus_per_worker"], **({"GPU": resources["gpus_per_worker"]} if use_gpu else {})}
    return trial_torch_trainer()(
        runner_fn_per_worker,
        train_loop_config={"exchange": exchange, "namespace": namespace, "runner_id": runner_id},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=resources["workers_per_trial"], use_gpu=use_gpu, resources_per_worker=per_worker
        ),
        run_config=RunConfig(
            name=run_name, storage_path=storage_path, failure_config=FailureConfig(max_failures=RUNNER_MAX_FAILURES)
        ),
    )


class TrialRunners:
    """The driver side of a sweep's trial runners: the exchange actor and one :class:`RunnerHost` per slot.

    Args:
        sweep_id: names the exchange actor (:func:`exchange_name`).
        count: runners to start (the sweep's concurrency).
        storage_path: Ray Train's storage for the runners' own run folders (the sweep's ``ROOT/train``).
        spec: the sweep (its ``resources`` size each worker group).
    """

    def __init__(self, spec: Any, *, sweep_id: str, count: int, storage_path: str) -> None:
        self.spec = spec
        self.sweep_id = sweep_id
        self.count = int(count)
        self.storage_path = storage_path
        self.name = exchange_name(sweep_id)
        self.exchange: Any = None
        self._abandoned: Any = None
        self._hosts: list[Any] = []
        self._runs: list[Any] = []

    def prepare(self) -> TrialRunners:
        """Create the exchange and one :class:`RunnerHost` per slot, and let the hosts import what they
        need (:meth:`RunnerHost.warm`); nothing runs and no file is written until :meth:`start`."""
        import ray

        if self.exchange is not None:
            return self
        namespace = ray.get_runtime_context().namespace
        try:  # one left by a force-quit sweep of the same id in this process (it dies with the job otherwise)
            ray.kill(ray.get_actor(self.name, namespace=namespace))
        except ValueError:
            pass
        self.exchange = (
            ray.remote(TrialExchange)
            .options(name=self.name, namespace=namespace, num_cpus=0, max_concurrency=1)
            .remote(self.spec.resources.max_failures)
        )
        host_cls = ray.remote(num_cpus=0, max_restarts=0)(RunnerHost)
        self._hosts = [host_cls.remote() for _ in range(self.count)]
        for host in self._hosts:
            host.warm.remote()
        return self

    def start(self) -> TrialRunners:
        """Start every runner's Ray Train run (:meth:`prepare` first if it was not called); they take trials
        as soon as their workers are up. Runners already started (a :class:`RunnerPool`'s) are left as they are."""
        import ray

        self.prepare()
        if self._runs:
            return self
        ray.get(self.exchange.set_runners.remote(self.count))  # up before any relay looks for it
        namespace = ray.get_runtime_context().namespace
        r = self.spec.resources
        resources = {
            "workers_per_trial": r.workers_per_trial,
            "cpus_per_worker": r.cpus_per_worker,
            "gpus_per_worker": r.gpus_per_worker,
        }
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self._runs = [
            host.run.remote(
                exchange=self.name,
                namespace=namespace,
                runner_id=f"runner-{i}",
                run_name=f"runner-{stamp}-{i}",
                storage_path=self.storage_path,
                resources=resources,
            )
            for i, host in enumerate(self._hosts)
        ]
        return self

    def stop(self, timeout_s: float = 30.0, *, forced: bool = False) -> bool:
        """Close the exchange (runners leave their loops at their next ask or report), wait up to ``timeout_s``
        for their runs to end, then kill every host (ending a run still busy: its controller and workers
        are the host's children) and the exchange.

        ``forced`` (a force-quit): kill the hosts at once and leave the exchange to die with the driver's job,
        so that the relays of the trials Tune abandoned do not fail on a dead exchange (each such failure was
        printed as an unhandled error).

        Returns whether every runner's run had ended by itself (its worker group released).
        """
        import ray

        if self.exchange is None:
            return True
        hosts, self._hosts, runs, self._runs = self._hosts, [], self._runs, []
        exchange, self.exchange = self.exchange, None
        if forced:
            self._abandoned = exchange  # a handle kept: the actor would die with its last reference
            for handle in hosts:
                try:
                    ray.kill(handle)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            return False
        try:
            ray.get(exchange.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the exchange is already gone
            pass
        ended = True
        if runs:
            try:
                done, pending = ray.wait(runs, num_returns=len(runs), timeout=timeout_s)
                ended = not pending
            except Exception:  # noqa: BLE001 - a host died: nothing left to wait for
                ended = False
        for handle in [*hosts, exchange]:
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 - already gone
                pass
        return ended


def runner_shape(spec: Any, count: int) -> tuple:
    """What makes two sweeps' trial runners interchangeable: the worker group's shape, the retry budget the
    exchange applies, and the number of runners. A runner builds everything else from each trial's config."""
    r = spec.resources
    return (r.workers_per_trial, r.cpus_per_worker, r.gpus_per_worker, r.max_failures, int(count))


class RunnerPool:
    """Trial runners kept from one sweep to the next in this driver: the arms of a comparison
    (``sweeps.run.compare``) run in the same runners while their :func:`runner_shape` stays the same, so
    only the first arm of a shape pays the runners' start.

    It keeps one shape at a time: an arm of another shape stops the kept runners before its own start
    (idle runners would hold the CPUs or GPUs that the next shape needs). The kept runners' own Ray Train
    run folders stay in the first arm's ``ROOT/train``; each trial's checkpoints are in its own folder
    whatever runner trains it. Use it through :func:`shared_runners`.
    """

    def __init__(self, pool_id: str) -> None:
        self.pool_id = pool_id
        self._runners: TrialRunners | None = None
        self._shape: tuple | None = None
        self._made = 0

    def runners_for(self, spec: Any, *, count: int, storage_path: str) -> TrialRunners:
        """The kept runners when ``spec`` and ``count`` have their shape, else new ones (not yet started;
        the kept ones of another shape are stopped first)."""
        shape = runner_shape(spec, count)
        if self._runners is not None and shape == self._shape:
            return self._runners
        self.close()
        self._made += 1
        self._runners = TrialRunners(
            spec, sweep_id=f"{self.pool_id}.runners-{self._made}", count=count, storage_path=storage_path
        )
        self._shape = shape
        return self._runners

    def close(self, *, forced: bool = False) -> None:
        """Stop the kept runners (at once when ``forced``: see :meth:`TrialRunners.stop`)."""
        runners, self._runners, self._shape = self._runners, None, None
        if runners is not None:
            runners.stop(forced=forced)


_POOL: ContextVar[RunnerPool | None] = ContextVar("critbatch_runner_pool", default=None)


def active_pool() -> RunnerPool | None:
    """The :class:`RunnerPool` of the enclosing :func:`shared_runners` block, or None (each sweep then
    starts and stops its own runners)."""
    return _POOL.get()


@contextmanager
def shared_runners(pool_id: str) -> Iterator[RunnerPool]:
    """Within the block, sweeps run by this driver share their trial runners (:class:`RunnerPool`);
    they are stopped when the block ends (at once on a force-quit's ``KeyboardInterrupt``)."""
    pool = RunnerPool(pool_id)
    token = _POOL.set(pool)
    forced = False
    try:
        yield pool
    except KeyboardInterrupt:
        forced = True
        raise
    finally:
        _POOL.reset(token)
        pool.close(forced=forced)
