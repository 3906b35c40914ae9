"""Sweep until precise (``search.precision``, issue 27): after each wave of trials, refit, and while the
critical batch size's 95 % interval is wider than asked, add the trials most likely to narrow it.

A *wave* ends when every trial handed out so far has ended. Its analysis is the one ``cbs.json`` gets
(:func:`sweeps.analysis.analyze_trials` on the sweep's records). The sweep stops adding trials when

- ``met``: the headline status is ``ok``, the interval's upper/lower ratio is at most ``b_crit_ratio``, and
  the LR search is not off-centre (``lr_search_too_narrow``: most batch sizes fastest at the same end of
  their tried LRs, :func:`sweeps.analysis.lr_scaling.lr_search_too_narrow`; a narrow interval on
  under-tuned LRs is not the tuned answer);
- ``max_trials``: the next wave would pass ``precision.max_trials``;
- ``nothing_to_add``: no rule below proposes a trial it has not run.

(The sweep's FLOP or wall-clock budget, or a stop signal, can also end it first: the driver says so.)

**Token reallocation** (``reallocate_tokens``, the default; measured in ``docs/benchmarks.md``, "Token
reallocation"). The first wave declares the target losses; every trial a later wave adds ends at its first
milestone at or below the lowest of them (past it, it informs no target), and the tokens it did not train stay
in the sweep's purse: a wave may spend ``trials_per_wave`` budgets plus what earlier waves saved, and
``max_trials`` counts budgets. Those tokens go first to rule 0 below.

What a wave adds (:func:`propose`), in this order, ``trials_per_wave`` in all. These are rules of thumb
aimed at what sets the interval's width on this project's own sweeps (``docs/results.md``): too few batch
sizes on one side of the knee, and a batch size whose best learning rate lies outside the LRs it tried
(so its steps to target are an overestimate). They are not an optimal experimental design.

0. **Re-runs** (token reallocation, under ``search.strategy: transfer``): a batch size the fit holds as
   censored at the lowest target runs again at its best trial's LR with twice the tokens it had (at most
   ``max_budget_multiple`` budgets), so that it enters the fit as a point, not a bound.
1. **The range**: a batch size beyond the swept range (twice the largest, half the smallest) on a side the
   interval reaches past, or where the status is ``above_range`` / ``below_range``; with no fit at all
   (too few batch sizes reached a target), both sides.
2. **Open LR brackets**: a batch size of the fit whose fastest trial ran at its lowest (highest) tried LR
   gets a probe one octave below (above) it: the optimum may lie beyond.
3. **A batch size between two fitted ones** (their geometric middle, rounded): one more point on the
   hyperbola, with its own errors. LR probes at a batch size already swept cannot average away an error
   its trials share (the curve's own noise, which more LRs do not change); a new batch size can.
4. **Closed brackets** (tried LRs on both sides of the fastest): a probe halfway (in log LR) between the
   fastest LR and its faster neighbour.

Within 2, 3 and 4, batch sizes nearer the current estimate of ``b_crit`` (in log distance) come first:
they set the knee. An LR within a quarter octave of one already tried at that batch size is not proposed
again.

Pure functions; :class:`sweeps.search.searcher.BatchSizeSearcher` keeps the waves and places the trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from sweeps.analysis.targets import TrialRecord, tokens_to_target_by_trial

__all__ = ["Proposal", "Reallocation", "budgets_trained", "interval_ratio", "precise_enough", "wave_summary", "propose", "MIN_PROBE_SPACING_OCTAVES"]

#: an LR probe closer than this (octaves) to an LR already tried at its batch size is not proposed
MIN_PROBE_SPACING_OCTAVES = 0.25


@dataclass(frozen=True)
class Proposal:
    """One trial (per seed) a wave adds.

    Attributes:
        batch_size_sequences: its global batch size (sequences); a new one extends the swept range.
        lr: the learning rate to probe, or None for a new batch size (its trials are placed as any batch
            size's: around the transferred centre, or by its Optuna study) or under ``independent``.
        reason: why, in words (``cbs.json``'s ``precision.waves[].added``).
    """

    batch_size_sequences: int
    lr: float | None
    reason: str
    budget_multiple: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size_sequences": self.batch_size_sequences, "lr": self.lr, "reason": self.reason,
                "budget_multiple": self.budget_multiple}


@dataclass(frozen=True)
class Reallocation:
    """Token reallocation's side of :func:`propose` (``search.precision.reallocate_tokens``).

    Attributes:
        lowest_target: the lowest target loss the first wave declared (nats): every later trial ends there.
        budget_tokens: the spec's token budget per trial (a re-run's is a multiple of it).
        max_budget_multiple: the longest re-run, in budgets.
    """

    lowest_target: float
    budget_tokens: int
    max_budget_multiple: int


def _rerun_proposals(analysis: dict[str, Any], trials: list[TrialRecord], realloc: Reallocation) -> list[Proposal]:
    """Rule 0: each batch size the fit holds as censored at the lowest target (``analysis['targets']``'s entry
    at ``realloc.lowest_target``) is re-run at its trial with the lowest last loss (its LR; the same seed, so
    the same curve as far as that trial went, :mod:`workloads.train.determinism`) with twice the most tokens
    any of its trials trained, rounded to budgets (at most ``max_budget_multiple``), largest batch size first.
    Its early part repeats the trial: a re-run from scratch, not a continuation from its checkpoint."""
    entry = min((t for t in analysis.get("targets") or [] if t.get("target_loss") is not None),
                key=lambda t: abs(float(t["target_loss"]) - realloc.lowest_target), default=None)
    if entry is None:
        return []
    out = []
    for c in sorted(entry.get("censored_points") or [], key=lambda c: -int(c["batch_size_sequences"])):
        b = int(c["batch_size_sequences"])
        ts = [t for t in trials if t.batch_size_sequences == b and t.tokens and t.hyperparameters.get("lr")
              and t.val_loss and math.isfinite(t.val_loss[-1])]
        if not ts:
            continue  # every trial diverged: a longer run would not reach it
        best = min(ts, key=lambda t: (t.val_loss[-1], t.trial_id))
        had = max(1, round(max(max(t.tokens) for t in ts) / realloc.budget_tokens))
        if 2 * had <= realloc.max_budget_multiple:
            out.append(Proposal(b, float(best.hyperparameters["lr"]),
                                f"censored at the lowest target ({realloc.lowest_target:.4f}): its best trial's LR "
                                f"again, with {2 * had}x the budget", budget_multiple=2 * had))
    return out


def budgets_trained(trials: list[TrialRecord], budget_tokens: int, n_seeds: int) -> float:
    """Tokens the trials trained (each its last milestone), in budgets (``budget_tokens``) per seed: token
    reallocation's count of compute (``max_trials``, each wave's ``budgets_spent``)."""
    return sum(max(t.tokens) for t in trials if t.tokens) / budget_tokens / n_seeds


def interval_ratio(ci: list[float | None] | None) -> float:
    """Upper over lower end of an interval ``[lo, hi]``; ``inf`` when missing, unbounded or ``lo <= 0``."""
    if not ci or ci[0] is None or ci[1] is None or ci[0] <= 0:
        return math.inf
    return float(ci[1]) / float(ci[0])


def precise_enough(analysis: dict[str, Any], b_crit_ratio: float) -> bool:
    """Whether the headline ``b_crit`` is ``ok`` with a 95 % interval no wider than ``b_crit_ratio`` (upper/lower),
    measured on an LR search that is not off-centre (no ``lr_search_too_narrow``)."""
    return (analysis.get("status") == "ok" and interval_ratio(analysis.get("b_crit_ci")) <= b_crit_ratio
            and not analysis.get("lr_search_too_narrow"))


def wave_summary(analysis: dict[str, Any], n_trials: int) -> dict[str, Any]:
    """One line of ``cbs.json``'s ``precision.waves``: ``{trials, b_crit, b_crit_ci, ratio, status, target_loss,
    lr_search_too_narrow}`` (``ratio`` None where unbounded)."""
    ratio = interval_ratio(analysis.get("b_crit_ci"))
    return {"trials": n_trials, "b_crit": analysis.get("b_crit"), "b_crit_ci": analysis.get("b_crit_ci"),
            "ratio": ratio if math.isfinite(ratio) else None, "status": analysis.get("status"),
            "target_loss": analysis.get("target_loss"), "lr_search_too_narrow": analysis.get("lr_search_too_narrow")}


def _tried_lrs(trials: list[TrialRecord]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if lr:
            out.setdefault(t.batch_size_sequences, []).append(float(lr))
    return out


def _range_proposals(analysis: dict[str, Any], batch_sizes: list[int], allowed: Callable[[int], bool], *,
                     fitted: list[int]) -> list[Proposal]:
    """Rule 1. Upwards only while the largest swept batch size is in the fit (one that already misses the
    target would not be joined by a larger one), downwards likewise."""
    lo_b, hi_b = min(batch_sizes), max(batch_sizes)
    ci, status = analysis.get("b_crit_ci"), analysis.get("status")
    no_fit = analysis.get("b_crit") is None and status not in ("above_range", "below_range")
    up = no_fit or (hi_b in fitted and (status == "above_range" or bool(ci and (ci[1] is None or ci[1] > hi_b))))
    down = no_fit or (lo_b in fitted and (status == "below_range" or bool(ci and (ci[0] is None or ci[0] < lo_b))))
    out = []
    if up and allowed(2 * hi_b):
        out.append(Proposal(2 * hi_b, None, f"the interval reaches above the largest batch size ({hi_b})"
                            if not no_fit else "no fit yet: widen the range"))
    if down and lo_b >= 2 and allowed(lo_b // 2):
        out.append(Proposal(lo_b // 2, None, f"the interval reaches below the smallest batch size ({lo_b})"
                            if not no_fit else "no fit yet: widen the range"))
    return out


def _midpoint_proposals(batch_sizes: list[int], fitted: list[int], centre_b: float,
                        allowed: Callable[[int], bool]) -> list[Proposal]:
    """Rule 3 of the module docstring: the geometric middle of each two neighbouring fitted batch sizes
    (rounded; only where it differs from both and is allowed), nearest the knee first."""
    fit = sorted(int(b) for b in fitted)
    out = []
    for lo, hi in zip(fit, fit[1:]):
        mid = int(round(math.sqrt(lo * hi)))
        if lo < mid < hi and mid not in batch_sizes and allowed(mid):
            out.append(Proposal(mid, None, f"a batch size between {lo} and {hi}: one more point on the hyperbola"))
    return sorted(out, key=lambda p: (abs(math.log(p.batch_size_sequences / centre_b)), p.batch_size_sequences))


def _lr_proposals(trials: list[TrialRecord], target: float, fitted: list[int], centre_b: float) -> tuple[list[Proposal], list[Proposal]]:
    """Rules 2 and 4 of the module docstring, nearest the knee first: ``(open brackets, closed ones)``."""
    tokens = tokens_to_target_by_trial(trials, target)
    by_b: dict[int, list[tuple[float, float]]] = {}
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if lr and t.trial_id in tokens and t.batch_size_sequences in fitted:
            tok = tokens[t.trial_id]
            by_b.setdefault(t.batch_size_sequences, []).append((float(lr), math.inf if tok is None else tok))
    tried = _tried_lrs(trials)
    open_, closed = [], []
    for b in sorted(by_b, key=lambda b: (abs(math.log(b / centre_b)), b)):
        rows = by_b[b]
        speed: dict[float, float] = {}
        for lr, tok in rows:
            speed[lr] = min(speed.get(lr, math.inf), tok)
        lrs = sorted(speed)
        best = min(lrs, key=lambda lr: (speed[lr], lr))
        if not math.isfinite(speed[best]):
            continue  # none of its trials reached the target
        i = lrs.index(best)
        far = lambda lr: all(abs(math.log2(lr / x)) >= MIN_PROBE_SPACING_OCTAVES for x in tried.get(b, []))  # noqa: E731
        if i == 0 and far(best / 2):
            open_.append(Proposal(b, best / 2, "its fastest trial ran at its lowest LR: probe an octave below"))
        if i == len(lrs) - 1 and far(best * 2):
            open_.append(Proposal(b, best * 2, "its fastest trial ran at its highest LR: probe an octave above"))
        if 0 < i < len(lrs) - 1:  # closed: tried LRs on both sides of the fastest
            nb = min((lrs[i - 1], lrs[i + 1]), key=lambda lr: (speed[lr], lr))
            mid = math.sqrt(best * nb)
            if far(mid):
                closed.append(Proposal(b, mid, "between its fastest LR and the faster neighbour"))
    return open_, closed


def propose(analysis: dict[str, Any], trials: list[TrialRecord], n: int, *,
            allowed_batch_size: Callable[[int], bool], lr_probes: bool = True,
            reallocation: Reallocation | None = None) -> list[Proposal]:
    """The next wave's trials (at most ``n``), by the rules of the module docstring.

    Args:
        analysis: the wave's analysis (``cbs.json``'s content: ``status``, ``b_crit``, ``b_crit_ci``,
            ``target_loss``, ``fitted_batch_sizes``).
        trials: the sweep's records so far.
        n: trials per wave.
        allowed_batch_size: whether a new batch size may be swept (the spec's limits and its token budget).
        lr_probes: whether rules 2 and 4 apply (``search.strategy: transfer``, where a probe runs at its LR;
            under ``independent`` a batch size's LRs are its study's to sample, so only batch sizes are added).
        reallocation: token reallocation (with ``lr_probes``): rule 0, re-runs of censored batch sizes, first.

    Returns:
        up to ``n`` proposals, re-runs first, then range extensions; empty if nothing is left to try.
    """
    batch_sizes = sorted({t.batch_size_sequences for t in trials})
    if not batch_sizes or n <= 0:
        return []
    out = _rerun_proposals(analysis, trials, reallocation) if reallocation is not None and lr_probes else []
    out += _range_proposals(analysis, batch_sizes, lambda b: b not in batch_sizes and allowed_batch_size(b),
                           fitted=[int(b) for b in analysis.get("fitted_batch_sizes") or []])
    target, fitted = analysis.get("target_loss"), analysis.get("fitted_batch_sizes") or []
    if target is not None and fitted:
        b_crit = analysis.get("b_crit")
        centre_b = b_crit if b_crit and b_crit > 0 else math.sqrt(min(fitted) * max(fitted))
        open_, closed = _lr_proposals(trials, float(target), list(fitted), centre_b) if lr_probes else ([], [])
        out += open_ + _midpoint_proposals(batch_sizes, list(fitted), centre_b, allowed_batch_size) + closed
    return out[:n]
