"""The :class:`Tracker` seam: the events a sweep emits to where it is recorded (MLflow, or any other sink), and
:class:`CompositeTracker`, which fans them out to several sinks.

The driver (``sweeps.run``) talks only to this interface; a sink's own client, queue and ids stay inside its
class (the MLflow one: :class:`sweeps.tracking.writer.MlflowTracker`). Sinks are named in
:mod:`sweeps.tracking.registry`. Importing this module imports neither MLflow nor Ray.

Order of events in one sweep::

    start_parent() | attach_parent(ids) | find_sweep() + attach_parent(ids)     # once
    trial_started / trial_restored -> trial_result* -> trial_paused? -> trial_ended   # per trial
    flush()                                                                     # often, between events
    prune_children(keep), settle_children(statuses)                             # at the end
    finish(status, summary, artifacts) -> complete                              # once, last
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

__all__ = ["CompositeTracker", "Tracker"]

log = logging.getLogger(__name__)


class Tracker(ABC):
    """Where a sweep's events are recorded: the sweep itself (the parent record) and one record per trial.

    Trial ids are Tune's trial ids; statuses are :mod:`sweeps.tracking.schema`'s (``COMPLETED``, ``DIVERGED``,
    ``FAILED``, ``PRUNED``, ``STOPPED`` for a trial; ``SUCCEEDED``, ``FAILED``, ``STOPPED`` for the sweep).
    Writes may be buffered: a sink that cannot reach its backend keeps the writes and retries them at
    :meth:`flush` and :meth:`finish`; :meth:`finish`'s result is what ``sweep.json`` records as
    ``mlflow_complete``.
    """

    #: the id of the sweep's experiment (MLflow's; ``sweep.json``'s ``experiment_id``), None until it is known
    experiment_id: str | None = None
    #: the id of the sweep's parent record (MLflow's run id; ``sweep.json``'s ``parent_run_id``), None until known
    parent_run_id: str | None = None

    # ---- the sweep ------------------------------------------------------------------------------------

    @abstractmethod
    def start_parent(self) -> str | None:
        """Record a new sweep (its spec as parameters); the parent record's id, or None.

        Raises: whatever the sink raises: a sweep does not start without its parent record.
        """

    @abstractmethod
    def attach_parent(self, experiment_id: str, parent_run_id: str) -> None:
        """Re-attach to a sweep started before (a resume), by the ids ``sweep.json`` recorded; its trials
        already recorded are known again (:meth:`knows_trial`)."""

    def find_sweep(self) -> tuple[str, str] | None:
        """``(experiment id, parent run id)`` of a sweep already recorded under this sweep id (a retried job
        on shared storage), or None when the sink holds none."""
        return None

    def discard(self) -> None:
        """Remove what :meth:`start_parent` recorded: the sweep did not start. Never raises."""

    # ---- per trial ------------------------------------------------------------------------------------

    @abstractmethod
    def trial_started(self, trial_id: str, config: dict[str, Any], extra_params: dict[str, Any]) -> None:
        """A trial starts (or resumes): ``config`` is its Tune config, ``extra_params`` the further parameters
        to record (FLOPs per token, the batch plan, the training settings)."""

    def knows_trial(self, trial_id: str) -> bool:
        """Whether the trial has a record already (started in this run, or found by :meth:`attach_parent`)."""
        return False

    def trial_restored(self, trial_id: str, config: dict[str, Any], extra_params: dict[str, Any]) -> None:
        """Tune restored a trial from its state: started unless it has a record already."""
        if not self.knows_trial(trial_id):
            self.trial_started(trial_id, config, extra_params)

    @abstractmethod
    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """A trial's report (a Tune result: its metrics at ``tokens_seen`` tokens)."""

    def trial_paused(self, trial_id: str) -> None:
        """The trial waits at a rung (``pruning.mode: pause``); it may be resumed."""

    @abstractmethod
    def trial_ended(self, trial_id: str, status: str, error: str | None = None) -> None:
        """The trial ended with ``status`` (``error``: the failure's text, for a FAILED or STOPPED trial)."""

    def log_trial_tag(self, trial_id: str, key: str, value: str) -> None:
        """Record one ``key: value`` label on a trial (the pruning scheduler's decisions)."""

    def trial_run_ids(self) -> dict[str, str]:
        """``{trial id: the trial's record id}`` for the records created so far (``cbs.json``'s
        ``mlflow.child_runs``)."""
        return {}

    # ---- the end of the sweep -------------------------------------------------------------------------

    def prune_children(self, keep: set[str]) -> None:
        """Remove the records of trials not in ``keep`` (trials lost with a killed driver)."""

    def settle_children(self, statuses: dict[str, str]) -> None:
        """Make each trial's record say how it ended by the sweep's records (``{trial id: status}``)."""

    @abstractmethod
    def finish(
        self,
        status: str,
        summary: dict[str, float],
        artifacts_dir: str | None,
        message: str = "",
        drain_s: float | None = None,
        analysis: dict[str, Any] | None = None,
    ) -> bool:
        """End the sweep: ``summary``'s metrics, the files in ``artifacts_dir``, ``analysis`` (``cbs.json``'s
        content), ``message`` (why it did not succeed) and ``status`` (SUCCEEDED, FAILED or STOPPED); every
        trial still open ends STOPPED (FAILED when the sweep failed).

        Args:
            drain_s: how long to retry buffered writes, in seconds (default: the sink's).
        Returns: True when every write was delivered (``sweep.json``'s ``mlflow_complete``).
        """

    def flush(self) -> None:
        """Try the buffered writes now (called between Tune steps)."""

    def pending_writes(self) -> list[str]:
        """What the buffered writes are (one line each), in order: ``sweep.json``'s ``mlflow_incomplete_writes``."""
        return []


