"""Sweep until precise (``search.precision``): after each wave of trials, refit, and while the
critical batch size's 95 % interval is wider than asked, add the trials most likely to narrow it.

A *wave* ends when every trial handed out so far has ended. Its analysis is the one ``cbs.json`` gets
(:func:`sweeps.analysis.analyze_trials` on the sweep's records). The sweep stops adding trials when

- ``met``: the headline status is ``ok``, the interval's upper/lower ratio is at most ``b_crit_ratio``, and
  no LR bracket is open (``lr_brackets_open``, :func:`sweeps.analysis.lr_scaling.open_lr_brackets`: at no
  declared target does a batch size's fastest trial sit at an end of the LRs it tried; a narrow interval on
  under-tuned LRs is not the tuned answer, and on real training it did not cover: docs/benchmarks.md,
  "Real-training coverage");
- ``max_trials``: the next wave would pass ``precision.max_trials``;
- ``nothing_to_add``: no rule below proposes a trial it has not run;
- ``no_trial_completed``: no trial of the sweep has completed (:func:`nothing_completed`: the first wave's all
  failed, diverged or were pruned): with nothing measured no rule can place a trial where it helps, and "no fit
  yet: widen the range" would spend ``max_trials`` on batch sizes that fail as the planned ones did. The sweep
  then ends ``FAILED``, "no trial completed" (``sweeps.run.finish``).

(The sweep's FLOP or wall-clock budget, or a stop signal, can also end it first: the driver says so.)

**Token reallocation** (``reallocate_tokens``, the default; measured in ``docs/benchmarks.md``, "Token
reallocation"). The first wave declares the target losses; every trial a later wave adds ends at its first
milestone at or below the lowest of them (past it, it informs no target), and the tokens it did not train stay
in the sweep's purse: a wave may spend ``trials_per_wave`` budgets plus what earlier waves saved, and
``max_trials`` counts budgets. Those tokens go first to rules 1 and 2 below.

What a wave adds (:func:`propose`), in this order (1 and 2 alternating: the first of each, then the second of
each, ...), ``trials_per_wave`` budgets in all. These are rules of thumb
aimed at what sets the interval's width and its bias on this project's own sweeps (``docs/results.md``): a
batch size whose best learning rate lies outside the LRs it tried (so its steps to target are an
overestimate), and too few batch sizes on one side of the knee. They are not an optimal experimental design.

1. **Open LR brackets** (under ``search.strategy: transfer``): a batch size whose fastest trial at some declared
   target ran at its lowest (highest) tried LR (``lr_brackets_open``) gets a probe one octave below (above)
   that LR: the optimum may lie beyond. Until every bracket is closed the sweep is not ``met``. (With no fit
   yet, rule 3's wider range comes first.)
2. **Re-runs** (token reallocation, under ``search.strategy: transfer``): a batch size the fit holds as
   censored at the lowest target, nearest the knee first (one far past it informs the fit least), first gets an LR probe an octave beyond its best trial's LR when that trial
   ran at an end of its tried LRs (a poor LR, not too few tokens, may be what kept it short); otherwise it
   runs again at its best trial's LR with twice the tokens it had (at most ``max_budget_multiple`` budgets),
   so that it enters the fit as a point, not a bound.
3. **The range**: a batch size beyond the swept range (twice the largest, half the smallest) on a side the
   interval reaches past, or where the status is ``above_range`` / ``below_range``; with no fit at all
   (too few batch sizes reached a target), both sides.
4. **A batch size between two fitted ones** (their geometric middle, rounded): one more point on the
   hyperbola, with its own errors. LR probes at a batch size already swept cannot average away an error
   its trials share (the curve's own noise, which more LRs do not change); a new batch size can.
5. **Closed brackets** (tried LRs on both sides of the fastest): a probe halfway (in log LR) between the
   fastest LR and its faster neighbour.

Within 1, 4 and 5, batch sizes nearer the current estimate of ``b_crit`` (in log distance) come first:
they set the knee. An LR within a quarter octave of one already tried at that batch size is not proposed
again.

Pure functions; :class:`sweeps.search.waves.PrecisionWaves` keeps the waves and hands out their trials.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeps.analysis.targets import TrialRecord, tokens_to_target_by_trial
from sweeps.spec.statuses import TrialStatus

__all__ = [
    "MIN_PROBE_SPACING_OCTAVES",
    "Proposal",
    "Reallocation",
    "budgets_trained",
    "interval_ratio",
    "nothing_completed",
    "precise_enough",
    "propose",
    "wave_summary",
]

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
    #: token reallocation: the loss this trial ends at, where higher than the sweep's lowest target (a probe of a
    #: bracket open only at higher targets informs none below them); None: the sweep's
    stop_at_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size_sequences": self.batch_size_sequences,
            "lr": self.lr,
            "reason": self.reason,
            "budget_multiple": self.budget_multiple,
            "stop_at_loss": self.stop_at_loss,
        }


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


def _rerun_proposals(
    analysis: dict[str, Any], trials: list[TrialRecord], realloc: Reallocation, centre_b: float
) -> list[Proposal]:
    """Rule 2: each batch size the fit holds as censored at the lowest target (``analysis['targets']``'s entry
    at ``realloc.lowest_target``), nearest ``centre_b`` (the knee) first. Its best trial is the one with the lowest loss at the most
    tokens all its trials reached. When that trial ran at the highest (lowest) LR the batch size tried and the LR
    an octave above (below) it is untried, that LR is probed first, with as many budgets as its longest trial;
    otherwise the best trial is re-run (its LR; the same seed, so the same curve as far as that trial went,
    :mod:`workloads.train.determinism`) with twice the most tokens any of its trials trained, rounded to budgets
    (at most ``max_budget_multiple``). Its early part repeats the trial: a re-run from scratch, not a
    continuation from its checkpoint."""
    entry = min(
        (t for t in analysis.get("targets") or [] if t.get("target_loss") is not None),
        key=lambda t: abs(float(t["target_loss"]) - realloc.lowest_target),
        default=None,
    )
    if entry is None:
        return []
    out = []
    for c in sorted(
        entry.get("censored_points") or [],
        key=lambda c: (abs(math.log(int(c["batch_size_sequences"]) / centre_b)), -int(c["batch_size_sequences"])),
    ):
        b = int(c["batch_size_sequences"])
        ts = [
            t
            for t in trials
            if t.batch_size_sequences == b
            and t.tokens
            and t.hyperparameters.get("lr")
            and t.val_loss
            and math.isfinite(t.val_loss[-1])
        ]
        if not ts:
            continue  # every trial diverged: a longer run would not reach it
        common = min(max(t.tokens) for t in ts)
        best = min(ts, key=lambda t: (_loss_at(t, common), t.trial_id))
        had = max(1, round(max(max(t.tokens) for t in ts) / realloc.budget_tokens))
        lr, lrs = (
            float(best.hyperparameters["lr"]),
            sorted(
                {
                    float(t.hyperparameters["lr"])
                    for t in trials
                    if t.batch_size_sequences == b and t.hyperparameters.get("lr")
                }
            ),
        )

        def far(x):
            return all(abs(math.log2(x / y)) >= MIN_PROBE_SPACING_OCTAVES for y in lrs)

        side = "highest" if lr >= lrs[-1] and far(2 * lr) else "lowest" if lr <= lrs[0] and far(lr / 2) else None
        if side is not None:
            out.append(
                Proposal(
                    b,
                    2 * lr if side == "highest" else lr / 2,
                    f"censored at the lowest target ({realloc.lowest_target:.4f}), its best trial at its "
                    f"{side} LR: probe an octave {'above' if side == 'highest' else 'below'} before more "
                    "tokens",
                    budget_multiple=had,
                )
            )
        elif 2 * had <= realloc.max_budget_multiple:
            out.append(
                Proposal(
                    b,
                    float(best.hyperparameters["lr"]),
                    f"censored at the lowest target ({realloc.lowest_target:.4f}): its best trial's LR "
                    f"again, with {2 * had}x the budget",
                    budget_multiple=2 * had,
                )
            )
    return out


def _loss_at(t: TrialRecord, tokens: float) -> float:
    """A trial's loss at its last milestone at or before ``tokens`` (its first milestone's if none is; ``inf`` if
    non-finite)."""
    seen = [l for tok, l in zip(t.tokens, t.val_loss) if tok <= tokens + 0.5] or t.val_loss[:1]
    return seen[-1] if math.isfinite(seen[-1]) else math.inf


def budgets_trained(trials: list[TrialRecord], budget_tokens: int, n_seeds: int) -> float:
    """Tokens the trials trained (each its last milestone), in budgets (``budget_tokens``) per seed: token
    reallocation's count of compute (``max_trials``, each wave's ``budgets_spent``)."""
    return sum(max(t.tokens) for t in trials if t.tokens) / budget_tokens / n_seeds


def interval_ratio(ci: list[float | None] | None) -> float:
    """Upper over lower end of an interval ``[lo, hi]``; ``inf`` when missing, unbounded or ``lo <= 0``."""
    if not ci or ci[0] is None or ci[1] is None or ci[0] <= 0:
        return math.inf
    return float(ci[1]) / float(ci[0])


def nothing_completed(trials: list[TrialRecord]) -> bool:
    """Whether no trial has completed (status ``COMPLETED``; failed, diverged, pruned and stopped ones do not
    count): then no wave is added (``no_trial_completed``, the module docstring)."""
    return not any(t.status == TrialStatus.COMPLETED for t in trials)


def precise_enough(analysis: dict[str, Any], b_crit_ratio: float) -> bool:
    """Whether the headline ``b_crit`` is ``ok`` with a 95 % interval no wider than ``b_crit_ratio`` (upper/lower),
    measured with every LR bracket closed (no ``lr_brackets_open``)."""
    return (
        analysis.get("status") == "ok"
        and interval_ratio(analysis.get("b_crit_ci")) <= b_crit_ratio
        and not analysis.get("lr_brackets_open")
    )


def wave_summary(analysis: dict[str, Any], n_trials: int) -> dict[str, Any]:
    """One line of ``cbs.json``'s ``precision.waves``: ``{trials, b_crit, b_crit_ci, ratio, status, target_loss,
    lr_brackets_open}`` (``ratio`` None where unbounded; ``lr_brackets_open``: how many (batch size, side) brackets
    were open)."""
    ratio = interval_ratio(analysis.get("b_crit_ci"))
    return {
        "trials": n_trials,
        "b_crit": analysis.get("b_crit"),
        "b_crit_ci": analysis.get("b_crit_ci"),
        "ratio": ratio if math.isfinite(ratio) else None,
        "status": analysis.get("status"),
        "target_loss": analysis.get("target_loss"),
        "lr_brackets_open": len(analysis.get("lr_brackets_open") or []),
    }


def _tried_lrs(trials: list[TrialRecord]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if lr:
            out.setdefault(t.batch_size_sequences, []).append(float(lr))
    return out


def _range_proposals(
    analysis: dict[str, Any], batch_sizes: list[int], allowed: Callable[[int], bool], *, fitted: list[int]
) -> list[Proposal]:
    """Rule 3. Upwards only while the largest swept batch size is in the fit (one that already misses the
    target would not be joined by a larger one), downwards likewise."""
    lo_b, hi_b = min(batch_sizes), max(batch_sizes)
    ci, status = analysis.get("b_crit_ci"), analysis.get("status")
    no_fit = analysis.get("b_crit") is None and status not in ("above_range", "below_range")
    up = no_fit or (hi_b in fitted and (status == "above_range" or bool(ci and (ci[1] is None or ci[1] > hi_b))))
    down = no_fit or (lo_b in fitted and (status == "below_range" or bool(ci and (ci[0] is None or ci[0] < lo_b))))
    out = []
    if up and allowed(2 * hi_b):
        out.append(
            Proposal(
                2 * hi_b,
                None,
                f"the interval reaches above the largest batch size ({hi_b})"
                if not no_fit
                else "no fit yet: widen the range",
            )
        )
    if down and lo_b >= 2 and allowed(lo_b // 2):
        out.append(
            Proposal(
                lo_b // 2,
                None,
                f"the interval reaches below the smallest batch size ({lo_b})"
                if not no_fit
                else "no fit yet: widen the range",
            )
        )
    return out


def _midpoint_proposals(
    batch_sizes: list[int], fitted: list[int], centre_b: float, allowed: Callable[[int], bool]
) -> list[Proposal]:
    """Rule 4 of the module docstring: the geometric middle of each two neighbouring fitted batch sizes
    (rounded; only where it differs from both and is allowed), nearest the knee first."""
    fit = sorted(int(b) for b in fitted)
    out = []
    for lo, hi in zip(fit, fit[1:]):
        mid = int(round(math.sqrt(lo * hi)))
        if lo < mid < hi and mid not in batch_sizes and allowed(mid):
            out.append(Proposal(mid, None, f"a batch size between {lo} and {hi}: one more point on the hyperbola"))
    return sorted(out, key=lambda p: (abs(math.log(p.batch_size_sequences / centre_b)), p.batch_size_sequences))


def _bracket_proposals(analysis: dict[str, Any], trials: list[TrialRecord], centre_b: float) -> list[Proposal]:
    """Rule 1 of the module docstring: a probe an octave beyond each open bracket (``analysis['lr_brackets_open']``),
    nearest the knee first; none within :data:`MIN_PROBE_SPACING_OCTAVES` of an LR already tried."""
    tried = _tried_lrs(trials)
    out = []
    for e in sorted(
        analysis.get("lr_brackets_open") or [],
        key=lambda e: (abs(math.log(e["batch_size_sequences"] / centre_b)), e["batch_size_sequences"], e["side"]),
    ):
        b, lr = int(e["batch_size_sequences"]), e.get("fastest_lr")
        if not lr:
            continue
        probe = lr * 2 if e["side"] == "above" else lr / 2
        if all(abs(math.log2(probe / x)) >= MIN_PROBE_SPACING_OCTAVES for x in tried.get(b, [])):
            out.append(
                Proposal(
                    b,
                    probe,
                    f"its fastest trial at target(s) {', '.join(f'{t:.4g}' for t in e['targets'])} "
                    f"ran at its {'highest' if e['side'] == 'above' else 'lowest'} LR: probe an "
                    f"octave {e['side']}",
                    stop_at_loss=min(e["targets"]),
                )
            )
    return out


def _lr_proposals(
    trials: list[TrialRecord], target: float, fitted: list[int], centre_b: float
) -> tuple[list[Proposal], list[Proposal]]:
    """Rule 5 of the module docstring (and, for an analysis without ``lr_brackets_open``, rule 1 at the headline
    target), nearest the knee first: ``(open brackets, closed ones)``."""
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

        def far(lr):
            return all(abs(math.log2(lr / x)) >= MIN_PROBE_SPACING_OCTAVES for x in tried.get(b, []))

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


def propose(
    analysis: dict[str, Any],
    trials: list[TrialRecord],
    n: int,
    *,
    allowed_batch_size: Callable[[int], bool],
    lr_probes: bool = True,
    reallocation: Reallocation | None = None,
) -> list[Proposal]:
    """The next wave's trials (at most ``n``), by the rules of the module docstring.

    Args:
        analysis: the wave's analysis (``cbs.json``'s content: ``status``, ``b_crit``, ``b_crit_ci``,
            ``target_loss``, ``fitted_batch_sizes``).
        trials: the sweep's records so far.
        n: trials per wave.
        allowed_batch_size: whether a new batch size may be swept (the spec's limits and its token budget).
        lr_probes: whether rules 2 and 4 apply (``search.strategy: transfer``, where a probe runs at its LR;
            under ``independent`` a batch size's LRs are its study's to sample, so only batch sizes are added).
        reallocation: token reallocation (with ``lr_probes``): rule 2, re-runs of censored batch sizes.

    Returns:
        up to ``n`` proposals: open-bracket probes first, then re-runs, range extensions, batch sizes between
        fitted ones and probes inside closed brackets; empty if nothing is left to try.
    """
    batch_sizes = sorted({t.batch_size_sequences for t in trials})
    if not batch_sizes or n <= 0:
        return []
    target, fitted = analysis.get("target_loss"), analysis.get("fitted_batch_sizes") or []
    b_crit = analysis.get("b_crit")
    centre_b = (
        b_crit
        if b_crit and b_crit > 0
        else math.sqrt(min(fitted) * max(fitted))
        if fitted
        else math.sqrt(batch_sizes[0] * batch_sizes[-1])
    )
    range_ = _range_proposals(
        analysis, batch_sizes, lambda b: b not in batch_sizes and allowed_batch_size(b), fitted=[int(b) for b in fitted]
    )
    no_fit = b_crit is None and analysis.get("status") not in ("above_range", "below_range")
    out = range_ if no_fit else []  # without a fit, more batch sizes first: no bracket is judged at a fit's targets
    reruns = (
        _rerun_proposals(analysis, trials, reallocation, centre_b) if reallocation is not None and lr_probes else []
    )
    brackets = _bracket_proposals(analysis, trials, centre_b) if lr_probes else []
    out += [p for pair in itertools.zip_longest(brackets, reruns) for p in pair if p is not None]
    out += [] if no_fit else range_
    if target is not None and fitted:
        open_, closed = _lr_proposals(trials, float(target), list(fitted), centre_b) if lr_probes else ([], [])
        if "lr_brackets_open" in analysis:
            open_ = []  # rule 1 above, at every declared target
        out += open_ + _midpoint_proposals(batch_sizes, list(fitted), centre_b, allowed_batch_size) + closed
    seen: set[tuple[int, float | None]] = set()
    unique = []
    for p in out:  # one probe per (batch size, LR), the first reason kept
        key = (p.batch_size_sequences, None if p.lr is None else round(math.log2(p.lr), 6))
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique[:n]
