"""The steps-to-target hyperbola as a registered :class:`~sweeps.analysis.fit_base.Fit`: ``hyperbola``.

``S(B) = S_min (1 + b_crit / B)``, i.e. ``S = S_min + E_min / B`` with ``b_crit = E_min / S_min`` (McCandlish et
al. 2018, arXiv 1812.06162, Eqs. 2.11-2.12; methodology note sections 2.4 and 4.1). The numbers are
:mod:`sweeps.analysis.fit`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sweeps.analysis.fit import INTERVAL_METHOD, analyze_points
from sweeps.analysis.fit_base import Fit

__all__ = ["Hyperbola"]


class Hyperbola(Fit):
    """The hyperbola ``S = S_min + E_min / B`` fitted in ``log S`` with a profile-likelihood interval of
    ``b_crit`` (:func:`sweeps.analysis.fit.analyze_points`)."""

    name = "hyperbola"
    interval_method = INTERVAL_METHOD

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
        """:func:`sweeps.analysis.fit.analyze_points` (see :meth:`Fit.analyze` for the arguments)."""
        return analyze_points(
            batch_sizes, steps, reference_batch, level=level, censored=censored, upper_bounds=upper_bounds, seeds=seeds
        )
