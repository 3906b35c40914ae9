"""The learning-rate lattice of ``search.strategy: transfer``: every LR the search runs is
``base_lr * 2^(k * step_octaves)`` for an integer ``k`` (``search.lr_lattice_octaves``, half an octave by
default).

A lattice makes each batch size's tried LRs comparable (an LR is either tried or not, never a hair away from
one tried), keeps probes an exact number of lattice steps from the fastest LR, and makes a sweep replayable
against a grid of real training curves measured on the same lattice (``benchmarks/real_coverage.py``):
training is deterministic, so the same (batch size, seed, LR, beta2) gives the same curve. Half an octave
costs at most a quarter octave of LR error, about 0.02 in log tokens at this project's measured LR
sensitivity (docs/benchmarks.md, "Real-training coverage").

Pure functions.
"""

from __future__ import annotations

import math

__all__ = ["lattice_index", "lattice_lr", "snap_lr"]


def lattice_lr(base_lr: float, index: int, step_octaves: float) -> float:
    """The LR at lattice point ``index``: ``base_lr * 2^(index * step_octaves)``.

    Every LR on the lattice is computed by this one expression, so the same index gives the same float
    everywhere (the search, the replay's grid).

    Raises:
        ValueError: ``base_lr`` or ``step_octaves`` not positive.
    """
    if not (base_lr > 0 and step_octaves > 0):
        raise ValueError(f"base_lr and step_octaves must be positive, got {base_lr}, {step_octaves}")
    return base_lr * 2.0 ** (int(index) * step_octaves)


def lattice_index(lr: float, base_lr: float, step_octaves: float) -> int:
    """The nearest lattice point's index to ``lr`` (in log LR; a tie goes to the lower).

    Raises:
        ValueError: a non-positive or non-finite ``lr``, or as :func:`lattice_lr`.
    """
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be positive and finite, got {lr}")
    lattice_lr(base_lr, 0, step_octaves)  # checks base_lr and step_octaves
    x = math.log2(lr / base_lr) / step_octaves
    k = math.floor(x)
    return k if x - k <= 0.5 + 1e-9 else k + 1


def snap_lr(lr: float, base_lr: float, step_octaves: float) -> float:
    """``lr`` moved to its nearest lattice point (:func:`lattice_index`, :func:`lattice_lr`)."""
    return lattice_lr(base_lr, lattice_index(lr, base_lr, step_octaves), step_octaves)
