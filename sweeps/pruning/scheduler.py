"""The Ray Tune face of equal-compute successive halving (:mod:`sweeps.pruning.halving`).

Decisions reach the rest of the sweep through the result dict: Ray Tune hands a scheduler a flattened
*copy* of each result (Ray 2.60, ``TuneController._process_trial_result``), so keys set there reach
neither ``trial.last_result`` nor ``result.json`` nor ``Searcher.on_trial_complete``. The callbacks,
called right after the scheduler with the original result, may edit it in place: the scheduler's
:meth:`EqualComputeScheduler.annotator` is a Tune callback that adds ``pruned`` (True on the result
that stopped the trial), ``pruned_at_flops``, ``pruned_rung`` and ``rung_decisions`` (every decision
so far, on every later result). It must come first in ``RunConfig.callbacks``; the scheduler refuses
to run without it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ray.tune import Callback
from ray.tune.experiment.trial import Trial  # Tune's trial statuses: PENDING, RUNNING, PAUSED, TERMINATED, ERROR
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from sweeps._compat import kv_put
from sweeps.pruning.halving import SuccessiveHalving
from sweeps.pruning.rungs import rung_gate_key
from sweeps.spec import SweepSpec

__all__ = ["EqualComputeScheduler", "PruningAnnotator"]

log = logging.getLogger(__name__)


class EqualComputeScheduler(SuccessiveHalving, FIFOScheduler):
    """:class:`~sweeps.pruning.halving.SuccessiveHalving` as a Ray Tune ``TrialScheduler`` (arguments there).

    Put :meth:`annotator` first in ``RunConfig.callbacks``: the scheduler refuses to run without it.
    """

    _supports_buffered_results = False  # decide on every report, not on a buffered batch

    def __init__(self, **kwargs: Any):
        FIFOScheduler.__init__(self)
        SuccessiveHalving.__init__(self, **kwargs)
        self._metric = self.loss_key
        self._mode = "min"
        self._limiter_checked = False

    @classmethod
    def from_spec(cls, spec: SweepSpec, **state: Any) -> EqualComputeScheduler:
        """The scheduler a spec's ``pruning`` section asks for; ``state``: ``gate_prefix``, ``state_path``,
        ``pruned_while_paused`` (see :class:`~sweeps.pruning.halving.SuccessiveHalving`)."""
        p = spec.pruning
        return cls(
            budget_tokens=spec.budget_tokens,
            grace_fraction=p.grace_fraction,
            reduction_factor=p.reduction_factor,
            min_trials_per_rung=p.min_trials_per_rung,
            rule=p.rule,
            fit_fractions=p.fit_fractions,
            margin=p.margin,
            mode=p.mode,
            trials_per_group=spec.search.trials_per_batch_size * len(spec.seeds),
            max_concurrent=spec.resources.max_concurrent_trials,
            **state,
        )

    def annotator(self) -> PruningAnnotator:
        """The Tune callback that writes this scheduler's decisions into the results (put it first)."""
        return PruningAnnotator(self)

    # ---- TrialScheduler -------------------------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        return True  # the metric is fixed (the loss), whatever TuneConfig says

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if not self._annotator_ready:
            raise RuntimeError(
                "EqualComputeScheduler: its annotator is not in RunConfig.callbacks; without it pruned "
                "trials reach neither the searcher, the tracker nor result.json as PRUNED. Pass "
                "callbacks=[scheduler.annotator(), ...]."
            )
        group = trial.config.get(self.group_by)
        loss = result.get(self.loss_key)
        if self.mode == "pause":
            return self._on_result_pause(tune_controller, trial, group, result, loss)
        st = self._state(trial.trial_id, group)
        made = self._advance(
            trial.trial_id,
            st,
            float(result.get("flops") or 0.0),
            float(result.get("tokens_seen") or 0.0),
            float(loss) if loss is not None else math.nan,
            decide=True,
        )
        for d in made:
            log.debug("trial %s (%s=%s): %s", trial.trial_id, self.group_by, group, d.label())
        if made and made[-1].stop:
            result.update(self.annotation(trial.trial_id))  # the flat copy: for readers of this dict
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def _on_result_pause(self, tune_controller, trial, group, result: dict, loss) -> str:
        what = self.report(
            trial.trial_id,
            group,
            float(result.get("flops") or 0.0),
            float(result.get("tokens_seen") or 0.0),
            float(loss) if loss is not None else math.nan,
        )
        self._prune_paused(tune_controller)
        if what == "stop":
            result.update(self.annotation(trial.trial_id))
            return TrialScheduler.STOP
        if what == "pause":
            # Ray Train keeps the checkpoint of this milestone; Tune's own checkpoint of a function
            # trainable holds nothing more, so none is taken (the trial resumes through Ray Train's)
            if trial.status == Trial.RUNNING:
                tune_controller.pause_trial(trial, should_checkpoint=False)
            return TrialScheduler.NOOP
        self._let_go(trial.trial_id, float(result.get("tokens_seen") or 0.0))
        return TrialScheduler.CONTINUE

    def _let_go(self, trial_id: str, tokens: float) -> None:
        if self.gate_prefix:
            kv_put(rung_gate_key(self.gate_prefix, trial_id), repr(tokens).encode())

    def _prune_paused(self, tune_controller) -> None:
        """Stop the paused trials that their rung's decision pruned; their last result says so."""
        if not self.to_prune:
            return
        by_id = {t.trial_id: t for t in tune_controller.get_trials()}
        for tid in list(self.to_prune):
            self.to_prune.remove(tid)
            t = by_id.get(tid)
            if t is None:
                continue
            t.last_result.update(
                self.pruned_while_paused.get(tid) or self.annotation(tid)
            )  # read by the tracker, the driver
            tune_controller.stop_trial(t)
        if self.state_path:
            from sweeps.files import write_json

            write_json(self.state_path, self.pruned_while_paused, indent=None)

    def on_trial_add(self, tune_controller, trial) -> None:
        if self.mode == "pause" and not self._limiter_checked:
            self._limiter_checked = True
            alg = getattr(tune_controller, "search_alg", None)
            while alg is not None:
                if type(alg).__name__ == "ConcurrencyLimiter" or getattr(alg, "max_concurrent", 0):
                    raise RuntimeError(
                        "EqualComputeScheduler(mode='pause'): Tune's max_concurrent_trials (ConcurrencyLimiter) "
                        "counts paused trials as running, so the sweep would wait forever; leave it unset and give "
                        "the searcher the scheduler's may_start gate (BatchSizeSearcher.scheduler)"
                    )
                alg = getattr(alg, "searcher", None)
        if self.mode == "pause":
            if trial.status == Trial.PENDING and self.held(trial.trial_id):
                # a resumed sweep (restore_decisions): Tune restarts every unfinished trial; one that waits at a
                # rung stays paused until its rung is decided (restarted, it would train on past the rung)
                trial.set_status(Trial.PAUSED)
            self.add_member(
                trial.trial_id, trial.config.get(self.group_by), ended=trial.status in (Trial.TERMINATED, Trial.ERROR)
            )

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        self._trial_ended(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        self._trial_ended(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._trial_ended(tune_controller, trial)

    def _trial_ended(self, tune_controller, trial) -> None:
        if self.mode == "pause" and trial.trial_id not in self._ended:
            self.end(trial.trial_id)
            self._prune_paused(tune_controller)

    def choose_trial_to_run(self, tune_controller):
        if self.mode != "pause":
            return super().choose_trial_to_run(tune_controller)
        self._prune_paused(tune_controller)  # after a resume: trials pruned before the interruption
        trials = tune_controller.get_trials()
        active = [t for t in trials if t.status in (Trial.RUNNING, Trial.PENDING)]
        if not active and not self.to_resume and self.waiting and tune_controller.search_alg.is_finished():
            # nothing can complete a waiting rung any more: decide it on what it has
            self.force_lowest()
            self._prune_paused(tune_controller)
        by_id = {t.trial_id: t for t in trials}
        running = sum(1 for t in trials if t.status == Trial.RUNNING)
        for tid in self.to_resume:
            t = by_id.get(tid)
            if (
                t is not None
                and t.status == Trial.PAUSED
                and (self.max_concurrent is None or running < self.max_concurrent)
            ):
                return t
        for t in trials:
            if t.status == Trial.PENDING:
                return t
        return None

    def debug_string(self) -> str:
        stopped = sum(1 for s in self._trials.values() if s.stopped)
        return (
            f"EqualComputeScheduler: rungs at {[round(f, 4) for f in self.fractions]} of the trial budget "
            f"(FLOPs), per {self.group_by}; {stopped} trial(s) pruned"
        )


class PruningAnnotator(Callback):
    """Writes the scheduler's decisions into each result, in place, before loggers and trackers see it.

    Tune calls callbacks with the original result dict right after the scheduler decided, and then
    stores that dict as ``trial.last_result`` (which ``Searcher.on_trial_complete`` and
    ``Callback.on_trial_complete`` read) and writes it to ``result.json``. Must be the first callback.
    """

    def __init__(self, scheduler: EqualComputeScheduler):
        self.scheduler = scheduler

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.scheduler._annotator_ready = True

    def on_trial_result(self, iteration, trials, trial, result, **info):
        result.update(self.scheduler.annotation(trial.trial_id))
