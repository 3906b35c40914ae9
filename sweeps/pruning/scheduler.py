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

Decisions reach the rest of the sweep through the result dict: Ray Tune hands a scheduler a flattened
*copy* of each result (Ray 2.60, ``TuneController._process_trial_result``), so keys set there reach
neither ``trial.last_result`` nor ``result.json`` nor ``Searcher.on_trial_complete``. The callbacks,
called right after the scheduler with the original result, may edit it in place: the scheduler's
:meth:`EqualComputeScheduler.annotator` is a Tune callback that adds ``pruned`` (True on the result
that stopped the trial), ``pruned_at_flops``, ``pruned_rung`` and ``rung_decisions`` (every decision
so far, on every later result). It must come first in ``RunConfig.callbacks``; the scheduler refuses
to run without it.

Stopping a trial that wraps a Ray Train run: its actor cannot be reused (``reuse_actors=True``
fails in ``reset_config``, whose thread is still inside ``TorchTrainer.fit()``), so it exits and
kills its Train controller in the middle of ``fit()``.
In Ray 2.60 that can leave the workers' placement group behind (a controller that was restarting
its worker group when it died creates a group its ``PlacementGroupCleaner`` never hears of; the
cleaner also needs a dashboard), and the next trials then wait forever for those CPUs.
:class:`PlacementGroupReaper` is the Tune callback that removes them.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ray.tune import Callback
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from sweeps.spec import SweepSpec

__all__ = [
    "EqualComputeScheduler",
    "PruningAnnotator",
    "PlacementGroupReaper",
    "RungDecision",
    "rung_fractions",
    "rung_gate_key",
    "interpolate",
    "curve_at",
    "predict_final_log_linear",
    "RULES",
    "MODES",
    "RESULT_KEYS",
]

log = logging.getLogger(__name__)

#: the rung rules (``pruning.rule``): what a trial is judged on at a rung (module docstring)
RULES = ("loss_at_rung", "predicted_final")

#: how a trial waits for its rung's decision (``pruning.mode``, module docstring)
MODES = ("stop", "pause")

#: result keys written by :class:`PruningAnnotator` (flat, so Tune's flattening leaves them as they are)
RESULT_KEYS = ("pruned", "pruned_at_flops", "pruned_rung", "rung_decisions")


def rung_gate_key(prefix: str, trial_id: str) -> str:
    """The Ray KV key under which the scheduler lets a trial's workers go on past a rung (mode ``pause``)."""
    return f"{prefix}/{trial_id}"


def rung_fractions(grace_fraction: float, reduction_factor: float) -> list[float]:
    """Rung positions as fractions of the trial budget: ``g * r**k`` for ``k = 0, 1, ...`` while below 1.

    >>> rung_fractions(0.25, 2.0)
    [0.25, 0.5]
    """
    if not 0 < grace_fraction < 1:
        raise ValueError(f"grace_fraction must be in (0, 1), got {grace_fraction}")
    if reduction_factor <= 1:
        raise ValueError(f"reduction_factor must be > 1, got {reduction_factor}")
    out, f = [], grace_fraction
    while f < 1 - 1e-9:
        out.append(f)
        f *= reduction_factor
    return out


