"""Zhang et al. 2024's critical batch size and the 20 %-compute-overhead batch, both from ``b_crit`` under the
hyperbola fit (:mod:`sweeps.analysis.fit`; methodology note section 4.1). Pure functions."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["cbs_20", "cbs_20_interval"]


def cbs_20(b_crit: float, reference_batch: float) -> float:
    """Zhang et al. (2024) critical batch size: steps 20 % above linear scaling from ``B0``.

    Under ``S = S_min + E_min/B``: ``B* = 0.2 * b_crit + 1.2 * B0`` (methodology note section 4.1).
    """
    return 0.2 * b_crit + 1.2 * reference_batch


def cbs_20_interval(
    b_crit_ci: Sequence[float | None], reference_batch: float
) -> tuple[list[float | None], list[float | None]]:
    """The intervals of ``cbs_20`` and ``b_compute_overhead_20`` that ``b_crit_ci`` implies.

    Both are increasing affine maps of ``b_crit`` under the same fit (``cbs_20 = 0.2 b_crit + 1.2 B0``,
    ``b_compute_overhead_20 = 0.2 b_crit``), so the profile-likelihood interval of ``b_crit`` maps end to
    end onto theirs at the same level: no new fit, no new assumption.

    Args:
        b_crit_ci: ``[lo, hi]`` in sequences (``hi`` None: unbounded above).
        reference_batch: ``B0``, sequences.

    Returns:
        ``([cbs_20 lo, hi], [b_compute_overhead_20 lo, hi])``, sequences; an end is None where
        ``b_crit_ci``'s is.
    """
    lo, hi = b_crit_ci[0], b_crit_ci[1]
    return (
        [None if x is None else cbs_20(x, reference_batch) for x in (lo, hi)],
        [None if x is None else 0.2 * x for x in (lo, hi)],
    )