class CompositeTracker(Tracker):
    """Several sinks as one :class:`Tracker`: every event goes to each, in order.

    The first sink is the primary: its ids are the sweep's (:attr:`experiment_id`, :attr:`parent_run_id`,
    :meth:`find_sweep`, :meth:`trial_run_ids`); the sweep is complete when every sink is.

    Args:
        trackers: the sinks, the primary first.
    Raises:
        ValueError: ``trackers`` is empty.
    """

    def __init__(self, trackers: Sequence[Tracker]):
        if not trackers:
            raise ValueError("a CompositeTracker needs at least one tracker")
        self.trackers = tuple(trackers)

    @property
    def primary(self) -> Tracker:
        return self.trackers[0]

    def start_parent(self) -> str | None:
        ids = [t.start_parent() for t in self.trackers]
        self.experiment_id, self.parent_run_id = self.primary.experiment_id, self.primary.parent_run_id
        return ids[0]

    def attach_parent(self, experiment_id: str, parent_run_id: str) -> None:
        for t in self.trackers:
            t.attach_parent(experiment_id, parent_run_id)
        self.experiment_id, self.parent_run_id = self.primary.experiment_id, self.primary.parent_run_id

    def find_sweep(self) -> tuple[str, str] | None:
        return self.primary.find_sweep()

    def discard(self) -> None:
        for t in self.trackers:
            t.discard()

    def trial_started(self, trial_id: str, config: dict[str, Any], extra_params: dict[str, Any]) -> None:
        for t in self.trackers:
            t.trial_started(trial_id, config, extra_params)

    def knows_trial(self, trial_id: str) -> bool:
        return all(t.knows_trial(trial_id) for t in self.trackers)

    def trial_restored(self, trial_id: str, config: dict[str, Any], extra_params: dict[str, Any]) -> None:
        for t in self.trackers:
            t.trial_restored(trial_id, config, extra_params)

    def trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        for t in self.trackers:
            t.trial_result(trial_id, result)

    def trial_paused(self, trial_id: str) -> None:
        for t in self.trackers:
            t.trial_paused(trial_id)

    def trial_ended(self, trial_id: str, status: str, error: str | None = None) -> None:
        for t in self.trackers:
            t.trial_ended(trial_id, status, error)

    def log_trial_tag(self, trial_id: str, key: str, value: str) -> None:
        for t in self.trackers:
            t.log_trial_tag(trial_id, key, value)

    def trial_run_ids(self) -> dict[str, str]:
        return self.primary.trial_run_ids()

    def prune_children(self, keep: set[str]) -> None:
        for t in self.trackers:
            t.prune_children(keep)

    def settle_children(self, statuses: dict[str, str]) -> None:
        for t in self.trackers:
            t.settle_children(statuses)

    def finish(
        self,
        status: str,
        summary: dict[str, float],
        artifacts_dir: str | None,
        message: str = "",
        drain_s: float | None = None,
        analysis: dict[str, Any] | None = None,
    ) -> bool:
        done = [
            t.finish(status, summary, artifacts_dir, message=message, drain_s=drain_s, analysis=analysis)
            for t in self.trackers
        ]  # every sink ends, even after one that could not deliver
        return all(done)

    def flush(self) -> None:
        for t in self.trackers:
            t.flush()

    def pending_writes(self) -> list[str]:
        return [w for t in self.trackers for w in t.pending_writes()]
