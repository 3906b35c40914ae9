"""``search.precision``'s side of the searcher: the end of a wave, the decision, and the trials a wave adds
(:class:`PrecisionWaves`, the wave policy :class:`sweeps.search.searcher.BatchSizeSearcher` holds). It keeps the
waves' state; what it reads of the searcher's bookkeeping is :class:`Ledger`. The rules that choose the trials
are :mod:`sweeps.search.precision`.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Protocol

from sweeps.search.precision import (
    Proposal,
    Reallocation,
    budgets_trained,
    nothing_completed,
    precise_enough,
    propose,
    wave_summary,
)
from sweeps.search.strategies import SearchStrategy
from sweeps.spec import PrecisionSpec, SweepSpec

__all__ = ["Ledger", "PrecisionWaves"]

log = logging.getLogger(__name__)


class Ledger(Protocol):
    """The searcher's bookkeeping a wave reads and extends."""

    spec: SweepSpec
    strategy: SearchStrategy
    batches: list[int]
    assigned: dict[int, int]

    def trials_for(self, b: int) -> int: ...

    def live(self) -> list[str]: ...

    def add_batch_size(self, b: int) -> None: ...


class PrecisionWaves:
    """Waves of trials until ``b_crit``'s interval is as narrow as ``search.precision`` asks (see
    :mod:`sweeps.search.precision`); every method is called by the searcher's ``suggest``.

    Args:
        spec: the sweep.
        precision: ``spec.search.precision``; None: a wave's end finishes the sweep.

    State (pickled with the searcher): ``extra_groups`` (per batch size, the groups later waves added),
    ``extra_lrs`` / ``extra_budget_multiples`` / ``extra_stops`` (their LRs, budget multiples and stop losses),
    ``budgets_first_wave`` / ``budgets_allowed`` (token reallocation), ``waves`` (one entry per ended wave),
    ``precision_outcome`` (why the searcher stopped adding) and ``precision_targets`` (the targets the first
    wave declared).
    """

    def __init__(self, spec: SweepSpec, precision: PrecisionSpec | None) -> None:
        self.spec = spec
        self.precision = precision
        self.extra_groups: dict[int, int] = {}
        self.extra_lrs: dict[int, list[float]] = {}
        self.extra_budget_multiples: dict[int, list[int]] = {}
        self.extra_stops: dict[int, list[float | None]] = {}
        self.budgets_first_wave, self.budgets_allowed = 0.0, 0.0
        #: one entry per ended wave (:func:`sweeps.search.precision.wave_summary` plus ``added``)
        self.waves: list[dict[str, Any]] = []
        #: ``{"stopped_because": "met" | "max_trials" | "nothing_to_add" | "no_trial_completed" |
        #: "analysis_failed", ...}`` once the searcher stopped adding
        self.precision_outcome: dict[str, Any] | None = None
        #: the target losses the first wave declared (every later wave and cbs.json use them)
        self.precision_targets: list[float] | None = None
        self._analyse: Any = None  # attached by the driver (attach), never pickled
        self._report: Any = None

    def detached(self) -> PrecisionWaves:
        """A shallow copy without the attached analysis and report (what the searcher saves)."""
        out = copy.copy(self)
        out._analyse = out._report = None
        return out

    def attach(self, analyse: Any, report: Any) -> None:
        """Attach ``analyse(targets) -> (analysis, records)`` (the sweep's analysis as ``cbs.json`` would hold it
        now at those target losses, None: chosen from the trials, and its :class:`TrialRecord` list) and
        ``report(waves, outcome, planned_trials, targets)`` (called after each wave's decision;
        ``planned_trials``: the trials handed out and added so far; ``targets``: the target losses every wave
        after the first is judged at). Without them a wave's end finishes the sweep."""
        self._analyse, self._report = analyse, report

    def extra_trials(self, b: int) -> int:
        """Trials later waves added at batch size ``b`` (groups times seeds)."""
        return self.extra_groups.get(b, 0) * len(self.spec.seeds)

    def end_of_wave(self, ledger: Ledger) -> bool | None:
        """Every trial handed out has been: True if a new wave was added, False if the sweep is done, None
        while some still run."""
        if self.precision is None or self.precision_outcome is not None or self._analyse is None:
            return False
        if ledger.live():
            return None
        # the first wave declares the targets (chosen from its trials, or the spec's); later waves are judged
        # at the same ones, so a wave cannot narrow the interval by moving the headline to an easier target
        try:
            analysis, records = self._analyse(self.precision_targets)
        except Exception:
            log.exception("search.precision: the wave's analysis failed; no more trials are added")
            self.precision_outcome = {
                "stopped_because": "analysis_failed",
                "trials": sum(ledger.assigned.values()),
                "b_crit_ratio_requested": self.precision.b_crit_ratio,
            }
            self._tell_report(ledger)
            return False
        spent = budgets_trained(records, self.spec.budget_tokens, len(self.spec.seeds))
        if self.precision_targets is None:
            self.precision_targets = [float(t["target_loss"]) for t in analysis.get("targets") or []] or None
            self.budgets_first_wave = spent
        handed = sum(ledger.assigned.values())
        summary = wave_summary(analysis, handed)
        realloc = self._reallocation()
        if realloc is not None:  # the cap and the waves count tokens, in budgets per seed
            saved = max(0.0, self.budgets_allowed - (spent - self.budgets_first_wave))
            room: float = self.spec.max_trials / len(self.spec.seeds) - spent
            summary.update(budgets_spent=round(spent, 4), budgets_saved=round(saved, 4))
        else:
            saved, room = 0.0, (self.spec.max_trials - handed) // len(self.spec.seeds)  # groups the cap leaves
        outcome = None
        added: list[Proposal] = []
        if nothing_completed(records):  # every trial so far failed, diverged or was pruned: nothing to place by
            outcome = "no_trial_completed"
        elif precise_enough(analysis, self.precision.b_crit_ratio):
            outcome = "met"
        elif room <= 1e-9:
            outcome = "max_trials"
        else:
            strategy = ledger.strategy
            proposals = [
                p
                for p in propose(
                    analysis,
                    records,
                    100,
                    allowed_batch_size=self.spec.sweepable_batch_size,
                    lr_probes=strategy.places_lr_probes,
                    reallocation=realloc,
                )
                if p.lr is None or strategy.places_probe(p.batch_size_sequences, p.lr)
            ]
            added = self._fit_to_room(proposals, room, saved, ledger.assigned)
            if not added:
                outcome = "max_trials" if proposals else "nothing_to_add"
        before = self._planned(ledger)
        for p in added:
            self._add(p, ledger)
        summary["added"] = [p.to_dict() for p in added]
        # trials, not proposals: a new batch size is trials_per_batch_size groups, every group one trial per seed
        summary["trials_added"] = self._planned(ledger) - before
        self.waves.append(summary)
        if outcome is not None:
            self.precision_outcome = {
                "stopped_because": outcome,
                "b_crit_ratio_requested": self.precision.b_crit_ratio,
                "b_crit_ratio": summary["ratio"],
                "status": summary["status"],
                "trials": handed,
            }
        self._tell_report(ledger)
        return outcome is None

    @staticmethod
    def _planned(ledger: Ledger) -> int:
        """Trials handed out and added so far."""
        return sum(ledger.trials_for(b) for b in ledger.batches)

    def _tell_report(self, ledger: Ledger) -> None:
        if self._report is not None:
            self._report(list(self.waves), self.precision_outcome, self._planned(ledger), self.precision_targets)

    def _reallocation(self) -> Reallocation | None:
        """Token reallocation's settings once the first wave has declared the targets, else None (off, or no
        target declared)."""
        p = self.precision
        if p is None or not getattr(p, "reallocate_tokens", False) or not self.precision_targets:
            return None
        return Reallocation(
            lowest_target=min(self.precision_targets),
            budget_tokens=self.spec.budget_tokens,
            max_budget_multiple=p.max_budget_multiple,
        )

    def stop_at_loss(self) -> float | None:
        """The loss at which a trial handed out now ends (token reallocation, after the first wave), or None."""
        r = self._reallocation()
        return r.lowest_target if r is not None else None

    def next_stop_at_loss(self, b: int, index: int) -> float | None:
        """The stop loss of ``b``'s group number ``index`` where its proposal set one (an LR probe of a bracket open
        only at higher targets ends at the lowest of those), else None (the sweep's, :meth:`stop_at_loss`)."""
        i = index - self.spec.search.trials_per_batch_size  # its index among b's extra groups
        stops = self.extra_stops.get(b, [])
        return stops[i] if 0 <= i < len(stops) else None

    def next_budget_multiple(self, b: int, index: int) -> int:
        """The budget multiple of ``b``'s group number ``index``: a re-run's (token reallocation), else 1."""
        i = index - self.spec.search.trials_per_batch_size
        multiples = self.extra_budget_multiples.get(b, [])
        return multiples[i] if 0 <= i < len(multiples) else 1

    def probe_lrs(self, b: int) -> list[float]:
        """The LRs of the groups the waves added at ``b`` (LR probes and re-runs), in order."""
        return self.extra_lrs.get(b, [])

    def _fit_to_room(
        self, proposals: list[Proposal], room: float, saved: float, assigned: dict[int, int]
    ) -> list[Proposal]:
        """The proposals, in order, that fit one wave: ``trials_per_wave`` groups (or the first proposal's
        cost, if larger: a new batch size takes ``trials_per_batch_size``, a re-run its budget multiple) plus
        ``saved`` (token reallocation: budgets earlier waves left unspent), and never more than ``room`` (what
        ``max_trials`` leaves). Under token reallocation each wave's allowance is added to ``budgets_allowed``."""
        assert self.precision is not None

        def cost(p):
            return (
                self.spec.search.trials_per_batch_size if p.batch_size_sequences not in assigned else p.budget_multiple
            )

        allowance = max(self.precision.trials_per_wave, cost(proposals[0]) if proposals else 0)
        wave = min(room, allowance + saved)
        out, used = [], 0
        for p in proposals:
            if used + cost(p) <= wave + 1e-9:
                out.append(p)
                used += cost(p)
        if out and self._reallocation() is not None:
            self.budgets_allowed += allowance
        return out

    def _add(self, p: Proposal, ledger: Ledger) -> None:
        """Hand out one proposal's trials: a new batch size (placed like the others), or one more group."""
        b = p.batch_size_sequences
        if b not in ledger.assigned:
            ledger.add_batch_size(b)  # under transfer: its anchor is the old end of the range (anchor_of)
            return
        self.extra_groups[b] = self.extra_groups.get(b, 0) + 1
        self.extra_budget_multiples.setdefault(b, []).append(int(p.budget_multiple))
        self.extra_stops.setdefault(b, []).append(p.stop_at_loss)
        if p.lr is not None:
            self.extra_lrs.setdefault(b, []).append(float(p.lr))
