"""``search.precision``'s side of the searcher: the end of a wave, the decision, and the trials a wave adds
(:class:`PrecisionWaves`, a mixin of :class:`sweeps.search.searcher.BatchSizeSearcher`, which owns the
state it reads: ``assigned``, ``batches``, ``open_group``, ``extra_groups``, ``extra_lrs``, ``waves``,
``precision_outcome``). The rules that choose the trials are :mod:`sweeps.search.precision`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sweeps.search.precision import (
    Proposal, Reallocation, budgets_trained, nothing_completed, precise_enough, propose, wave_summary,
)
from sweeps.search.transfer import MAX_PROBE_OFFSET_OCTAVES

__all__ = ["PrecisionWaves"]

log = logging.getLogger(__name__)


class PrecisionWaves:
    """Waves of trials until ``b_crit``'s interval is as narrow as ``search.precision`` asks (see
    :mod:`sweeps.search.precision`); every method is called by the searcher's ``suggest``."""

    def attach_precision(self, analyse: Any, report: Any) -> None:
        """``search.precision``: attach ``analyse(targets) -> (analysis, records)`` (the sweep's analysis as
        ``cbs.json`` would hold it now at those target losses, None: chosen from the trials, and its
        :class:`TrialRecord` list) and ``report(waves, outcome, planned_trials, targets)`` (called after each
        wave's decision; ``planned_trials``: the trials handed out and added so far; ``targets``: the target
        losses every wave after the first is judged at). Without them a wave's end finishes the sweep."""
        self._analyse, self._report = analyse, report

    def _end_of_wave(self) -> bool | None:
        """Every trial handed out has been: True if a new wave was added, False if the sweep is done, None
        while some still run."""
        if self.precision is None or self.precision_outcome is not None or self._analyse is None:
            return False
        if self._live():
            return None
        # the first wave declares the targets (chosen from its trials, or the spec's); later waves are judged
        # at the same ones, so a wave cannot narrow the interval by moving the headline to an easier target
        try:
            analysis, records = self._analyse(self.precision_targets)
        except Exception:  # noqa: BLE001 - an analysis bug ends the waves, never the sweep (cbs.json says why)
            log.exception("search.precision: the wave's analysis failed; no more trials are added")
            self.precision_outcome = {"stopped_because": "analysis_failed", "trials": sum(self.assigned.values()),
                                      "b_crit_ratio_requested": self.precision.b_crit_ratio}
            if self._report is not None:
                self._report(list(self.waves), self.precision_outcome, sum(self._quota(b) for b in self.batches),
                             self.precision_targets)
            return False
        spent = self._budgets_spent(records)
        if self.precision_targets is None:
            self.precision_targets = [float(t["target_loss"]) for t in analysis.get("targets") or []] or None
            self.budgets_first_wave = spent
        handed = sum(self.assigned.values())
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
            proposals = [p for p in propose(analysis, records, 100, allowed_batch_size=self.spec.sweepable_batch_size,
                                            lr_probes=self.transfer, reallocation=realloc) if self._runs_as_proposed(p)]
            added = self._fit_to_room(proposals, room, saved)
            if not added:
                outcome = "max_trials" if proposals else "nothing_to_add"
        before = sum(self._quota(b) for b in self.batches)
        for p in added:
            self._add(p)
        summary["added"] = [p.to_dict() for p in added]
        # trials, not proposals: a new batch size is trials_per_batch_size groups, every group one trial per seed
        summary["trials_added"] = sum(self._quota(b) for b in self.batches) - before
        self.waves.append(summary)
        if outcome is not None:
            self.precision_outcome = {"stopped_because": outcome, "b_crit_ratio_requested": self.precision.b_crit_ratio,
                                      "b_crit_ratio": summary["ratio"], "status": summary["status"], "trials": handed}
        if self._report is not None:
            self._report(list(self.waves), self.precision_outcome, sum(self._quota(b) for b in self.batches),
                         self.precision_targets)
        return outcome is None

    def _reallocation(self) -> Reallocation | None:
        """Token reallocation's settings once the first wave has declared the targets, else None (off, or no
        target declared)."""
        p = self.precision
        if p is None or not getattr(p, "reallocate_tokens", False) or not self.precision_targets:
            return None
        return Reallocation(lowest_target=min(self.precision_targets), budget_tokens=self.spec.budget_tokens,
                            max_budget_multiple=p.max_budget_multiple)

    def stop_at_loss(self) -> float | None:
        """The loss at which a trial handed out now ends (token reallocation, after the first wave), or None."""
        r = self._reallocation()
        return r.lowest_target if r is not None else None

    def _next_stop_at_loss(self, b: int) -> float | None:
        """The stop loss of ``b``'s next group where its proposal set one (an LR probe of a bracket open only at
        higher targets ends at the lowest of those), else None (the sweep's, :meth:`stop_at_loss`)."""
        i = len(self._groups_of(b)) - self.spec.search.trials_per_batch_size
        stops = self.__dict__.get("extra_stops", {}).get(b, [])
        return stops[i] if 0 <= i < len(stops) else None

    def _next_budget_multiple(self, b: int) -> int:
        """The budget multiple of ``b``'s next group: a re-run's (token reallocation), else 1."""
        i = len(self._groups_of(b)) - self.spec.search.trials_per_batch_size  # its index among b's extra groups
        multiples = getattr(self, "extra_budget_multiples", {}).get(b, [])
        return multiples[i] if 0 <= i < len(multiples) else 1

    def _budgets_spent(self, records: list[Any]) -> float:
        return budgets_trained(records, self.spec.budget_tokens, len(self.spec.seeds))

    def _runs_as_proposed(self, p: Proposal) -> bool:
        """An LR probe runs at its LR only within the study's offset range around its batch size's centre."""
        if p.lr is None:
            return True
        centre = self.transfer_state.get(p.batch_size_sequences, {}).get("centre_lr")
        return bool(centre) and abs(math.log2(p.lr / centre)) <= MAX_PROBE_OFFSET_OCTAVES

    def _fit_to_room(self, proposals: list[Proposal], room: float, saved: float = 0.0) -> list[Proposal]:
        """The proposals, in order, that fit one wave: ``trials_per_wave`` groups (or the first proposal's
        cost, if larger: a new batch size takes ``trials_per_batch_size``, a re-run its budget multiple) plus
        ``saved`` (token reallocation: budgets earlier waves left unspent), and never more than ``room`` (what
        ``max_trials`` leaves). Under token reallocation each wave's allowance is added to ``budgets_allowed``."""
        cost = lambda p: (self.spec.search.trials_per_batch_size if p.batch_size_sequences not in self.assigned  # noqa: E731
                          else p.budget_multiple)
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

    def _add(self, p: Proposal) -> None:
        """Hand out one proposal's trials: a new batch size (placed like the others), or one more group."""
        b = p.batch_size_sequences
        if b not in self.assigned:
            self.batches.append(b)  # under transfer: its anchor is the old end of the range (anchor_of)
            self.assigned[b] = 0
            self.open_group[b] = None
            return
        self.extra_groups[b] = self.extra_groups.get(b, 0) + 1
        self.extra_budget_multiples.setdefault(b, []).append(int(p.budget_multiple))
        self.__dict__.setdefault("extra_stops", {}).setdefault(b, []).append(p.stop_at_loss)
        if p.lr is not None:
            self.extra_lrs.setdefault(b, []).append(float(p.lr))