def interpolate(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """Linear interpolation of ``y`` at ``x`` between ``(x0, y0)`` and ``(x1, y1)`` (``x0 < x <= x1``).

    A non-finite end (a diverged evaluation) gives ``inf``: the worst value.
    """
    if not (math.isfinite(y0) and math.isfinite(y1)):
        return math.inf
    if x >= x1:
        return y1
    w = (x - x0) / (x1 - x0)
    return y0 + w * (y1 - y0)


def curve_at(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """A reported curve's value at ``x`` FLOPs, interpolated linearly between the bracketing reports.

    Args:
        points: ``(flops, loss)`` reports, increasing in FLOPs (``inf`` for a diverged evaluation).
        x: the FLOPs to read the curve at, at most the last report's.

    Returns ``None`` when ``x`` lies before the first report (nothing brackets it); a value at or within
    a relative ``1e-12`` of a report is that report's; a bracket with a non-finite end gives ``inf``.
    """
    if not points or x < points[0][0] * (1 - 1e-12):
        return None
    if x <= points[0][0] * (1 + 1e-12):
        return points[0][1] if math.isfinite(points[0][1]) else math.inf
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1 * (1 + 1e-12):
            return interpolate(x0, y0, x1, y1, min(x, x1))
    raise ValueError(f"{x} FLOPs lies past the last report ({points[-1][0]})")


def predict_final_log_linear(fractions: Sequence[float], losses: Sequence[float], horizon: float) -> float:
    """Predicted loss at ``horizon``: the least-squares line ``L = a + s * ln(C)`` through the points.

    Args:
        fractions: ``n >= 2`` distinct compute positions of the points, in any unit (here fractions of
            the rung's FLOPs, so the fit does not depend on the workload's FLOP convention).
        losses: the loss at each position (``n`` values, nats/token).
        horizon: where to evaluate the line, in the unit of ``fractions`` (the budget over the rung's
            FLOPs, ``1 / rung fraction``).

    The line in log-compute is the ``c -> 0`` limit of the power law ``L = a + b * C**-c`` (the
    form of the scaling-law fits, Kaplan et al. 2020, arXiv 2001.08361): it carries the loss decrease
    per e-fold of compute observed over the fitted window on to the budget, never flattening. That
    favours the curves that are still falling at the rung, which is what offsets the short-horizon
    bias of a constant learning rate (docs/search_efficiency.md). Any non-finite loss gives ``inf``.
    Ordinary least squares, closed form: ``s = cov(u, L) / var(u)`` with ``u = ln(fraction)``.
    """
    if len(fractions) != len(losses) or len(fractions) < 2:
        raise ValueError("need at least 2 points, as many losses as fractions")
    if not all(math.isfinite(y) for y in losses):
        return math.inf
    u = [math.log(f) for f in fractions]
    um, ym = sum(u) / len(u), sum(losses) / len(losses)
    var = sum((x - um) ** 2 for x in u)
    if var <= 0:
        raise ValueError(f"fractions must be distinct, got {list(fractions)}")
    s = sum((x - um) * (y - ym) for x, y in zip(u, losses)) / var
    return ym + s * (math.log(horizon) - um)


@dataclass(frozen=True)
class RungDecision:
    """One stop/continue decision at one rung.

    Attributes:
        rung: rung index (0 is the grace rung).
        flops: the rung's budget in training FLOPs.
        value: the value compared (lower is better; ``inf`` if diverged): with ``loss_at_rung``, the
            trial's ``val_loss`` interpolated at ``flops``; with ``predicted_final``, its predicted
            ``val_loss`` at the budget (:func:`predict_final_log_linear`).
        better: values recorded at this rung for this batch size that are strictly better.
        peers: values recorded at this rung for this batch size, this one included.
        keep: how many may be better before the trial stops (``peers`` while fewer than
            ``min_trials_per_rung`` peers: nobody is stopped yet; with a ``margin``, the number of
            recorded values within ``margin`` of the best).
        stop: the decision.
    """

    rung: int
    flops: float
    value: float
    better: int
    peers: int
    keep: int
    stop: bool

    def label(self) -> str:
        """``r1@5e+12:stop(rank 2/2,keep 1)``: rung, its FLOPs, the decision, rank among peers, how many continue."""
        what = "stop" if self.stop else "continue"
        return f"r{self.rung}@{self.flops:.4g}:{what}(rank {self.better + 1}/{self.peers},keep {self.keep})"


@dataclass
class _TrialState:
    group: Any
    flops_per_token: float | None = None
    last: tuple[float, float] | None = None  # (flops, val_loss) of the latest report
    history: list[tuple[float, float]] = field(default_factory=list)  # every (flops, val_loss) report, in order
    next_rung: int = 0
    decisions: list[RungDecision] = field(default_factory=list)
    stopped: bool = False


class EqualComputeScheduler(FIFOScheduler):
    """Successive halving with rungs in FLOPs, within each batch size (module docstring).

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
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "pause" and not (trials_per_group and trials_per_group >= 1):
            raise ValueError(f"mode 'pause' needs trials_per_group >= 1 (the trials per batch size), got {trials_per_group}")
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
        self._metric = metric
        self._mode = "min"
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
        self.pruned_while_paused: dict[str, dict[str, Any]] = {}  # trial id -> its annotation
        self.state_path: str | None = None  # if set: pruned_while_paused is written there (JSON) on each change
        # if set: after each CONTINUE, the Ray KV value under rung_gate_key(gate_prefix, trial) becomes the
        # reported tokens; a worker waits at a rung for it (workloads._ray_adapter), so that a trial to be
        # paused or pruned never trains on while Tune stops it
        self.gate_prefix: str | None = None
        self._limiter_checked = False

    @classmethod
    def from_spec(cls, spec: SweepSpec) -> "EqualComputeScheduler":
        p = spec.pruning
        return cls(budget_tokens=spec.budget_tokens, grace_fraction=p.grace_fraction,
                   reduction_factor=p.reduction_factor, min_trials_per_rung=p.min_trials_per_rung,
                   rule=p.rule, fit_fractions=p.fit_fractions, margin=p.margin, mode=p.mode,
                   trials_per_group=spec.search.trials_per_batch_size * len(spec.seeds),
                   max_concurrent=spec.resources.max_concurrent_trials)

    def annotator(self) -> "PruningAnnotator":
        """The Tune callback that writes this scheduler's decisions into the results (put it first)."""
        return PruningAnnotator(self)

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

    def _advance(self, trial_id: str, st: _TrialState, flops: float, tokens: float, loss: float, *,
                 decide: bool) -> list[RungDecision]:
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
        if any(y is None for y in ys):
            return None
        return predict_final_log_linear(self.fit_fractions, ys, 1.0 / self.fractions[k])

    def observe(self, trial_id: str, group: Any, tokens: Sequence[float], flops: Sequence[float],
                losses: Sequence[float], *, ended: bool = False, pruning: dict[str, Any] | None = None) -> None:
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
        if pruned:
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
        log.warning("deciding rung %d of %s=%s on %d of %s trial(s): no other trial can reach it",
                    k, self.group_by, g, len(self._rungs.get((g, k), {})), self.trials_per_group)
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
            todo = sorted((gk for gk in self._rungs if gk not in self._decided and self._complete(*gk)),
                          key=lambda gk: gk[1])
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
        keep = self._keep(values)
        better = sum(1 for x in values.values() if x < v)
        d = RungDecision(rung=k, flops=self.rung_flops(st.flops_per_token)[k], value=v, better=better,
                         peers=len(values), keep=keep, stop=better >= keep)
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

    # ---- TrialScheduler -------------------------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        return True  # the metric is fixed (the loss), whatever TuneConfig says

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if not self._annotator_ready:
            raise RuntimeError(
                "EqualComputeScheduler: its annotator is not in RunConfig.callbacks; without it pruned "
                "trials reach neither the searcher, the tracker nor result.json as PRUNED. Pass "
                "callbacks=[scheduler.annotator(), ...].")
        group = trial.config.get(self.group_by)
        loss = result.get(self._metric)
        if self.mode == "pause":
            return self._on_result_pause(tune_controller, trial, group, result, loss)
        st = self._state(trial.trial_id, group)
        made = self._advance(trial.trial_id, st, float(result.get("flops") or 0.0),
                             float(result.get("tokens_seen") or 0.0),
                             float(loss) if loss is not None else math.nan, decide=True)
        for d in made:
            log.debug("trial %s (%s=%s): %s", trial.trial_id, self.group_by, group, d.label())
        if made and made[-1].stop:
            result.update(self.annotation(trial.trial_id))  # the flat copy: for readers of this dict
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def _on_result_pause(self, tune_controller, trial, group, result: dict, loss) -> str:
        what = self.report(trial.trial_id, group, float(result.get("flops") or 0.0),
                           float(result.get("tokens_seen") or 0.0), float(loss) if loss is not None else math.nan)
        self._prune_paused(tune_controller)
        if what == "stop":
            result.update(self.annotation(trial.trial_id))
            return TrialScheduler.STOP
        if what == "pause":
            # Ray Train keeps the checkpoint of this milestone; Tune's own checkpoint of a function
            # trainable holds nothing more, so none is taken (the trial resumes through Ray Train's)
            if trial.status == "RUNNING":
                tune_controller.pause_trial(trial, should_checkpoint=False)
            return TrialScheduler.NOOP
        self._let_go(trial.trial_id, float(result.get("tokens_seen") or 0.0))
        return TrialScheduler.CONTINUE

    def _let_go(self, trial_id: str, tokens: float) -> None:
        if self.gate_prefix:
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(rung_gate_key(self.gate_prefix, trial_id), repr(tokens).encode(), overwrite=True)

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
            t.last_result.update(self.pruned_while_paused.get(tid) or self.annotation(tid))  # read by the tracker, the driver
            tune_controller.stop_trial(t)
        if self.state_path:
            import json
            import os

            tmp = self.state_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.pruned_while_paused, f)
            os.replace(tmp, self.state_path)

    def on_trial_add(self, tune_controller, trial) -> None:
        if self.mode == "pause" and not self._limiter_checked:
            self._limiter_checked = True
            alg = getattr(tune_controller, "search_alg", None)
            while alg is not None:
                if type(alg).__name__ == "ConcurrencyLimiter" or getattr(alg, "max_concurrent", 0):
                    raise RuntimeError(
                        "EqualComputeScheduler(mode='pause'): Tune's max_concurrent_trials (ConcurrencyLimiter) "
                        "counts paused trials as running, so the sweep would wait forever; leave it unset and give "
                        "the searcher the scheduler's may_start gate (BatchSizeSearcher.scheduler)")
                alg = getattr(alg, "searcher", None)
        if self.mode == "pause":
            if trial.status == "PENDING" and self.held(trial.trial_id):
                # a resumed sweep (restore_decisions): Tune restarts every unfinished trial; one that waits at a
                # rung stays paused until its rung is decided (restarted, it would train on past the rung)
                trial.set_status("PAUSED")
            self.add_member(trial.trial_id, trial.config.get(self.group_by),
                            ended=trial.status in ("TERMINATED", "ERROR"))

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
        active = [t for t in trials if t.status in ("RUNNING", "PENDING")]
        if not active and not self.to_resume and self.waiting and tune_controller.search_alg.is_finished():
            # nothing can complete a waiting rung any more: decide it on what it has
            self.force_lowest()
            self._prune_paused(tune_controller)
        by_id = {t.trial_id: t for t in trials}
        running = sum(1 for t in trials if t.status == "RUNNING")
        for tid in self.to_resume:
            t = by_id.get(tid)
            if t is not None and t.status == "PAUSED" and (self.max_concurrent is None or running < self.max_concurrent):
                return t
        for t in trials:
            if t.status == "PENDING":
                return t
        return None

    def debug_string(self) -> str:
        stopped = sum(1 for s in self._trials.values() if s.stopped)
        return (f"EqualComputeScheduler: rungs at {[round(f, 4) for f in self.fractions]} of the trial budget "
                f"(FLOPs), per {self.group_by}; {stopped} trial(s) pruned")


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



class PlacementGroupReaper(Callback):
    """Removes this job's placement groups whose creating actor is dead.

    A placement group created by an actor (a Ray Train controller) is only usable by that actor's
    workers, which die with it; Ray keeps such a group until the job ends. Pruned trials leave them
    (module docstring). Checked at most every ``interval_s`` seconds of the Tune loop.
    """

    def __init__(self, interval_s: float = 2.0):
        self.interval_s = interval_s
        self._last = 0.0
        self.removed: list[str] = []

    def on_step_begin(self, iteration, trials, **info):
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self.reap()

    def reap(self) -> int:
        """Remove every orphaned placement group of this job now; returns how many."""
        import ray
        from ray._private.state import state
        from ray.core.generated import gcs_pb2
        from ray.util.placement_group import PlacementGroup

        if not ray.is_initialized():
            return 0
        job = ray.get_runtime_context().get_job_id()
        nil = ray.ActorID.nil().binary()
        n = 0
        for raw in state._connect_and_get_accessor().get_placement_group_table():
            pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
            orphan = (pg.state in (gcs_pb2.PlacementGroupTableData.CREATED, gcs_pb2.PlacementGroupTableData.PENDING)
                      and not pg.is_detached and pg.creator_actor_dead and pg.creator_actor_id not in (b"", nil)
                      and pg.creator_job_id.hex() == job)
            if orphan:
                pg_id = ray.PlacementGroupID(pg.placement_group_id)
                ray.util.remove_placement_group(PlacementGroup(pg_id))
                self.removed.append(pg_id.hex())
                log.warning("removed placement group %s: its Ray Train controller is gone (trial finished or stopped)", pg_id.hex())
                n += 1
        return n
