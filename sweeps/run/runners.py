"""Trial runners: long-lived Ray Train worker groups that run a sweep's trials one after another.

Why: a trial run as its own ``TorchTrainer`` starts five or more fresh processes (Tune's trainable,
Train's controller, its workers, ...), three of them importing torch, before its first step: about
12 s a trial on the 2-core machine (docs/benchmarks.md, "Per-trial start-up"). Here the driver starts
one Ray Train run per concurrent trial slot at the sweep's start (:class:`TrialRunners`, each in a
:class:`RunnerHost` actor, with the real
``ScalingConfig`` and ``FailureConfig``), each running ``workloads._ray_runner.runner_fn_per_worker``;
Tune's trainable becomes a relay that imports no torch (:func:`sweeps.run.trainable.make_trainable`):
it hands its trial to the sweep's :class:`TrialExchange`, forwards the reports that come back to
``tune.report`` and returns when its trial ends. Tune, Optuna, the MLflow callback and the records see
what they saw with one worker group per trial.

Used by every sweep (:func:`sweeps.run.trainable.use_trial_runners`; ``CRITBATCH_TRIAL_RUNNERS=0`` goes
back to one Ray Train run per trial). A trial that Tune pauses or stops (pruning, a budget, a signal) is
cancelled at the exchange by :class:`RunnerCancels`, which frees its runner at the trial's next report
(at once while it waits at a rung). Everything is owned by the driver: a driver that dies takes the
exchange and every runner with it, and a resumed sweep starts new ones (each trial continues from the
checkpoint in its own folder, ``workloads._ray_runner.latest_checkpoint``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback

__all__ = ["TrialExchange", "TrialRunners", "RunnerCancels", "RunnerHost", "TrialRunnerError", "exchange_name", "relay", "RELAY_POLL_S", "STALE_AFTER_S"]

log = logging.getLogger(__name__)

#: seconds between a relay's two polls of its trial
RELAY_POLL_S = 0.05
#: a trial whose relay has not polled nor beaten for this long fails (its Tune trial process is gone or hung)
STALE_AFTER_S = 120.0
#: seconds between two heartbeats of a relay (sent also while ``ray.tune.report`` blocks)
HEARTBEAT_S = 5.0
#: times a runner whose Ray Train run ended with an error is started again before its slot is given up
RUNNER_REPLACEMENTS = 3
#: worker-group restarts one runner's Ray Train run allows (each trial also has its own budget)
RUNNER_MAX_FAILURES = 50


def exchange_name(sweep_id: str) -> str:
    """The Ray actor name of a sweep's trial exchange."""
    return f"critbatch-trial-exchange-{sweep_id}"


class TrialRunnerError(RuntimeError):
    """A trial ended with an error in its trial runner (the text is the worker's traceback or the reason)."""


