"""Does McCandlish et al.'s hyperbola describe the points at all? Two checks that turn a fit into the status
``misfit`` instead of a knee, and the distance from perfect scaling that an ``above_range`` message states.

The hyperbola ``S = S_min + E_min / B`` (McCandlish et al. 2018, arXiv 1812.06162, Eq. 2.11) implies that the
tokens to a target, ``E = B S = E_min + S_min B`` (Eq. 2.12's other form), never fall as the batch grows. Two
things break it in practice: small batch sizes trained at poor learning rates (their tokens rise towards the
small end), and schedules whose loss depends on the run's horizon (a WSD cooldown, Zhou et al. 2026: steps to a
target are then not a property of the batch size alone). A fit through such points still returns a knee, and its
interval says nothing about the model being wrong. So:

- **tokens rising towards small batch sizes**: the tokens of the smallest fitted batch size exceed the fewest
  tokens of any larger one by more than :data:`TOKENS_RISE` (a factor of 1.5: 0.4 in log, four times the 0.1
  seed-to-seed spread of log steps measured on the main job's model, docs/benchmarks.md, "Real-training
  coverage");
- **scatter far beyond noise**: the root-mean-square log residual exceeds :data:`MISFIT_RMS_LOG` (0.3, three
  times that spread; methodology note R1 expects at most about 0.1).

Both thresholds are stated, not fitted to any result; a sweep at the thresholds' edge is reported as it is.
Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["MISFIT_RMS_LOG", "TOKENS_RISE", "gap_text", "misfit_reason", "scaling_gap"]

#: tokens at the smallest fitted batch size over the fewest at a larger one, above which the fit is a misfit
TOKENS_RISE = 1.5
#: root-mean-square log-steps residual above which the fit is a misfit
MISFIT_RMS_LOG = 0.3


def _per_batch(batch_sizes: Sequence[float], steps: Sequence[float]) -> list[tuple[float, float]]:
    """``(B, geometric mean of steps over its points)``, sorted by B."""
    logs: dict[float, list[float]] = {}
    for b, s in zip(batch_sizes, steps):
        logs.setdefault(float(b), []).append(math.log(s))
    return sorted((b, math.exp(sum(v) / len(v))) for b, v in logs.items())


def misfit_reason(batch_sizes: Sequence[float], steps: Sequence[float], rms_log_residual: float | None) -> str | None:
    """Why the hyperbola does not describe these points (module docstring), in words, or None.

    Args:
        batch_sizes: the exact points' batch sizes (sequences), 3 or more distinct.
        steps: their steps to the target.
        rms_log_residual: the fit's root-mean-square residual of log steps (None: not checked).
    """
    pts = _per_batch(batch_sizes, steps)
    if len(pts) >= 3:
        b0, s0 = pts[0]
        fewest_b, fewest = min(((b, b * s) for b, s in pts[1:]), key=lambda r: r[1])
        if b0 * s0 > TOKENS_RISE * fewest:
            return (
                f"tokens to the target rise towards small batch sizes (B={b0:g} needs {b0 * s0 / fewest:.2f}x the "
                f"tokens of B={fewest_b:g}), which the hyperbola S = S_min + E_min/B cannot do: small batch sizes "
                "under-tuned (their LRs), or a schedule whose loss depends on the run's length"
            )
    if rms_log_residual is not None and rms_log_residual > MISFIT_RMS_LOG:
        return (
            f"the points scatter around the fitted hyperbola by {rms_log_residual:.2f} in log steps (rms), more than "
            f"{MISFIT_RMS_LOG:g}: the model does not describe them, so no knee is reported"
        )
    return None


def scaling_gap(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[float, float, float] | None:
    """How far the largest batch size's steps are from perfect scaling from the smallest:
    ``(smallest B, largest B, S(largest) * largest / (S(smallest) * smallest))`` (1: perfect; 2: twice the steps
    perfect scaling gives), or None with fewer than 2 batch sizes."""
    pts = _per_batch(batch_sizes, steps)
    if len(pts) < 2:
        return None
    (b0, s0), (b1, s1) = pts[0], pts[-1]
    return b0, b1, (s1 * b1) / (s0 * b0)


def gap_text(batch_sizes: Sequence[float], steps: Sequence[float], fitted: Sequence[float]) -> str:
    """How far the ``fitted`` batch sizes' steps are from perfect scaling, in words (an ``above_range`` message):
    "almost perfectly" only within 20 %."""
    gap = scaling_gap([b for b in batch_sizes if b in fitted], [x for b, x in zip(batch_sizes, steps) if b in fitted])
    if gap is None:
        return "steps still fall with the batch there"
    b0, b1, ratio = gap
    if ratio <= 1.2:
        return (
            f"steps still scale almost perfectly there (B={b1:g} needs {ratio:.2f}x the steps perfect scaling "
            f"from B={b0:g} gives)"
        )
    return (
        f"steps still fall with the batch there, though B={b1:g} already needs {ratio:.2f}x the steps perfect "
        f"scaling from B={b0:g} gives"
    )
