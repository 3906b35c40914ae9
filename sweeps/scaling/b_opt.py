"""B_opt, the batch size of lowest validation loss at a fixed token budget, measured per sweep and fitted across
budgets as the critical batch size is.

At a fixed budget D a larger batch takes fewer steps, and past some size the loss reached at D rises: the batch of
lowest loss at D is B_opt (Bergsma et al. 2025, "Power Lines", arXiv 2505.13738, section 3, who find
``B_opt ~ D^0.383``; Li et al. 2025, "Step Law", arXiv 2503.04715, eq. 2: ``B_opt = 0.58 D^0.571`` tokens). It
differs from the critical batch size, which is read at a target loss, not at a budget.

One sweep (a member) gives B_opt as follows. For each batch size, the lowest validation loss at exactly D tokens
over its trials (``trials.json``: each trial's ``tokens`` and ``val_loss`` are its evaluation milestones); a trial
stopped before D (pruned, or stopped at its targets) has no loss at D and does not count. A trial stopped once it
reached the sweep's last target is often the best LR of its batch size, so the best loss at D can lie above what
that batch size reaches: the counts per batch size go with the result (:data:`STOPPED_CAVEAT`). Around the best batch
size the loss at D is smooth in ``x = log2 B`` with one minimum, so a parabola ``L(x) = a + b x + c x^2`` is
fitted by least squares to the per-batch-size best losses and its vertex ``x* = -b / (2c)`` is the estimate. Its
interval is Fieller's (Fieller 1954, "Some problems in interval estimation", JRSS B 16: 175-185; the standard
interval for a ratio of normal estimates): the set of ``x0`` where the slope ``b + 2 c x0`` is not significantly
non-zero,

    (b + 2 c x0)^2 <= t^2 (V_bb + 4 x0 V_bc + 4 x0^2 V_cc)                                            (1)

with ``V`` the coefficients' covariance ``s^2 (X'X)^-1`` from the residual variance ``s^2`` and ``t`` Student's
quantile on ``n - 3`` degrees of freedom. Unlike the delta method it is honest when the curvature is poorly
determined: the set is then unbounded (status ``flat``) instead of a symmetric interval that looks finite. The
residual variance holds both the trials' noise and the parabola's lack of fit, so a curve that is not a parabola
widens the interval; an asymmetric curve can still shift the vertex, which the interval does not show. Four or
more batch sizes are needed (one residual degree of freedom).

When the best batch size is the smallest or the largest with a loss at D, the sweep did not bracket B_opt: the
member has a one-sided bound only (the inner end of eq. 1's set, where that is finite), status ``edge``, no point,
and the law leaves it out, as a critical batch size without an interval is left out.

Caveat carried into every output: each batch size's learning rate was searched to reach the sweep's target losses
in the fewest tokens, not to minimise the loss at D, so the loss at D is the best over LRs tuned for another goal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from sweeps.errors import InvalidInput
from sweeps.scaling.law import StudyMember

__all__ = [
    "B_OPT_MEMBER_STATUSES",
    "LR_CAVEAT",
    "STOPPED_CAVEAT",
    "BestBatch",
    "b_opt_from_losses",
    "b_opt_member",
    "best_loss_at_budget",
]

#: a member's B_opt statuses: bracketed with a finite interval; the best batch size at an end of the swept range
#: (one-sided bound); a curvature not significantly positive (eq. 1's set unbounded); fewer than four batch sizes
#: with a loss at D; no readable ``trials.json``
B_OPT_MEMBER_STATUSES = ("ok", "edge", "flat", "too_few_batch_sizes", "no_trials")

#: which trials the loss at D is the best over
STOPPED_CAVEAT = (
    "trials stopped before D (pruned, or stopped once they reached the sweep's last target, often the best LRs of "
    "their batch size) have no loss at D: a batch size's best loss at D is over the trials that ran to D and can "
    "lie above what it reaches (trials_by_batch_size: with a loss at D, stopped before)"
)

#: how the learning rates the loss at D is the best over were chosen
LR_CAVEAT = (
    "each batch size's learning rate was searched to reach the sweep's target losses in the fewest tokens, not to "
    "minimise the loss at the budget D: B_opt is read over LRs tuned for another goal"
)


@dataclass(frozen=True)
class BestBatch:
    """One sweep's B_opt at its budget.

    Attributes:
        budget_tokens: D (tokens).
        batch_size_sequences: the parabola's vertex ``2^x*`` (sequences); None unless ``status`` is ``ok``.
        interval_sequences: eq. (1)'s set as ``(lo, hi)`` (sequences) at ``level``; None unless ``ok``.
        bound: for ``edge``: ``{"side": "below" | "above", "sequences": value or None}``: B_opt lies below (above)
            that value (None: the parabola bounds it on no side); None otherwise.
        level: the interval's confidence level.
        status: one of :data:`B_OPT_MEMBER_STATUSES`; ``message`` says why in words.
        losses_at_budget: the lowest validation loss at D per batch size (nats per token; batch sizes with none
            are absent).
        trials_by_batch_size: ``{batch_size_sequences: (trials with a loss at D, trials stopped before D)}``
            (pruned, or stopped once they reached the sweep's last target: often the best LRs of their batch size,
            whose loss at D is then not seen).
    """

    budget_tokens: float
    batch_size_sequences: float | None
    interval_sequences: tuple[float, float] | None
    level: float
    status: str
    message: str
    losses_at_budget: dict[int, float] = field(default_factory=dict)
    bound: dict[str, Any] | None = None
    trials_by_batch_size: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def trials_at_budget(self) -> int:
        """The trials with a loss at D."""
        return sum(n for n, _ in self.trials_by_batch_size.values())

    @property
    def trials_stopped_early(self) -> int:
        """The trials stopped before D (no loss at D)."""
        return sum(n for _, n in self.trials_by_batch_size.values())


def best_loss_at_budget(
    trials: Sequence[Mapping[str, Any]], budget_tokens: float
) -> tuple[dict[int, float], dict[int, tuple[int, int]]]:
    """The lowest validation loss at exactly ``budget_tokens`` per batch size, and how many trials had one.

    Args:
        trials: ``trials.json`` rows: ``batch_size_sequences`` and the milestone lists ``tokens`` (tokens) and
            ``val_loss`` (nats per token).
        budget_tokens: D (tokens); a milestone counts when it equals D to a relative 1e-9.

    Returns:
        ``({batch_size_sequences: loss}, {batch_size_sequences: (trials with a loss at D, trials without)})``;
        a trial stopped before D has no loss at D and does not count.
    """
    best: dict[int, float] = {}
    counts: dict[int, tuple[int, int]] = {}
    for trial in trials:
        b = int(trial["batch_size_sequences"])
        tokens, losses = trial.get("tokens") or [], trial.get("val_loss") or []
        at_d = [
            float(v)
            for t, v in zip(tokens, losses)
            if v is not None and math.isclose(float(t), budget_tokens, rel_tol=1e-9) and math.isfinite(float(v))
        ]
        at, stopped = counts.get(b, (0, 0))
        counts[b] = (at + 1, stopped) if at_d else (at, stopped + 1)
        if at_d:
            best[b] = min(best.get(b, math.inf), at_d[0])
    return dict(sorted(best.items())), dict(sorted(counts.items()))


def _fieller(beta: np.ndarray, cov: np.ndarray, t: float) -> tuple[float, float] | None:
    """Eq. (1)'s set for the vertex of ``a + b x + c x^2`` as ``(lo, hi)`` in x; None when it is unbounded (the
    curvature ``c`` is not significantly positive)."""
    _, b, c = beta
    a2 = c * c - t * t * cov[2, 2]
    if c <= 0 or a2 <= 0:
        return None
    a1 = b * c - t * t * cov[1, 2]
    a0 = (b * b - t * t * cov[1, 1]) / 4
    disc = max(0.0, a1 * a1 - 4 * a2 * a0)
    return ((-a1 - math.sqrt(disc)) / (2 * a2), (-a1 + math.sqrt(disc)) / (2 * a2))


def b_opt_from_losses(losses_at_budget: Mapping[int, float], budget_tokens: float, *, level: float = 0.95) -> BestBatch:
    """B_opt from the lowest loss at D per batch size (the module's method: a parabola in ``log2 B``, its vertex,
    Fieller's interval, eq. 1).

    Args:
        losses_at_budget: ``{batch_size_sequences: loss at D}`` (sequences; nats per token).
        budget_tokens: D (tokens), recorded on the result.
        level: the interval's confidence level, in (0, 1).

    Returns:
        the :class:`BestBatch` with its status (``ok``, ``edge``, ``flat``, ``too_few_batch_sizes``).

    Raises:
        InvalidInput: a level outside (0, 1), or a batch size that is not positive.
    """
    if not 0 < level < 1:
        raise InvalidInput(f"a confidence level must lie in (0, 1), got {level}")
    if any(b <= 0 for b in losses_at_budget):
        raise InvalidInput(f"batch sizes must be positive, got {sorted(losses_at_budget)}")
    sizes = sorted(losses_at_budget)
    losses = dict(sorted(losses_at_budget.items()))
    common: dict[str, Any] = {"budget_tokens": budget_tokens, "level": level, "losses_at_budget": losses}
    none: dict[str, Any] = {"batch_size_sequences": None, "interval_sequences": None}
    if len(sizes) < 4:
        msg = f"{len(sizes)} batch size(s) have a loss at D: a parabola with a residual variance needs 4"
        return BestBatch(status="too_few_batch_sizes", message=msg, **none, **common)
    x = np.log2(np.array(sizes, dtype=float))
    y = np.array([losses[b] for b in sizes])
    design = np.column_stack([np.ones_like(x), x, x * x])
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    dof = len(sizes) - 3
    resid = y - design @ beta
    cov = float(resid @ resid) / dof * np.linalg.inv(design.T @ design)
    t = float(stats.t.ppf(0.5 + level / 2, dof))
    ends = _fieller(beta, cov, t)
    best = sizes[int(np.argmin(y))]
    if best in (sizes[0], sizes[-1]):
        side = "below" if best == sizes[0] else "above"
        inner = None if ends is None else 2.0 ** (ends[1] if side == "below" else ends[0])
        msg = (
            f"the lowest loss at D is at the {'smallest' if side == 'below' else 'largest'} batch size swept "
            f"({best}): B_opt lies {side} the range"
            + (f", {side} {inner:.3g} sequences by the parabola's interval" if inner is not None else "")
        )
        bound = {"side": side, "sequences": inner}
        return BestBatch(status="edge", message=msg, bound=bound, **none, **common)
    if ends is None:
        msg = f"the loss at D is not significantly curved in log2 B at {100 * level:g} %: B_opt is not bounded"
        return BestBatch(status="flat", message=msg, **none, **common)
    vertex = 2.0 ** (-beta[1] / (2 * beta[2]))
    msg = f"bracketed by the swept batch sizes ({sizes[0]} to {sizes[-1]}); parabola over {len(sizes)} of them"
    ci = (2.0 ** ends[0], 2.0 ** ends[1])
    return BestBatch(batch_size_sequences=vertex, interval_sequences=ci, status="ok", message=msg, **common)


def b_opt_member(folder: Path, budget_tokens: float, *, level: float = 0.95) -> tuple[StudyMember, BestBatch]:
    """A sweep folder's B_opt at its budget, as a law member and with its details.

    Args:
        folder: a finished sweep's folder (its ``trials.json``), or a file in it (its ``cbs.json``).
        budget_tokens: D (tokens), the trials' budget (the sweep's ``spec.yaml`` ``budget_tokens``).
        level: the interval's confidence level, in (0, 1).

    Returns:
        ``(member, details)``: the member has a point and an interval only when ``details.status`` is ``ok``
        (status ``no_trials`` when ``trials.json`` cannot be read or its rows lack ``batch_size_sequences``).

    Raises:
        InvalidInput: a level outside (0, 1).
    """
    folder = folder.parent if folder.is_file() else folder
    budget = float(budget_tokens)
    try:
        trials = json.loads((folder / "trials.json").read_text(encoding="utf-8"))
        if not isinstance(trials, list):
            raise ValueError("not a list of trials")
        losses, counts = best_loss_at_budget(trials, budget)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = f"a trial has no {exc}" if isinstance(exc, KeyError) else str(exc)
        details = BestBatch(budget, None, None, level, "no_trials", f"no readable trials.json ({why})")
        if not 0 < level < 1:
            raise InvalidInput(f"a confidence level must lie in (0, 1), got {level}") from None
    else:
        fit = b_opt_from_losses(losses, budget, level=level)
        details = BestBatch(**{**fit.__dict__, "trials_by_batch_size": counts})
    member = StudyMember(
        tokens=budget,
        batch_size_sequences=details.batch_size_sequences,
        batch_size_ci_sequences=details.interval_sequences,
        level=level,
        status=details.status,
        label=str(folder),
    )
    return member, details