def relay(exchange: str, trial_id: str, loop_config: dict[str, Any], *, checkpoint_dir: str) -> None:
    """The body of Tune's relay trainable: hand the trial to the runners, forward its reports, return at its end.

    Runs in Tune's trial process and imports no torch. Each report goes to ``ray.tune.report`` in the
    order the runner sent it (replays of a restored trial included, as a one-trial worker group sends
    them).

    Args:
        exchange: the sweep's :class:`TrialExchange` actor name (in this job's namespace).
        loop_config: what ``workloads._ray_adapter.train_fn_per_worker`` would take.
        checkpoint_dir: the trial's own checkpoint folder on the sweep's storage.

    Raises:
        TrialRunnerError: the trial failed (past its ``max_failures``), or its runner failed. A trial
            cancelled at the exchange (Tune paused or ended it, or the sweep ended) returns quietly.
    """
    import ray
    import ray.tune

    from workloads.api import CHECKPOINT_DIR_KEY

    handle = ray.get_actor(exchange)
    ticket = ray.get(handle.submit.remote(trial_id, {**loop_config, CHECKPOINT_DIR_KEY: checkpoint_dir}))
    cursor, ended = 0, False
    # ray.tune.report blocks until Tune's loop takes the result, however long that loop is busy: a heartbeat
    # of its own keeps the exchange from taking this relay for gone meanwhile
    beating = threading.Event()

    def heartbeat() -> None:
        while not beating.wait(HEARTBEAT_S):
            try:
                handle.heartbeat.remote(ticket)
            except Exception:  # noqa: BLE001 - the exchange is gone with the sweep
                return

    threading.Thread(target=heartbeat, name=f"relay-heartbeat-{trial_id}", daemon=True).start()
    try:
        while True:
            rows, state, error = ray.get(handle.poll.remote(ticket, cursor))
            for row in rows:
                ray.tune.report(row)
            cursor += len(rows)
            if state == "done":
                ended = True
                return
            if state == "cancelled":  # Tune paused or ended the trial, or the sweep ended: nothing to say
                ended = True
                return
            if state == "failed":
                ended = True
                raise TrialRunnerError(f"trial {trial_id} failed in its trial runner: {error}")
            time.sleep(RELAY_POLL_S)
    finally:
        beating.set()
        if not ended:  # Tune ended the trial (stop, interrupt): free its runner at its next report
            try:
                handle.cancel.remote(ticket)
            except Exception:  # noqa: BLE001 - the exchange is gone with the sweep
                pass


@dataclass
class _Ticket:
    trial_id: str
    config: dict[str, Any]
    state: str = "queued"  # queued | running | done | failed | cancelled
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    runner: str | None = None
    failures: int = 0
    polled: float = field(default_factory=time.monotonic)


