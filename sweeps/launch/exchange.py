"""The trial exchange: a sweep's queue of trials between Tune's relay trainables and its trial runners.

One Ray actor per sweep (:class:`TrialExchange`, named by :func:`exchange_name`), created by
:class:`sweeps.launch.runners.TrialRunners`; Tune's relay trainables (:func:`relay`) submit and poll
tickets, the runners' rank 0 (``workloads.ray.runner``) takes them and reports. The exchange is plain
Python: its rules are unit-tested without Ray (``tests/sweeps/run/test_runners.py``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sweeps.errors import CritbatchError

if TYPE_CHECKING:
    from workloads.api import TrialConfig, TrialRunContext

__all__ = [
    "HEARTBEAT_S",
    "RELAY_POLL_S",
    "STALE_AFTER_S",
    "TrialExchange",
    "TrialRunnerError",
    "exchange_name",
    "relay",
]

#: a trial whose relay has not polled nor beaten for this long fails (its Tune trial process is gone or hung)
STALE_AFTER_S = 120.0
#: seconds between a relay's two polls of its trial
RELAY_POLL_S = 0.05
#: seconds between two heartbeats of a relay (sent also while ``ray.tune.report`` blocks)
HEARTBEAT_S = 5.0


def exchange_name(sweep_id: str) -> str:
    """The Ray actor name of a sweep's trial exchange."""
    return f"critbatch-trial-exchange-{sweep_id}"


class TrialRunnerError(CritbatchError, RuntimeError):
    """A trial ended with an error in its trial runner (the text is the worker's traceback or the reason)."""


def relay(exchange: str, cfg: TrialConfig, context: TrialRunContext) -> None:
    """The body of Tune's relay trainable: hand the trial to the runners, forward its reports, return at its end.

    Runs in Tune's trial process and imports no torch. Each report goes to ``ray.tune.report`` in the
    order the runner sent it (replays of a restored trial included, as a one-trial worker group sends
    them).

    Args:
        exchange: the sweep's :class:`TrialExchange` actor name (in this job's namespace).
        cfg: the trial.
        context: how it runs; its ``checkpoint_dir`` is the trial's own checkpoint folder on the sweep's storage.

    Raises:
        TrialRunnerError: the trial failed (past its ``max_failures``), or its runner failed. A trial
            cancelled at the exchange (Tune paused or ended it, or the sweep ended) returns quietly.
    """
    import ray
    import ray.tune

    from workloads.api import loop_config

    if context.checkpoint_dir is None:
        raise ValueError(f"trial {cfg.trial_id}: a trial runner's trial needs its checkpoint_dir (TrialRunContext)")
    trial_id = cfg.trial_id
    handle = ray.get_actor(exchange)
    ticket = ray.get(handle.submit.remote(trial_id, loop_config(cfg, context)))
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
