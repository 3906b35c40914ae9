"""Live progress of a sweep: trials done/running/failed, best loss so far per batch size, ETA."""

from __future__ import annotations

import math
import time
from typing import Any

from ray.tune import Callback
from ray.tune.experiment.trial import Trial
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sweeps.spec.statuses import TrialStatus
from workloads.api import TrialOutcome

__all__ = ["ProgressCallback", "wave_line"]

PLAIN_CHANGE_S = 10.0  # output that is not a terminal: a changed state at most this often,
PLAIN_HEARTBEAT_S = 60.0  # and a line at least this often

#: the table's count of each trial status (a pruned trial counts as done; a stopped one is not counted)
_COLUMN = {
    TrialStatus.RUNNING: "running",
    TrialStatus.PAUSED: "paused",
    TrialStatus.COMPLETED: "done",
    TrialStatus.PRUNED: "done",
    TrialStatus.DIVERGED: "diverged",
    TrialStatus.FAILED: "failed",
}


class ProgressCallback(Callback):
    """A Tune callback that renders a rich table, refreshed on every trial event.

    The ETA is the mean wall time of finished trials times the trials left, divided by the
    concurrency (before any trial finished: unknown).
    """

    def __init__(
        self,
        n_trials: int,
        batch_sizes: list[int],
        concurrency: int,
        console: Console | None = None,
        enabled: bool = True,
    ):
        self.n_trials = n_trials
        self.batch_sizes = batch_sizes
        self.concurrency = max(1, concurrency)
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.started: dict[str, float] = {}
        self.durations: list[float] = []
        self.status: dict[str, str] = {}  # trial id -> its column of the table (_COLUMN)
        self.best: dict[int, float] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self.t0 = time.monotonic()
        self._live: Live | None = None
        self._last_plain = -math.inf
        self._last_counts: tuple = ()
        self._last_best: tuple = ()

    def __getstate__(self):  # Tune pickles its run config; consoles are not picklable
        d = self.__dict__.copy()
        d["console"] = None
        d["_live"] = None
        d["enabled"] = False
        return d

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = dict.fromkeys(("done", "running", "paused", "failed", "diverged"), 0)
        for s in self.status.values():
            if s in c:
                c[s] += 1
        return c

    def eta_s(self) -> float | None:
        c = self.counts()
        left = self.n_trials - c["done"] - c["failed"] - c["diverged"]
        if not self.durations:
            return None
        return max(0.0, left * (sum(self.durations) / len(self.durations)) / self.concurrency)

    def _eta_text(self) -> str:
        eta = self.eta_s()
        return "?" if eta is None else f"{int(eta // 60)}m{int(eta % 60):02d}s"

    def render(self) -> Group:
        c = self.counts()
        eta_txt = self._eta_text()
        paused = f", {c['paused']} paused" if c.get("paused") else ""
        head = Text(
            f"trials {c['done']}/{self.n_trials} done, {c['running']} running{paused}, {c['failed']} failed, "
            f"{c['diverged']} diverged   elapsed {int(time.monotonic() - self.t0)}s   ETA {eta_txt}"
        )
        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("batch (seq)", justify="right")
        table.add_column("best val loss", justify="right")
        table.add_column("running", justify="right")
        for b in self.batch_sizes:
            running = sum(
                1
                for tid, s in self.status.items()
                if s == _COLUMN[TrialStatus.RUNNING] and self.latest.get(tid, {}).get("B") == b
            )
            best = self.best.get(b)
            table.add_row(str(b), "-" if best is None else f"{best:.4f}", str(running) if running else "")
        return Group(head, table)

    def _refresh(self) -> None:
        if not self.enabled:
            return
        if self.console.is_terminal:
            if self._live is None:
                self._live = Live(self.render(), console=self.console, refresh_per_second=2, transient=False)
                self._live.start()
            else:
                self._live.update(self.render())
        else:
            counts, best = tuple(self.counts().items()), tuple(sorted(self.best.items()))
            now = time.monotonic()
            since = now - self._last_plain
            # A file or pipe gets a line when the counts or the best losses changed, at most every
            # PLAIN_CHANGE_S, and otherwise every PLAIN_HEARTBEAT_S: never wrapped.
            changed = counts != self._last_counts or best != self._last_best
            if not (changed and since >= PLAIN_CHANGE_S or since >= PLAIN_HEARTBEAT_S):
                return
            self._last_plain, self._last_counts, self._last_best = now, counts, best
            self.console.print(self.plain_line(), highlight=False, soft_wrap=True, markup=False)

    def plain_line(self) -> str:
        """The progress in one line, for output that is not a terminal.

        Example: ``[progress] 3/14 done, 2 running, 0 failed, 0 diverged; elapsed 95s, ETA 4m10s;
        best val loss so far: B=4: 2.512, B=8: 2.498`` (once a trial has reported; the best at any milestone
        of any trial, running ones too, so early on a batch size shows its first milestone's loss).
        """
        c = self.counts()
        paused = f", {c['paused']} paused" if c.get("paused") else ""
        best = ", ".join(f"B={b}: {self.best[b]:.3f}" for b in sorted(self.best))  # trials still running too
        return (
            f"[progress] {c['done']}/{self.n_trials} done, {c['running']} running{paused}, {c['failed']} failed, "
            f"{c['diverged']} diverged; elapsed {int(time.monotonic() - self.t0)}s, ETA {self._eta_text()}"
            + (f"; best val loss so far: {best}" if best else "")
        )

    def replay(self, records: list) -> None:
        """Count the trials a resumed sweep had already ended (``TrialRecord`` s), and their best losses.

        A FAILED trial is left out: ``Tuner.restore(resume_errored=True)`` runs it again.
        """
        for r in records:
            if r.status in (TrialStatus.COMPLETED, TrialStatus.PRUNED, TrialStatus.DIVERGED):
                self.status[r.trial_id] = _COLUMN[TrialStatus(r.status)]
            finite = [v for v in r.val_loss if math.isfinite(v)]
            if finite:
                self.best[r.batch_size_sequences] = min(self.best.get(r.batch_size_sequences, math.inf), min(finite))

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = time.monotonic()
        self.status[trial.trial_id] = _COLUMN[TrialStatus.RUNNING]
        self.latest[trial.trial_id] = {"B": trial.config.get("batch_size_sequences")}
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if trial.status == Trial.PAUSED:  # Tune's status: waits at a rung for its batch size (pruning.mode: pause)
            self.status[trial.trial_id] = _COLUMN[TrialStatus.PAUSED]
        b = trial.config.get("batch_size_sequences")
        v = result.get("val_loss")
        if b is not None and isinstance(v, (int, float)) and math.isfinite(v):
            self.best[b] = min(self.best.get(b, math.inf), float(v))
        self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        ended = TrialStatus.DIVERGED if last.get("status") == TrialOutcome.DIVERGED else TrialStatus.COMPLETED
        self.status[trial.trial_id] = _COLUMN[ended]
        self.durations.append(time.monotonic() - self.started.get(trial.trial_id, time.monotonic()))
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        self.status[trial.trial_id] = _COLUMN[TrialStatus.FAILED]
        self.durations.append(time.monotonic() - self.started.get(trial.trial_id, time.monotonic()))
        self._refresh()

    def wave(
        self, wave: dict[str, Any], outcome: dict[str, Any] | None, requested_ratio: float, planned_trials: int
    ) -> None:
        """``search.precision``: say what the wave that just ended measured and what the sweep does next, and
        count the trials it added (``wave``: an entry of ``cbs.json``'s ``precision.waves``)."""
        self.n_trials = planned_trials
        if not self.enabled:
            return
        self.console.print(wave_line(wave, outcome, requested_ratio), highlight=False, soft_wrap=True, markup=False)

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()
            self._live = None
        elif self.enabled:  # the final state, unless the last line already showed it
            if (tuple(self.counts().items()), tuple(sorted(self.best.items()))) != (self._last_counts, self._last_best):
                self._last_plain = -math.inf
                self._refresh()


