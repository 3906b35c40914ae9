"""Rebuilding a :class:`~sweeps.pruning.halving.SuccessiveHalving` after the driver died: every trial's
reports given again (:meth:`ResumeReplay.observe`), the rungs decided before decided alike
(:meth:`ResumeReplay.restore_decisions`), a retried failed trial reopened (:meth:`ResumeReplay.reopen`).
The decisions depend on the rung values only, so a replay gives the decisions of the first run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sweeps.pruning.rungs import RESULT_KEYS, RungDecision, _TrialState

__all__ = ["ResumeReplay"]


class ResumeReplay:
    """The resume half of :class:`~sweeps.pruning.halving.SuccessiveHalving` (a base class: it uses the
    state and the rung methods that class defines)."""

    if TYPE_CHECKING:  # what SuccessiveHalving defines and this half uses
        mode: str
        fractions: list[float]
        waiting: dict[str, int]
        to_resume: list[str]
        to_prune: list[str]
        pruned_while_paused: dict[str, dict[str, Any]]
        _trials: dict[str, _TrialState]
        _rungs: dict[tuple[Any, int], dict[str, float]]
        _members: dict[Any, list[str]]
        _ended: set[str]
        _decided: set[tuple[Any, int]]

        def rung_flops(self, flops_per_token: float) -> list[float]: ...
        def _state(self, trial_id: str, group: Any) -> _TrialState: ...
        def _advance(
            self, trial_id: str, st: _TrialState, flops: float, tokens: float, loss: float, *, decide: bool
        ) -> list[RungDecision]: ...
        def add_member(self, trial_id: str, group: Any, *, ended: bool = False) -> None: ...
        def _walk(self, trial_id: str) -> bool: ...
        def _pump(self) -> None: ...
        def _settle(self, trial_id: str, k: int) -> None: ...

    def observe(
        self,
        trial_id: str,
        group: Any,
        tokens: Sequence[float],
        flops: Sequence[float],
        losses: Sequence[float],
        *,
        ended: bool = False,
        pruning: dict[str, Any] | None = None,
    ) -> None:
        """Give back a trial's past curve after a resume (the scheduler's memory is not part of Tune's
        experiment checkpoint).

        Args:
            tokens, flops, losses: the trial's reports so far, in order (tokens seen, training FLOPs,
                ``val_loss``; equal lengths).
            ended: it will report nothing more (completed, diverged or pruned).
            pruning: the annotation of its last report (:data:`RESULT_KEYS`); ``pruned`` True: it was
                pruned at ``pruned_rung``, and it is stopped if Tune restarts it.

        Mode ``"stop"``: the rung values it passed are recorded, nothing is decided. Mode ``"pause"``: its
        curve is kept until :meth:`restore_decisions` replays every rung of the sweep so far.
        """
        pruned = bool(pruning and pruning.get("pruned"))
        st = self._state(trial_id, group)
        if self.mode != "pause":
            for t, f, y in zip(tokens, flops, losses):
                self._advance(trial_id, st, float(f), float(t), float(y) if y is not None else math.nan, decide=False)
            return
        for t, f, y in zip(tokens, flops, losses):
            if float(f) > 0 and float(t) > 0:
                self._append(st, float(f), float(t), float(y) if y is not None else math.nan)
        self.add_member(trial_id, group, ended=ended or pruned)
        if pruned and pruning:
            last_rung = int(pruning.get("pruned_rung", len(self.fractions) - 1))
            while st.next_rung <= last_rung and self._walk(trial_id):  # its values up to the rung it was pruned at
                self.waiting.pop(trial_id)
            st.stopped = True
            self.pruned_while_paused.setdefault(trial_id, {k: pruning[k] for k in RESULT_KEYS if k in pruning})
            self.to_prune.append(trial_id)  # Tune restarts an unfinished trial: stop it instead
        elif ended:
            while self._walk(trial_id):  # finished: every rung it covered counts
                self.waiting.pop(trial_id)

    def _append(self, st: _TrialState, flops: float, tokens: float, loss: float) -> None:
        """Mode ``"pause"``: add a report (``flops``, ``tokens`` > 0) to a trial's curve unless it is a replay
        (not past its last report); a non-finite loss counts as ``inf``."""
        if st.flops_per_token is None:
            st.flops_per_token = flops / tokens
        if st.last is None or flops > st.last[0]:
            st.last = (flops, loss if (loss is not None and math.isfinite(loss)) else math.inf)
            st.history.append(st.last)

    def _went_past(self, st: _TrialState, k: int) -> bool:
        """Whether a trial reported past the first report that reached rung ``k`` (it had been let go on)."""
        assert st.flops_per_token is not None  # set by its first report, before it reached a rung
        r = self.rung_flops(st.flops_per_token)[k]
        return sum(1 for f, _ in st.history if f >= r * (1 - 1e-12)) > 1

    def restore_decisions(self) -> None:
        """Mode ``"pause"``, after :meth:`observe` of every trial of a resumed sweep: replay the rungs.

        Each unfinished trial walks its curve to the first rung it reached, every complete rung is decided
        again (the decisions depend on the rung values only, so they are the ones taken before the
        interruption), the promoted trials walk on. Afterwards a trial waits (:attr:`waiting`) at the first
        rung of its curve still undecided, is to be resumed (:attr:`to_resume`) if its last report is at a
        rung that promoted it, or is to be pruned (:attr:`to_prune`); :meth:`on_trial_add` keeps all of
        those paused instead of letting Tune restart them.
        """
        for tid in [t for ts in self._members.values() for t in ts]:
            if tid not in self._ended and tid not in self.waiting:
                self._walk(tid)
        self._pump()
        for tid in list(self.to_resume):
            st = self._trials[tid]
            if self._went_past(st, st.decisions[-1].rung):
                self.to_resume.remove(tid)  # it had been let go past the rung: Tune restarts it as it is

    def reopen(self, trial_id: str) -> None:
        """Mode ``"pause"``, after :meth:`restore_decisions`: a trial observed as ended (it failed) that Tune
        retries. The rungs it missed were decided without it; if its last report reached a rung, it is
        judged there now (that rung decided) or waits there (undecided); each later rung it reaches is
        decided for it on arrival if its batch size already decided it (:meth:`_walk`)."""
        st = self._trials[trial_id]
        if st.stopped or trial_id not in self._ended:
            return
        self._ended.discard(trial_id)
        k = st.next_rung - 1
        if k < 0 or trial_id not in self._rungs.get((st.group, k), {}) or any(d.rung == k for d in st.decisions):
            return
        if self._went_past(st, k):
            return  # it had been let go past the rung before it failed
        if (st.group, k) in self._decided:
            self._settle(trial_id, k)
        else:
            self.waiting[trial_id] = k
        self._pump()
