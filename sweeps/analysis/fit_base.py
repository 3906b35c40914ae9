"""What a fit of steps to a target against batch size is: the :class:`Fit` base class.

A fit turns one target loss's points (batch size ``B`` in sequences, optimizer steps ``S`` to the target, with
the cells that did not reach it as lower bounds) into the critical batch size ``b_crit`` (sequences), its
interval and a status. :mod:`sweeps.analysis.fits` holds the fits by name; the analysis
(:func:`sweeps.analysis.analyze_trials`) calls the one it is given through it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = ["Fit"]


class Fit(ABC):
    """A model of steps to target against batch size, fitted to one target's points.

    A subclass names itself (``name``, the key of :mod:`sweeps.analysis.fits`' registry), says how its interval
    is made (``interval_method``, written to ``cbs.json``) and implements :meth:`analyze`.
    """

    #: the fit's registered name
    name: ClassVar[str]
    #: how ``b_crit_ci`` is computed, in words with its sources (``cbs.json``'s ``interval_method``)
    interval_method: ClassVar[str]

    @abstractmethod
    def analyze(
        self,
        batch_sizes: Sequence[float],
        steps: Sequence[float],
        reference_batch: float,
        *,
        level: float = 0.95,
        censored: Sequence[tuple[float, ...]] = (),
        upper_bounds: Sequence[tuple[float, ...]] = (),
        seeds: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """Fit one target's points.

        Args:
            batch_sizes: each point's batch size (sequences); several points may share one (seeds).
            steps: each point's optimizer steps to the target, same length as ``batch_sizes``.
            reference_batch: the batch size (sequences) the 20 % critical batch size is measured from.
            level: the interval's confidence level.
            censored: ``(batch size, steps[, seed])`` lower bounds: cells that did not reach the target.
            upper_bounds: ``(batch size, steps[, seed])`` upper bounds: cells already below it at their first
                milestone.
            seeds: each point's training seed, or None (one seed).

        Returns:
            the keys of :class:`sweeps.spec.result.TargetFit` (``status``, one of
            :data:`sweeps.analysis.STATUSES`; ``b_crit`` None unless the knee lies in the swept range;
            ``b_crit_ci`` ``[lo, hi]`` with ``hi`` None when unbounded; ``message``; ...).
        """