def wave_line(wave: dict[str, Any], outcome: dict[str, Any] | None, requested_ratio: float) -> str:
    """One ``search.precision`` wave in a line, e.g. ``[precision] after 14 trials: b_crit 12.9 [1.5, 75.6]
    (upper/lower 50, asked <= 3), status edge: adding 2 trial(s): B=32 at LR 0.0042, B=16 at LR 0.0061``."""
    ci = wave.get("b_crit_ci")
    b = wave.get("b_crit")
    found = (
        f"b_crit {b:.3g} [{ci[0]:.3g}, {'inf' if ci[1] is None else f'{ci[1]:.3g}'}]"
        if b is not None and ci and ci[0] is not None
        else "no b_crit yet"
    )
    ratio = wave.get("ratio")
    head = (
        f"[precision] after {wave.get('trials')} trials: {found} (upper/lower "
        f"{'unbounded' if ratio is None else f'{ratio:.3g}'}, asked <= {requested_ratio:g}), status {wave.get('status')}"
        + (f", {wave['lr_brackets_open']} open LR bracket(s)" if wave.get("lr_brackets_open") else "")
    )
    if outcome is not None:
        why = {
            "met": "precise enough, no more trials",
            "max_trials": "search.precision.max_trials reached",
            "nothing_to_add": "no trial left to add",
            "no_trial_completed": "no trial completed, no more trials",
        }.get(outcome["stopped_because"], outcome["stopped_because"])
        return f"{head}: {why}"
    added = ", ".join(
        f"B={a['batch_size_sequences']}"
        + (f" at LR {a['lr']:.3g}" if a.get("lr") else " (new batch size)" if a.get("lr") is None else "")
        + (f" with {a['budget_multiple']}x the tokens" if (a.get("budget_multiple") or 1) > 1 else "")
        for a in wave.get("added", [])
    )
    # the trials the wave handed out (seeds and a new batch size's groups included); a wave recorded before
    # ``trials_added`` existed has only its proposals, one group each
    n = wave.get("trials_added", len(wave.get("added", [])))
    return f"{head}: adding {n} trial(s): {added}"
