"""Equal-compute early stopping within each batch size: successive halving in FLOPs.

Why not Ray's ASHA or Optuna's pruners: ASHA decides on the first report past a rung and Optuna
compares trials that reported the very same step, so a trial that reports often is judged on less
compute than one that reports rarely, and step counts mean different compute at different batch
sizes (methodology note section 11.2: never compare on ``training_iteration``). Here:

* **Rungs in FLOPs.** Rung ``k`` of a trial sits at ``grace_fraction * reduction_factor**k`` of the
  trial budget (every rung below the budget), in training FLOPs: ``flops_per_token * budget_tokens``,
  with ``flops_per_token`` read from the trial's own reports (``flops / tokens_seen``), so the rungs
  are right for any workload's FLOP convention.
* **Interpolated to the exact rung.** A trial's value at a rung is its ``val_loss`` interpolated
  linearly between the two reports that bracket the rung's FLOPs, so it does not depend on how often
  the trial reports. The decision is taken when the first report at or past the rung arrives. A rung
  that lies before a trial's first report is skipped for that trial (nothing brackets it).
* **Only the same batch size is compared.** Values are kept per rung *and per batch size*: each
  batch size's LR/beta2 search is pruned, the batch-size axis never is (the analysis needs every
  batch size). The first trial of a batch size to reach a rung always continues past it, so every
  batch size keeps at least one trial that runs its whole budget.
* **What is compared** (``rule``). ``loss_at_rung`` (the default): the loss interpolated at the rung.
  ``predicted_final``: the loss predicted at the budget from the curve up to the rung: the loss is
  read (interpolated as above) at fixed fractions ``fit_fractions`` of the rung's FLOPs (default 0.5,
  0.75 and 1), and the least-squares line in log-compute through those points is evaluated at the
  budget (:func:`predict_final_log_linear`). The points sit at fixed FLOPs, so the prediction does not
  depend on the reporting cadence either; a rung whose first fit point lies before a trial's first
  report is skipped for that trial. Why: with a constant learning rate the loss at a fraction of the
  budget ranks the LR multipliers close to the reverse of their final ranking (short-horizon bias,
  docs/search_efficiency.md); the extrapolation favours the curves still falling at the rung.
* **Mode ``stop``: asynchronous successive halving** (Li et al. 2020, arXiv 1810.05934): a trial reaching a rung
  is compared with the values recorded there so far; fewer than ``min_trials_per_rung`` values: it
  continues; otherwise it continues if fewer than ``ceil(n / reduction_factor)`` recorded values are
  strictly better than its own (it is in the top ``1/reduction_factor``). With ``margin`` set, it
  continues instead if its value is at most the best recorded value plus ``margin`` (nats; 0: only a
  new best continues), and ``reduction_factor`` only spaces the rungs. A trial that reaches a rung
  before its peers is therefore judged against fewer values, as in ASHA.
* **Mode ``pause`` (the spec's default): successive halving with pausing**: a trial reaching a rung is *paused* (its
  workers stop; Ray Train keeps its checkpoint at that milestone) until every trial of its batch size
  has reached the rung or ended (``trials_per_group`` trials are expected per batch size: the
  searcher's quota). Then the rung is decided at once, on all its values: the top
  ``ceil(n / reduction_factor)`` (or, with ``margin``, those within ``margin`` of the best) resume from
  their checkpoints, the others are pruned where they wait. This is the synchronous successive halving
  of Jamieson & Talwalkar 2016 (arXiv 1502.07943) within each batch size; the decisions depend on the
  rung values only, not on the order in which trials arrive. It spends less than the asynchronous rule
  (where the first trials to reach a rung always continue) for one restart per promoted trial.
  The workers wait after the report that reaches a rung until the scheduler lets them go on (a Ray KV
  key per trial, :attr:`EqualComputeScheduler.gate_prefix`): a trial that is paused or pruned is
  stopped while it waits, so it never trains past its rung, however slowly Tune stops it.
  Paused trials hold no CPUs; the searcher's ``may_start`` gate keeps ``max_concurrent`` trials
  *running* (Tune's ``max_concurrent_trials`` would count the paused ones and deadlock). If nothing is
  running or pending while trials wait (a group that will never be complete: a resumed sweep, a
  searcher that stopped early), the lowest waiting rung is decided on the values it has.
  After the driver dies, ``critbatch resume`` gives the scheduler every trial's reports
  (:meth:`EqualComputeScheduler.observe`) and :meth:`EqualComputeScheduler.restore_decisions` replays
  the rungs: the decisions depend on the rung values only, so the rungs decided before are decided
  alike; the trials that wait at a rung, or wait to be resumed, stay paused (Tune would restart them
  past their rung), and those pruned before are stopped. A failed trial that the resume retries
  (:meth:`EqualComputeScheduler.reopen`) is decided on arrival at a rung its batch size decided
  without it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from sweeps.pruning.replay import ResumeReplay
from sweeps.pruning.rungs import (
    MODES,
    RULES,
    RungDecision,
    _TrialState,
    curve_at,
    predict_final_log_linear,
    rung_fractions,
)

__all__ = ["SuccessiveHalving"]

log = logging.getLogger(__name__)


class SuccessiveHalving(ResumeReplay):
    """Successive halving with rungs in FLOPs, within each batch size (module docstring); no Ray objects.

    Args:
        budget_tokens: the per-trial token budget (every trial's budget).
        grace_fraction: the first rung, as a fraction of the trial budget.
        reduction_factor: rungs are ``reduction_factor`` apart; the top ``1/reduction_factor`` continue.
        min_trials_per_rung: values needed at a rung (same batch size) before anyone is stopped there.
        rule: ``"loss_at_rung"`` or ``"predicted_final"`` (module docstring).
        fit_fractions: ``predicted_final``: where the fit reads the loss, as fractions of the rung's
            FLOPs (at least 2 distinct values in ``(0, 1]``).
        margin: ``None``: the top ``1/reduction_factor`` continue; a number (nats, >= 0): the trials
            within ``margin`` of the best value recorded at the rung continue.
        mode: ``"stop"`` (decide each trial as it reaches a rung) or ``"pause"`` (wait, paused, for the
            whole batch size at every rung; module docstring).
        trials_per_group: ``"pause"``: how many trials each batch size gets (the searcher's quota:
            trials per batch size times seeds); a rung is complete when all of them reached it or ended.
        max_concurrent: ``"pause"``: trials running at once (paused ones excluded), for :meth:`may_start`
            and the resumes of :meth:`choose_trial_to_run`; None: no limit.

    Raises:
        ValueError: an argument out of range (``"pause"`` without ``trials_per_group``, an unknown rule
            or mode, fewer than 2 fit fractions...).
        metric: the loss compared (minimised); ``group_by``: the trial config key whose trials are
            compared with each other (the batch size).

        gate_prefix: ``"pause"``: after each CONTINUE, the Ray KV value under ``rung_gate_key(gate_prefix,
            trial)`` becomes the reported tokens; a worker waits at a rung for it, so that a trial to be
            paused or pruned never trains on while Tune stops it. None: no gate.
        state_path: if set, ``pruned_while_paused`` is written there (JSON) on each change.
        pruned_while_paused: a resumed sweep's ``pruned_while_paused`` (trial id -> annotation).

    Reads ``flops``, ``tokens_seen`` and ``metric`` from each result, ``group_by`` from the trial config.
    """

    _supports_buffered_results = False  # decide on every report, not on a buffered batch

    def __init__(
        self,
        *,
        budget_tokens: int,
        grace_fraction: float = 0.25,
        reduction_factor: float = 2.0,
        min_trials_per_rung: int = 2,
        rule: str = "loss_at_rung",
        fit_fractions: Sequence[float] = (0.5, 0.75, 1.0),
        margin: float | None = None,
        mode: str = "stop",
        trials_per_group: int | None = None,
        max_concurrent: int | None = None,
        metric: str = "val_loss",
        group_by: str = "batch_size_sequences",
        gate_prefix: str | None = None,
        state_path: str | None = None,
        pruned_while_paused: dict[str, dict[str, Any]] | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "pause" and not (trials_per_group and trials_per_group >= 1):
            raise ValueError(
                f"mode 'pause' needs trials_per_group >= 1 (the trials per batch size), got {trials_per_group}"
            )
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1 or None, got {max_concurrent}")
        if budget_tokens <= 0:
            raise ValueError(f"budget_tokens must be > 0, got {budget_tokens}")
        if min_trials_per_rung < 1:
            raise ValueError(f"min_trials_per_rung must be >= 1, got {min_trials_per_rung}")
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        fit = tuple(sorted(float(q) for q in fit_fractions))
        if len(set(fit)) < 2 or len(set(fit)) != len(fit) or not all(0 < q <= 1 for q in fit):
            raise ValueError(f"fit_fractions must be >= 2 distinct values in (0, 1], got {list(fit_fractions)}")
        if margin is not None and not margin >= 0:
            raise ValueError(f"margin must be >= 0 or None, got {margin}")
        self.rule = rule
        self.margin = None if margin is None else float(margin)
        self.fit_fractions = fit
        self.budget_tokens = int(budget_tokens)
        self.fractions = rung_fractions(grace_fraction, reduction_factor)
        self.reduction_factor = float(reduction_factor)
        self.min_trials_per_rung = int(min_trials_per_rung)
        self.loss_key = metric
        self.group_by = group_by
        self._trials: dict[str, _TrialState] = {}
        self._rungs: dict[tuple[Any, int], dict[str, float]] = {}  # (group, rung) -> trial id -> value
        self._annotator_ready = False
        # mode "pause" (module docstring)
        self.mode = mode
        self.trials_per_group = trials_per_group
        self.max_concurrent = max_concurrent
        self._members: dict[Any, list[str]] = {}  # group -> its trial ids, in the order they were added
        self._ended: set[str] = set()  # trials that will report nothing more (finished, failed, pruned)
        self._skipped: set[tuple[Any, int, str]] = set()  # (group, rung, trial): a rung before its first report
        self._decided: set[tuple[Any, int]] = set()  # (group, rung) decided
        self.waiting: dict[str, int] = {}  # paused trial id -> the rung whose decision it waits for
        self.to_resume: list[str] = []  # promoted while paused: resume these (choose_trial_to_run)
        self.to_prune: list[str] = []  # pruned while paused: stop these (their Tune trials are PAUSED)
        self.pruned_while_paused: dict[str, dict[str, Any]] = dict(
            pruned_while_paused or {}
        )  # trial id -> its annotation
        self.state_path = state_path  # if set: pruned_while_paused is written there (JSON) on each change
        # if set: after each CONTINUE, the Ray KV value under rung_gate_key(gate_prefix, trial) becomes the
        # reported tokens; a worker waits at a rung for it (workloads.ray.adapter), so that a trial to be
        # paused or pruned never trains on while Tune stops it
        self.gate_prefix = gate_prefix
        self._limiter_checked = False

    # ---- the decision rule (no Ray objects below this line) -----------------------------------------

    def rung_flops(self, flops_per_token: float) -> list[float]:
        """Rung budgets in training FLOPs for a trial with ``flops_per_token``."""
        return [f * flops_per_token * self.budget_tokens for f in self.fractions]

    def _state(self, trial_id: str, group: Any) -> _TrialState:
        st = self._trials.get(trial_id)
        if st is None:
            st = self._trials[trial_id] = _TrialState(group=group)
        return st

    def _record(self, st: _TrialState, trial_id: str, rung: int, value: float) -> tuple[int, int, int]:
        """Record a rung value; returns (better, peers, keep)."""
        values = self._rungs.setdefault((st.group, rung), {})
        values[trial_id] = value
        peers = len(values)
        if peers < self.min_trials_per_rung:
            return 0, peers, peers
        # with a margin, the values within it of the best continue: ``better >= keep`` iff value > best + margin
        keep = self._keep(values)
        better = sum(1 for v in values.values() if v < value)
        return better, peers, keep

    def _advance(
        self, trial_id: str, st: _TrialState, flops: float, tokens: float, loss: float, *, decide: bool
    ) -> list[RungDecision]:
        """Feed one report; record (and, with ``decide``, judge) every rung it reaches."""
        if not (flops > 0 and tokens > 0) or st.stopped:
            return []
        if st.flops_per_token is None:
            st.flops_per_token = flops / tokens
        y = loss if (loss is not None and math.isfinite(loss)) else math.inf
        if st.last is not None and flops <= st.last[0]:
            return []  # a replayed report (a restarted worker group): already seen
        st.history.append((flops, y))
        out = []
        rungs = self.rung_flops(st.flops_per_token)
        while st.next_rung < len(rungs) and flops >= rungs[st.next_rung] * (1 - 1e-12):
            k, r = st.next_rung, rungs[st.next_rung]
            st.next_rung += 1
            value = self._rung_value(st, k, r)
            if value is None:
                continue  # the rung (or a fit point) lies before the first report: nothing brackets it
            better, peers, keep = self._record(st, trial_id, k, value)
            stop = decide and better >= keep
            d = RungDecision(rung=k, flops=r, value=value, better=better, peers=peers, keep=keep, stop=stop)
            if decide:
                st.decisions.append(d)
                out.append(d)
            if stop:
                st.stopped = True
                break
        st.last = (flops, y)
        return out

    def _rung_value(self, st: _TrialState, k: int, r: float) -> float | None:
        """The value a trial is judged on at rung ``k`` (``r`` FLOPs), from its reports up to the first
        one at or past ``r`` (``st.history``); ``None`` when a point it needs precedes the first report.

        ``loss_at_rung``: the loss interpolated at ``r``. ``predicted_final``: the loss interpolated
        at ``q * r`` for each ``q`` of ``fit_fractions`` (fixed fractions of the rung, so the points do
        not depend on the reporting cadence), extrapolated to the budget, ``r / fractions[k]``, by
        :func:`predict_final_log_linear`.
        """
        if self.rule == "loss_at_rung":
            return curve_at(st.history, r)
        ys = [curve_at(st.history, q * r) for q in self.fit_fractions]
        known = [y for y in ys if y is not None]
        if len(known) < len(ys):
            return None
        return predict_final_log_linear(self.fit_fractions, known, 1.0 / self.fractions[k])

    def held(self, trial_id: str) -> bool:
        """Mode ``"pause"``: a restored trial that must not restart yet (it waits at a rung, waits to be
        resumed, or is to be pruned)."""
        st = self._trials.get(trial_id)
        return trial_id in self.waiting or trial_id in self.to_resume or (st is not None and st.stopped)

    # ---- mode "pause": each rung waits for its whole batch size (module docstring) ---------------------

    def add_member(self, trial_id: str, group: Any, *, ended: bool = False) -> None:
        """Count a trial as one of its batch size's ``trials_per_group`` (Tune: ``on_trial_add``)."""
        members = self._members.setdefault(group, [])
        if trial_id not in members:
            members.append(trial_id)
        self._state(trial_id, group)
        if ended:
            self._ended.add(trial_id)

    def end(self, trial_id: str) -> None:
        """A trial will report nothing more (finished, failed, removed): it no longer holds up a rung."""
        self._ended.add(trial_id)
        self.waiting.pop(trial_id, None)
        if trial_id in self.to_resume:
            self.to_resume.remove(trial_id)
        if self.mode == "pause":
            self._pump()

    def report(self, trial_id: str, group: Any, flops: float, tokens: float, loss: float) -> str:
        """Mode ``"pause"``: feed one report; returns ``"continue"``, ``"pause"`` or ``"stop"``.

        Decisions this report completes for *other* (paused) trials land in :attr:`to_resume` and
        :attr:`to_prune`.
        """
        st = self._state(trial_id, group)
        self.add_member(trial_id, group)
        if trial_id in self.to_resume:  # it reports, so it runs: resumed
            self.to_resume.remove(trial_id)
        if st.stopped or trial_id in self._ended:  # ended: restarted by a resume that Tune's snapshot predates
            return "stop"
        if not (flops > 0 and tokens > 0):
            return "pause" if trial_id in self.waiting else "continue"
        self._append(st, flops, tokens, loss)
        if tokens >= self.budget_tokens * (1 - 1e-9):  # its whole budget: done, its rung values still count
            while self._walk(trial_id):
                self.waiting.pop(trial_id)
            self._ended.add(trial_id)
        elif trial_id not in self.waiting:
            self._walk(trial_id)
        self._pump()
        if st.stopped:
            if trial_id in self.to_prune:
                self.to_prune.remove(trial_id)
            return "stop"
        if trial_id in self.waiting:
            return "pause"
        if trial_id in self.to_resume:
            self.to_resume.remove(trial_id)
        return "continue"

    def force_lowest(self) -> bool:
        """Decide the lowest rung that a trial waits for on the values it has (nothing else can arrive).

        Returns False when no trial waits."""
        if not self.waiting:
            return False
        g, k = min(((self._trials[t].group, r) for t, r in self.waiting.items()), key=lambda gk: gk[1])
        log.warning(
            "deciding rung %d of %s=%s on %d of %s trial(s): no other trial can reach it",
            k,
            self.group_by,
            g,
            len(self._rungs.get((g, k), {})),
            self.trials_per_group,
        )
        self._decide_rung(g, k)
        self._pump()
        return True

    def _walk(self, trial_id: str) -> bool:
        """Record the rungs a trial's reports cover, up to the first it must wait at; True if it waits."""
        st = self._trials[trial_id]
        if st.last is None or st.stopped or st.flops_per_token is None:
            return False
        rungs = self.rung_flops(st.flops_per_token)
        while st.next_rung < len(rungs) and st.last[0] >= rungs[st.next_rung] * (1 - 1e-12):
            k = st.next_rung
            st.next_rung += 1
            value = self._rung_value(st, k, rungs[k])
            if value is None:
                self._skipped.add((st.group, k, trial_id))
                continue
            self._rungs.setdefault((st.group, k), {})[trial_id] = value
            if (st.group, k) in self._decided:  # a late arrival (a retried trial): decided on arrival
                if self._judge(trial_id, k).stop:
                    return False
                continue
            self.waiting[trial_id] = k
            return True
        return False

    def _complete(self, group: Any, k: int) -> bool:
        members = self._members.get(group, [])
        if len(members) < (self.trials_per_group or 0):
            return False
        values = self._rungs.get((group, k), {})
        return all(t in values or t in self._ended or (group, k, t) in self._skipped for t in members)

    def _pump(self) -> None:
        """Decide every complete rung, lowest first, until nothing changes."""
        while True:
            todo = sorted(
                (gk for gk in self._rungs if gk not in self._decided and self._complete(*gk)), key=lambda gk: gk[1]
            )
            if not todo:
                return
            self._decide_rung(*todo[0])

    def _decide_rung(self, group: Any, k: int) -> None:
        """Judge every trial waiting at rung ``k`` of ``group`` on all the values recorded there."""
        self._decided.add((group, k))
        values = self._rungs.get((group, k), {})
        for tid in sorted(values, key=lambda t: values[t]):
            if self.waiting.get(tid) == k and tid not in self._ended:
                self._settle(tid, k)

    def _judge(self, trial_id: str, k: int) -> RungDecision:
        """Decide a trial at rung ``k`` on the values recorded there (its own included) and record it."""
        st = self._trials[trial_id]
        values = self._rungs[(st.group, k)]
        v = values[trial_id]
        assert st.flops_per_token is not None  # set by its first report, before it reached a rung
        keep = self._keep(values)
        better = sum(1 for x in values.values() if x < v)
        d = RungDecision(
            rung=k,
            flops=self.rung_flops(st.flops_per_token)[k],
            value=v,
            better=better,
            peers=len(values),
            keep=keep,
            stop=better >= keep,
        )
        st.decisions.append(d)
        log.debug("trial %s (%s=%s): %s", trial_id, self.group_by, st.group, d.label())
        if d.stop:
            st.stopped = True
            self._ended.add(trial_id)
        return d

    def _settle(self, trial_id: str, k: int) -> None:
        """Judge a paused trial at rung ``k``: pruned where it waits, or to be resumed (or waiting again)."""
        self.waiting.pop(trial_id, None)
        if self._judge(trial_id, k).stop:
            self.to_prune.append(trial_id)
            self.pruned_while_paused[trial_id] = self.annotation(trial_id)
        elif not self._walk(trial_id):  # promoted; its reports may already cover the next rung
            self.to_resume.append(trial_id)

    def _keep(self, values: dict[str, float]) -> int:
        n = len(values)
        if n < self.min_trials_per_rung:
            return n
        if self.margin is None:
            return max(1, math.ceil(n / self.reduction_factor - 1e-9))
        best = min(values.values())
        return sum(1 for v in values.values() if v <= best + self.margin) if math.isfinite(best) else n

    def may_start(self, live_trial_ids: Sequence[str]) -> bool:
        """Mode ``"pause"``: may the searcher start another trial? Paused trials do not count as running."""
        if self.max_concurrent is None:
            return True
        running = sum(1 for t in live_trial_ids if t not in self.waiting and t not in self._ended)
        return running < self.max_concurrent

    def annotation(self, trial_id: str) -> dict[str, Any]:
        """The result keys (:data:`RESULT_KEYS`) describing this trial's decisions so far."""
        st = self._trials.get(trial_id)
        if st is None or not st.decisions:
            return {}
        out: dict[str, Any] = {"rung_decisions": ";".join(d.label() for d in st.decisions)}
        if st.stopped:
            last = st.decisions[-1]
            out.update(pruned=True, pruned_at_flops=last.flops, pruned_rung=last.rung)
        return out

    def decisions(self, trial_id: str) -> list[RungDecision]:
        st = self._trials.get(trial_id)
        return list(st.decisions) if st else []
