"""From trials to points: a trial's record (:class:`TrialRecord`), its first crossing of a target loss,
and the selection rule (:data:`TARGET_RULE`): steps to target at a batch size is the minimum over every
trial of that batch size and seed (Zhang et al. 2024, arXiv 2410.21676, section 2; methodology note
section 11.3), read from each trial's curve, pruned and stopped trials included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweeps.errors import InvalidInput
from sweeps.spec.statuses import TrialStatus

__all__ = [
    "TARGET_RULE",
    "TARGET_RULE_GIVEN",
    "TrialRecord",
    "best_at_budget",
    "censored_points",
    "choose_targets",
    "last_tokens_by_batch",
    "steps_to_target_points",
    "tokens_to_target",
    "tokens_to_target_by_trial",
]

#: how a batch size enters the fit at a target; stated in ``cbs.json``
TARGET_RULE = (
    "steps to target at a batch size = the minimum over all its trials (completed, pruned or stopped: "
    "the curve each reported) of the first crossing, interpolated in log tokens; a batch size that no trial "
    "brings to the target within its budget enters the fit as a censored point (it needs more steps than the "
    "fewest tokens at which one of its trials was last seen above the target); the lowest automatic target lies "
    "where max(3, 70 %) of the batch sizes reach it before their last milestone, halfway in loss between the "
    "last of them's lowest loss there and its milestone before, so that no point sits on a milestone; the "
    "others are spaced evenly above it"
)
#: :data:`TARGET_RULE` when the target losses were given (fixed in the spec, or ``critbatch analyze --target``)
TARGET_RULE_GIVEN = (
    TARGET_RULE.split("; the lowest automatic target")[0] + "; the target losses were given (the spec's "
    "targets, or --target), not chosen from the curves"
)


def _first_crossing(tokens: Sequence[float], losses: Sequence[float], target: float) -> tuple[float, int] | None:
    """``(tokens at the crossing, index of the first milestone at or below target)``, or None."""
    prev_t, prev_l = None, None
    for i, (t, l) in enumerate(zip(tokens, losses)):
        if l is None or not math.isfinite(l):
            return None
        if l <= target:
            if prev_t is None or prev_l is None or prev_l == l:
                return float(t), i
            w = (prev_l - target) / (prev_l - l)
            return float(math.exp(math.log(prev_t) + w * (math.log(t) - math.log(prev_t)))), i
        prev_t, prev_l = t, l
    return None


def tokens_to_target(tokens: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """Tokens at which a loss curve first reaches ``target``.

    Interpolates linearly in ``log(tokens)`` between the last milestone above the target and the
    first one at or below it (methodology section 11.2). A curve already at or below the target at
    its first milestone returns that milestone's tokens (an upper bound). None if never reached, or
    if the curve turns non-finite (diverges) before reaching it.
    """
    hit = _first_crossing(tokens, losses, target)
    return hit[0] if hit is not None else None


@dataclass
class TrialRecord:
    """One trial as the analysis sees it: config, status and its milestone curve."""

    trial_id: str
    batch_size_sequences: int
    seed: int
    group_id: str
    status: str  # COMPLETED | DIVERGED | FAILED | PRUNED | STOPPED
    hyperparameters: dict[str, Any]
    tokens: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    b_simple: list[float | None] = field(default_factory=list)
    #: the equal-compute scheduler's annotation of its last report (``sweeps.pruning.scheduler.RESULT_KEYS``:
    #: ``rung_decisions``, and ``pruned``, ``pruned_rung``, ``pruned_at_flops`` if it was pruned); empty without pruning
    pruning: dict[str, Any] = field(default_factory=dict)
    #: bytes of optimizer state per trainable parameter, measured after the trial's first step (its first
    #: report's ``optimizer_state_bytes_per_param``); None when not reported (older sweeps, a first step that diverged)
    optimizer_state_bytes_per_param: float | None = None
    #: trainable parameters (the first report's ``trainable_params``); None when not reported (older sweeps)
    trainable_params: float | None = None
    #: a FAILED trial's error, the line that says what went wrong (``sweeps.tracking.schema.trial_error_line``:
    #: "... no space left on device while writing the checkpoint to PATH ..."); None otherwise, or not known
    error: str | None = None

    @property
    def final_loss(self) -> float | None:
        if self.status != TrialStatus.COMPLETED or not self.val_loss:
            return None
        v = self.val_loss[-1]
        return v if v is not None and math.isfinite(v) else None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRecord:
        """A record as ``trials.json`` holds it (``None`` losses, written for non-finite ones, become NaN).

        Raises:
            InvalidInput: a required field is missing or of the wrong type.
        """
        try:
            return cls(
                trial_id=str(d["trial_id"]),
                batch_size_sequences=int(d["batch_size_sequences"]),
                seed=int(d["seed"]),
                group_id=str(d.get("group_id", d["trial_id"])),
                status=str(d["status"]),
                hyperparameters=dict(d.get("hyperparameters") or {}),
                tokens=[float(x) for x in d.get("tokens") or []],
                val_loss=[float(x) if x is not None else math.nan for x in d.get("val_loss") or []],
                flops=[float(x) if x is not None else math.nan for x in d.get("flops") or []],
                b_simple=list(d.get("b_simple") or []),
                pruning=dict(d.get("pruning") or {}),
                optimizer_state_bytes_per_param=_float_or_none(d.get("optimizer_state_bytes_per_param")),
                trainable_params=_float_or_none(d.get("trainable_params")),
                error=str(d["error"]) if d.get("error") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"a trial record lacks or mistypes a field ({exc!r})") from None


def _float_or_none(x: Any) -> float | None:
    return float(x) if x is not None else None


def last_tokens_by_batch(trials: list[TrialRecord]) -> dict[int, float]:
    """Per batch size, its last milestone: the most tokens any of its trials reported (the budget)."""
    out: dict[int, float] = {}
    for t in trials:
        if t.tokens:
            out[t.batch_size_sequences] = max(out.get(t.batch_size_sequences, 0.0), max(t.tokens))
    return out


def _crossing(t: TrialRecord, target: float) -> float | None:
    """Tokens to target of one trial (its first crossing within what it trained), or None."""
    hit = _first_crossing(t.tokens, t.val_loss, target)
    return hit[0] if hit is not None else None


def tokens_to_target_by_trial(trials: list[TrialRecord], target: float) -> dict[str, float | None]:
    """``{trial id: tokens to target}`` under :data:`TARGET_RULE` (None: not reached), for every trial with a curve."""
    return {t.trial_id: _crossing(t, target) for t in trials if t.tokens}


def steps_to_target_points(
    trials: list[TrialRecord], target: float, tokens_per_sequence: float
) -> tuple[list[dict[str, Any]], list[int]]:
    """The methodology's points at one target: per (batch size, seed), the minimum over its trials.

    For each trial the tokens to target are its first crossing (:func:`tokens_to_target`), at any of its
    milestones (see :data:`TARGET_RULE`). Steps to target = tokens / (B * tokens_per_sequence).

    Returns:
        ``(points, excluded)``: points sorted by batch size then seed, each ``{batch_size_sequences,
        seed, tokens_to_target, steps_to_target, trial_id, group_id}``, with ``upper_bound: True`` where the
        fastest trial was already at or below the target at its first milestone (its steps are at most these:
        the fit takes it as an upper bound, never as an exact point); ``excluded``: batch sizes with a trial but
        no crossing (they enter the fit as censored points, :func:`censored_points`).
    """
    last = last_tokens_by_batch(trials)
    best: dict[tuple[int, int], tuple[float, TrialRecord, bool]] = {}
    for t in trials:
        if not t.tokens:
            continue
        hit = _first_crossing(t.tokens, t.val_loss, target)
        key = (t.batch_size_sequences, t.seed)
        if hit is not None and (key not in best or hit[0] < best[key][0]):
            best[key] = (hit[0], t, hit[1] == 0)
    points = [
        {
            "batch_size_sequences": b,
            "seed": s,
            "tokens_to_target": tok,
            "steps_to_target": tok / (b * tokens_per_sequence),
            "trial_id": t.trial_id,
            "group_id": t.group_id,
            **({"upper_bound": True} if bound else {}),
        }
        for (b, s), (tok, t, bound) in sorted(best.items())
    ]
    reached = {p["batch_size_sequences"] for p in points}
    return points, sorted(set(last) - reached)


def _tokens_still_above(t: TrialRecord, target: float) -> float:
    """The most tokens at which one trial that never reached ``target`` is known to have been above it: its last
    milestone (the budget for a completed trial, less for a pruned or stopped one), or ``inf`` when its curve
    turned non-finite (a diverged trial never reaches it)."""
    if any(loss is None or not math.isfinite(loss) for loss in t.val_loss):
        return math.inf
    return float(max(t.tokens))


def censored_points(trials: list[TrialRecord], target: float, tokens_per_sequence: float) -> list[dict[str, Any]]:
    """The (batch size, seed) cells with trials but no crossing of ``target``: right-censored points.

    Their steps to target are not known, only that they exceed a bound: the minimum over the cell's trials of
    the tokens each was still above the target (:func:`_tokens_still_above`: the budget for a trial that ended
    above it; a pruned or stopped trial's last milestone, which weakens the bound; a diverged trial gives none).
    Steps = tokens / (B * tokens_per_sequence), as for the points.

    Returns:
        One dict per censored cell, sorted by batch size then seed: ``{batch_size_sequences, seed,
        tokens_lower_bound, steps_lower_bound, trial_id}`` (the trial that sets the bound; ``tokens_lower_bound``
        None when every trial of the cell diverged).
    """
    cells: dict[tuple[int, int], list[TrialRecord]] = {}
    for t in trials:
        if t.tokens:
            cells.setdefault((t.batch_size_sequences, t.seed), []).append(t)
    out = []
    for (b, seed), ts in sorted(cells.items()):
        if any(_crossing(t, target) is not None for t in ts):
            continue
        bound, t_min = min(((_tokens_still_above(t, target), t) for t in ts), key=lambda x: x[0])
        finite = math.isfinite(bound)
        out.append(
            {
                "batch_size_sequences": b,
                "seed": seed,
                "tokens_lower_bound": bound if finite else None,
                "steps_lower_bound": bound / (b * tokens_per_sequence) if finite else None,
                "trial_id": t_min.trial_id,
            }
        )
    return out


def best_at_budget(trials: list[TrialRecord]) -> dict[int, list[TrialRecord]]:
    """Per batch size, the trials (all seeds) of the configuration with the lowest mean final loss."""
    by_group: dict[tuple[int, str], list[TrialRecord]] = {}
    for t in trials:
        by_group.setdefault((t.batch_size_sequences, t.group_id), []).append(t)
    best: dict[int, tuple[float, list[TrialRecord]]] = {}
    for (b, _), ts in by_group.items():
        finals = [t.final_loss for t in ts if t.final_loss is not None]
        if not finals:
            continue
        m = float(np.mean(finals))
        if b not in best or m < best[b][0]:
            best[b] = (m, [t for t in ts if t.final_loss is not None])
    return {b: v[1] for b, v in sorted(best.items())}


def choose_targets(trials: list[TrialRecord], n_targets: int = 4) -> list[float]:
    """Target losses that most batch sizes reach, none of them at a milestone's own loss.

    Per batch size, ``reach`` is the lowest loss any of its trials shows at a milestone before the batch size's
    last one (its curve up to where it turned non-finite) and ``before`` that trial's loss at the milestone
    before it; ``first`` is the lowest loss at a first milestone. With ``n_min = max(3, ceil(0.7 n))`` of the
    ``n`` batch sizes, the lowest target lies halfway between the ``n_min``-th smallest ``reach`` and its
    ``before``: that many batch sizes reach it before their last milestone, the last of them between two
    milestones rather than on one (a target at a milestone's own loss put that batch size's point exactly on
    the milestone, in or out of the fit by 1e-4). Batch sizes that do not reach it enter
    the fit censored (:func:`censored_points`). Leaving the last milestone out of ``reach`` keeps the targets
    where they were before censored points entered the fit: counting it lowered them by about a milestone, and
    on ``benchmarks/search_placement.py`` that widened the median interval from 2.1x to 3.7x and cut coverage
    to 0.91 (docs/benchmarks.md). The others are spaced evenly up to halfway to the lowest ``first``.
    Returned in decreasing order; empty if no trial has a curve.
    """
    last = last_tokens_by_batch(trials)
    reach: dict[int, tuple[float, float]] = {}
    firsts: dict[int, float] = {}
    for t in trials:
        b = t.batch_size_sequences
        prev = math.inf
        for tok, loss in zip(t.tokens, t.val_loss):
            if loss is None or not math.isfinite(loss) or tok >= last[b]:
                break
            if loss < reach.get(b, (math.inf, math.inf))[0]:
                reach[b] = (loss, prev)
            prev = loss
        if t.val_loss and t.val_loss[0] is not None and math.isfinite(t.val_loss[0]):
            firsts[b] = min(firsts.get(b, math.inf), t.val_loss[0])
    if not reach:
        return []
    ordered = sorted(reach.values())
    n_min = min(len(ordered), max(3, math.ceil(0.7 * len(reach))))
    low, before = ordered[n_min - 1]
    hi = min(firsts.values()) - 1e-4
    lo = 0.5 * (low + before) if math.isfinite(before) and before > low else low + 1e-4
    if hi <= lo:
        return [lo]
    top = lo + 0.5 * (hi - lo)
    return [float(x) for x in np.linspace(top, lo, n_targets)]