class TrialExchange:
    """The sweep's queue of trials between Tune's relays and the runners (a Ray actor, one per sweep).

    A relay ``submit``\\ s its trial and gets a ticket, then ``poll``\\ s the ticket for reports and
    its end. A runner's rank 0 ``take``\\ s the next queued ticket, sends each report with ``report``
    (whose answer says whether to go on), and ends it with ``finish`` or hands it back with ``failed``.

    Failures count per trial, as Ray Train's ``FailureConfig(max_failures)`` counted them for a
    one-trial worker group: a runner that asks again while its trial is still in flight (its worker
    group was restarted, or the trial raised) gets that trial back once more, until the trial has
    failed ``max_failures + 1`` times; then the trial ends with its last error.
    """

    def __init__(self, max_failures: int, stale_after_s: float = STALE_AFTER_S) -> None:
        self._max_failures = int(max_failures)
        self._stale_after_s = float(stale_after_s)
        self._tickets: dict[int, _Ticket] = {}
        self._queue: deque[int] = deque()
        self._running: dict[str, int] = {}  # runner id -> ticket in flight
        self._next = 0
        self._closed = False
        self._runners: int | None = None  # runner slots still alive (None: not said yet)
        self._no_runner_error: str | None = None

    def submit(self, trial_id: str, config: dict[str, Any]) -> int:
        """Queue a trial; returns its ticket. An earlier ticket of the same trial (a restarted relay) is cancelled."""
        for t in self._tickets.values():
            if t.trial_id == trial_id and t.state in ("queued", "running"):
                t.state = "cancelled"
        self._next += 1
        t = self._tickets[self._next] = _Ticket(trial_id, dict(config))
        self._queue.append(self._next)
        if self._closed:
            t.state = "cancelled"
        elif self._no_runner_error is not None:
            t.state, t.error = "failed", self._no_runner_error
        return self._next

    def set_runners(self, count: int) -> None:
        """How many runner slots the sweep started (each says :meth:`runner_gone` when it gives up)."""
        self._runners = int(count)

    def runner_gone(self, runner_id: str, error: str) -> None:
        """A runner slot gave up (its Ray Train run failed every time it was started). When none is left,
        every open trial and every later one fails with ``error``, instead of waiting forever."""
        self.runner_lost(runner_id, error)
        if self._runners is not None:
            self._runners -= 1
            if self._runners <= 0:
                self._no_runner_error = f"no trial runner is left (the last failed with: {error})"
                for t in self._tickets.values():
                    if t.state in ("queued", "running"):
                        t.state, t.error = "failed", self._no_runner_error

    def heartbeat(self, ticket: int) -> None:
        """The relay of this ticket is alive (it may be blocked handing a report to Tune)."""
        t = self._tickets.get(ticket)
        if t is not None:
            t.polled = time.monotonic()

    def take(self, runner_id: str) -> Any:
        """The runner's next trial as ``(ticket, config)``; None if none is queued; ``"shutdown"`` once closed."""
        if self._closed:
            return "shutdown"
        self._expire()
        tk = self._running.pop(runner_id, None)
        if tk is not None:  # asked again with a trial in flight: its worker group restarted or it raised
            t = self._tickets[tk]
            if t.state == "running":
                t.failures += 1
                if t.failures > self._max_failures:
                    t.state = "failed"
                    t.error = t.error or f"the trial's worker group failed {t.failures} times"
                else:
                    self._running[runner_id] = tk
                    return tk, t.config
        while self._queue:
            tk = self._queue.popleft()
            t = self._tickets[tk]
            if t.state != "queued":
                continue
            t.state, t.runner = "running", runner_id
            self._running[runner_id] = tk
            return tk, t.config
        return None

    def report(self, ticket: int, row: dict[str, Any]) -> bool:
        """Add one report of a running trial; returns whether the trial should go on."""
        t = self._tickets.get(ticket)
        if t is None or t.state != "running":
            return False
        t.rows.append(row)
        return not self._closed

    def finish(self, ticket: int) -> None:
        """The trial's workload returned: its relay returns after forwarding its reports."""
        t = self._tickets.get(ticket)
        if t is not None and t.state == "running":
            t.state = "done"
        self._release(ticket)

    def failed(self, runner_id: str, ticket: int, error: str) -> None:
        """The trial raised in the runner; the runner's next ``take`` retries it or ends it."""
        t = self._tickets.get(ticket)
        if t is not None:
            t.error = error

    def runner_lost(self, runner_id: str, error: str) -> None:
        """The runner's Ray Train run ended with an error: its trial in flight ends with it."""
        tk = self._running.pop(runner_id, None)
        if tk is not None and self._tickets[tk].state == "running":
            t = self._tickets[tk]
            t.state, t.error = "failed", f"its trial runner failed: {error}"

    def poll(self, ticket: int, cursor: int) -> tuple[list[dict[str, Any]], str, str | None]:
        """``(reports after cursor, state, error)`` of a ticket; the relay's heartbeat."""
        t = self._tickets.get(ticket)
        if t is None:
            return [], "cancelled", "unknown ticket"
        t.polled = time.monotonic()
        rows = t.rows[cursor:]
        if t.state not in ("queued", "running") and not rows:
            t.rows = []  # ended and every row forwarded: nothing more to keep
        return rows, t.state, t.error

    def alive(self, ticket: int) -> bool:
        """Whether a running trial should go on (a runner waiting at a rung asks)."""
        t = self._tickets.get(ticket)
        return t is not None and t.state == "running" and not self._closed

    def cancel_trials(self, trial_ids: list[str]) -> int:
        """Cancel the open tickets of these trials (Tune paused or ended them); returns how many."""
        ids, n = set(trial_ids), 0
        for tk, t in self._tickets.items():
            if t.trial_id in ids and t.state in ("queued", "running"):
                t.state = "cancelled"
                self._release(tk)
                n += 1
        return n

    def cancel(self, ticket: int) -> None:
        """The relay's trial ended in Tune: drop it (a runner stops it at its next report)."""
        t = self._tickets.get(ticket)
        if t is not None and t.state in ("queued", "running"):
            t.state = "cancelled"
        self._release(ticket)

    def close(self) -> None:
        """The sweep is over: every runner's next ``take`` is ``"shutdown"``, every open trial cancelled."""
        self._closed = True
        for t in self._tickets.values():
            if t.state in ("queued", "running"):
                t.state = "cancelled"

    def counts(self) -> dict[str, int]:
        """Tickets by state (for tests and logs)."""
        out: dict[str, int] = {}
        for t in self._tickets.values():
            out[t.state] = out.get(t.state, 0) + 1
        return out

    def _release(self, ticket: int) -> None:
        for runner, tk in list(self._running.items()):
            if tk == ticket and self._tickets[tk].state != "running":
                del self._running[runner]

    def _expire(self) -> None:
        now = time.monotonic()
        for t in self._tickets.values():
            if t.state in ("queued", "running") and now - t.polled > self._stale_after_s:
                t.state, t.error = "failed", f"its relay sent no heartbeat for {self._stale_after_s:g} s"


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
        running = {t.trial_id for t in trials if t.status == "RUNNING"}
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

    def run(self, *, exchange: str, namespace: str, runner_id: str, run_name: str, storage_path: str,
            resources: dict[str, Any]) -> str:
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


