"""Rung arithmetic of equal-compute pruning (pure, no Ray): rung fractions, interpolation of a curve at
exact FLOPs, the log-linear prediction of the final loss, and the decision record. The algorithm is
described in :mod:`sweeps.pruning.halving`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MODES",
    "RESULT_KEYS",
    "RULES",
    "RungDecision",
    "curve_at",
    "interpolate",
    "predict_final_log_linear",
    "rung_fractions",
    "rung_gate_key",
]

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
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
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