def _trainer(exchange: str, namespace: str, runner_id: str, run_name: str, storage_path: str,
             resources: dict[str, Any]):
    """One runner slot's Ray Train run (``TrialTorchTrainer`` running ``runner_fn_per_worker``)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from sweeps.run.trainable import trial_torch_trainer
    from workloads.api import runner_fn_per_worker

    use_gpu = resources["gpus_per_worker"] > 0
    per_worker = {"CPU": resources["cpus_per_worker"], **({"GPU": resources["gpus_per_worker"]} if use_gpu else {})}
    return trial_torch_trainer()(
        runner_fn_per_worker,
        train_loop_config={"exchange": exchange, "namespace": namespace, "runner_id": runner_id},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=resources["workers_per_trial"], use_gpu=use_gpu,
                                     resources_per_worker=per_worker),
        run_config=RunConfig(name=run_name, storage_path=storage_path,
                             failure_config=FailureConfig(max_failures=RUNNER_MAX_FAILURES)),
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
        self._hosts: list[Any] = []
        self._runs: list[Any] = []

    def start(self) -> "TrialRunners":
        """Create the exchange and start every runner (they take trials as soon as their workers are up)."""
        import ray

        namespace = ray.get_runtime_context().namespace
        self.exchange = ray.remote(TrialExchange).options(name=self.name, namespace=namespace, num_cpus=0,
                                                          max_concurrency=1).remote(self.spec.resources.max_failures)
        ray.get(self.exchange.set_runners.remote(self.count))  # up before any relay looks for it
        r = self.spec.resources
        resources = {"workers_per_trial": r.workers_per_trial, "cpus_per_worker": r.cpus_per_worker,
                     "gpus_per_worker": r.gpus_per_worker}
        stamp = time.strftime("%Y%m%d-%H%M%S")
        host_cls = ray.remote(num_cpus=0, max_restarts=0)(RunnerHost)
        for i in range(self.count):
            host = host_cls.remote()
            self._hosts.append(host)
            self._runs.append(host.run.remote(exchange=self.name, namespace=namespace, runner_id=f"runner-{i}",
                                              run_name=f"runner-{stamp}-{i}", storage_path=self.storage_path,
                                              resources=resources))
        return self

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Close the exchange (runners leave their loops at their next ask or report), wait up to ``timeout_s``
        for their runs to end, then kill every host (ending a run still busy: its controller and workers
        are the host's children) and the exchange.

        Returns whether every runner's run had ended by itself (its worker group released).
        """
        import ray

        if self.exchange is None:
            return True
        try:
            ray.get(self.exchange.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the exchange is already gone
            pass
        ended = True
        if self._runs:
            try:
                done, pending = ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout_s)
                ended = not pending
            except Exception:  # noqa: BLE001 - a host died: nothing left to wait for
                ended = False
        for handle in [*self._hosts, self.exchange]:
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 - already gone
                pass
        return ended
