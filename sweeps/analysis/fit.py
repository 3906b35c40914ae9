"""The hyperbola fit of steps to a target against batch size, its interval, and the fit's status.

For a target loss ``L*``, each batch size ``B`` needs ``S(B)`` optimizer steps and ``E(B) = B * S(B)``
sequences to first reach ``L*`` *with hyperparameters tuned for that batch size*. Following Zhang et
al. 2024 (arXiv 2410.21676, section 2: "the minimum number of optimization steps to reach the target
over all runs") and the methodology note (section 11.3), ``S(B)`` is the minimum over every trial of
that batch size, read from each trial's curve, including the curve a pruned or stopped trial
reported before it ended. McCandlish et al. 2018 (arXiv 1812.06162, Eq. 2.11) model the trade-off as
``(S/S_min - 1)(E/E_min - 1) = 1``, i.e.

    S(B) = S_min + E_min / B,          E(B) = E_min + S_min * B,

and define the critical batch size ``b_crit = E_min / S_min`` (Eq. 2.12): at ``B = b_crit`` a run
needs twice the minimum steps and twice the minimum data. The compute overhead over the minimum
is ``B / b_crit``, so the batch with 20 % overhead is ``0.2 * b_crit``; Zhang et al. 2024 define the
CBS as the batch whose steps exceed linear scaling from a reference batch ``B0`` by 20 %, which under
this model is ``0.2 * b_crit + 1.2 * B0`` (methodology note section 4.1). The fit minimises squared
residuals in ``log S`` with ``S_min, E_min >= 0`` (methodology section 2.4).

The interval (:func:`interval_b_crit`) is a profile-likelihood interval on one point per batch size
(the mean of ``log S`` over its seeds): the seeds of a batch size share its tuned configuration and
the search that chose it, so they are not independent replicates; the scatter of the per-batch points
around the fit carries both the shared error and the search's own variability. docs/results.md and
``benchmarks/ci_coverage.py`` give its measured coverage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import f as f_dist

from sweeps.analysis.cbs20 import cbs_20, cbs_20_interval
from sweeps.analysis.censored import CENSORED_INTERVAL_METHOD, CensoredPoints, censored_fit
from sweeps.analysis.model_check import gap_text, misfit_reason
from sweeps.analysis.seed_effects import RANDOM_EFFECTS_METHOD, seed_combined_fit

__all__ = [
    "INTERVAL_METHOD",
    "STATUSES",
    "HyperbolaFit",
    "analyze_points",
    "cbs_20",
    "cbs_20_interval",
    "fit_hyperbola",
    "interval_b_crit",
    "interval_s_min_e_min",
]

#: how ``b_crit_ci`` is computed; stated in ``cbs.json``
INTERVAL_METHOD = (
    "profile-likelihood interval of log b_crit on one point per batch size (mean log steps over its seeds), "
    "F(1, n-2) calibrated (Bates and Watts 1988, section 6.1; Seber and Wild 1989, Eq. 5.35); "
    + CENSORED_INTERVAL_METHOD
    + "; "
    + RANDOM_EFFECTS_METHOD
)


#: every status a fit can have
STATUSES = ("ok", "edge", "above_range", "below_range", "no_knee", "misfit")


@dataclass(frozen=True)
class HyperbolaFit:
    """``S(B) = s_min + e_min / B`` fitted in log space.

    Attributes:
        s_min: minimum optimizer steps (B -> infinity).
        e_min: minimum sequences (B -> 0), in the unit of B.
        b_crit: ``e_min / s_min`` in the unit of B (``inf`` if ``s_min == 0``).
        rms_log_residual: root-mean-square residual of ``log S``.
    """

    s_min: float
    e_min: float
    b_crit: float
    rms_log_residual: float

    def steps(self, b: np.ndarray | float) -> np.ndarray | float:
        return self.s_min + self.e_min / np.asarray(b, dtype=float)


def _check_points(B: np.ndarray, S: np.ndarray) -> None:
    if B.shape != S.shape or B.ndim != 1:
        raise ValueError("batch_sizes and steps must be 1-D and of equal length")
    if len(np.unique(B)) < 2:
        raise ValueError("need at least 2 distinct batch sizes to fit S = S_min + E_min/B")
    if np.any(B <= 0) or np.any(S <= 0) or not (np.all(np.isfinite(S)) and np.all(np.isfinite(B))):
        raise ValueError("batch sizes and steps must be positive and finite")


def _profile_sse(B: np.ndarray, y: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Residual sum of squares of ``log S`` and the optimal ``log S_min`` for each ``u = log b_crit``.

    With ``E_min = b_crit * S_min``, ``log S = log S_min + log(1 + b_crit/B)``, so for a fixed
    ``b_crit`` the best ``log S_min`` is the mean of ``y - log(1 + b_crit/B)``.
    """
    z = y[None, :] - np.log1p(np.exp(u)[:, None] / B[None, :])
    m = z.mean(axis=1)
    return ((z - m[:, None]) ** 2).sum(axis=1), m


def _limit_sse(B: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The SSE at the two limits: ``b_crit -> 0`` (``E_min = 0``) and ``b_crit -> inf`` (``S_min = 0``)."""
    w = y + np.log(B)
    return float(((y - y.mean()) ** 2).sum()), float(((w - w.mean()) ** 2).sum())


def fit_hyperbola(batch_sizes: Sequence[float] | np.ndarray, steps: Sequence[float] | np.ndarray) -> HyperbolaFit:
    """Fit ``S = S_min + E_min/B`` (McCandlish et al. 2018, Eq. 2.11) by least squares in ``log S``.

    Minimises ``sum_i (log S_i - log(S_min + E_min/B_i))^2`` over ``S_min, E_min >= 0``. Writing
    ``E_min = b_crit * S_min``, the optimal ``log S_min`` for a given ``b_crit`` is the mean of
    ``log S_i - log(1 + b_crit/B_i)``, so the fit is a one-dimensional search over ``log b_crit``
    (a grid, then Brent's bounded method), with the limits ``b_crit -> 0`` (``E_min = 0``) and
    ``b_crit -> inf`` (``S_min = 0``) compared explicitly.

    Args:
        batch_sizes: ``B`` per point (> 0), any unit (sequences or tokens).
        steps: steps to target per point (> 0).

    Raises:
        ValueError: fewer than 2 distinct batch sizes, or non-positive values.
    """
    B = np.asarray(batch_sizes, dtype=float)
    S = np.asarray(steps, dtype=float)
    _check_points(B, S)
    y = np.log(S)
    lo_u, hi_u = math.log(B.min()) - 9.0, math.log(B.max()) + 9.0
    grid = np.linspace(lo_u, hi_u, 361)
    obj, _ = _profile_sse(B, y, grid)
    i = int(np.argmin(obj))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    r: Any = minimize_scalar(
        lambda u: float(_profile_sse(B, y, np.array([u]))[0][0]),
        bounds=(a, b),
        method="bounded",
        options={"xatol": 1e-10},
    )
    u_best = float(r.x)
    obj_best, m_best = _profile_sse(B, y, np.array([u_best]))
    o_zero, o_inf = _limit_sse(B, y)
    candidates = [
        (float(obj_best[0]), float(np.exp(m_best[0])), float(np.exp(m_best[0] + u_best))),
        (o_zero, float(np.exp(y.mean())), 0.0),
        (o_inf, 0.0, float(np.exp((y + np.log(B)).mean()))),
    ]
    cost, s_min, e_min = min(candidates, key=lambda c: c[0])
    b_crit = e_min / s_min if s_min > 0 else math.inf
    rms = math.sqrt(cost / len(B))
    return HyperbolaFit(s_min=s_min, e_min=e_min, b_crit=b_crit, rms_log_residual=rms)


def _per_batch_means(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """One point per distinct batch size: ``(B, exp(mean log S))`` (the geometric mean over its seeds)."""
    B = np.asarray(batch_sizes, dtype=float)
    S = np.asarray(steps, dtype=float)
    _check_points(B, S)
    ub = np.unique(B)
    return ub, np.exp(np.array([np.log(S[B == b]).mean() for b in ub]))


def interval_b_crit(batch_sizes: Sequence[float], steps: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Confidence interval of ``b_crit`` from the profile of the log-space fit.

    Points are first reduced to one per batch size (mean ``log S`` over seeds): points that share a
    batch size share its tuned configuration, so their errors are correlated and counting them as
    independent makes intervals too narrow. On the ``n`` per-batch points the interval is

        { b : SSE(b) <= SSE_min * (1 + F_{1, n-2}(level) / (n - 2)) },

    with ``SSE(b)`` the profile residual sum of squares of ``log S`` at ``b_crit = b`` (``S_min``
    re-optimised), the likelihood-ratio region of nonlinear least squares calibrated by the F
    distribution (Bates and Watts 1988, "Nonlinear Regression Analysis", section 6.1; Seber and Wild
    1989, "Nonlinear Regression", Eq. 5.35). It needs no resampling, and its coverage on simulated
    sweeps with a known answer is measured by ``benchmarks/ci_coverage.py``.

    Returns:
        ``(lo, hi)`` in the unit of B; ``lo = 0`` or ``hi = inf`` when the data do not bound ``b_crit``
        on that side (always so with fewer than 3 batch sizes).

    Raises:
        ValueError: as :func:`fit_hyperbola`; ``level`` outside (0, 1).
    """
    setup = _profile_setup(batch_sizes, steps, level)
    if setup is None:
        return 0.0, math.inf
    B, y, fit, threshold = setup
    if threshold is None:  # points exactly on a hyperbola: the interval is the point
        return fit.b_crit, fit.b_crit
    o_zero, o_inf = _limit_sse(B, y)
    if fit.b_crit <= 0.0:
        u0 = math.log(B.min()) - 9.0
    elif not math.isfinite(fit.b_crit):
        u0 = math.log(B.max()) + 9.0
    else:
        u0 = math.log(fit.b_crit)
    return _walk_region(
        lambda u: float(_profile_sse(B, y, np.array([u]))[0][0]), u0, threshold, limit_low=o_zero, limit_high=o_inf
    )


def _profile_setup(
    batch_sizes: Sequence[float], steps: Sequence[float], level: float
) -> tuple[np.ndarray, np.ndarray, HyperbolaFit, float | None] | None:
    """What every profile interval starts from: ``(B, log S, fit, threshold)`` on the per-batch points,
    ``threshold = SSE_min (1 + F_{1,n-2}(level)/(n-2))`` (None when the points lie exactly on a
    hyperbola); None with fewer than 3 batch sizes.

    Raises:
        ValueError: as :func:`fit_hyperbola`; ``level`` outside (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    B, S = _per_batch_means(batch_sizes, steps)
    n = len(B)
    if n < 3:
        return None
    y = np.log(S)
    fit = fit_hyperbola(B, S)
    sse_min = fit.rms_log_residual**2 * n
    if sse_min <= 1e-24:
        return B, y, fit, None
    return B, y, fit, float(sse_min * (1.0 + f_dist.ppf(level, 1, n - 2) / (n - 2)))


def _walk_region(sse: Any, u0: float, threshold: float, *, limit_low: float, limit_high: float) -> tuple[float, float]:
    """The ends of ``{u : sse(u) <= threshold}`` around ``u0`` (a log parameter), walking in steps of 0.05
    and refining each crossing by Brent's method; ``(exp lo, exp hi)``. Past 400 steps still inside, an
    end is the parameter's limit (0 below, inf above) when that limit's SSE (``limit_low``,
    ``limit_high``) lies inside the region too, else the last point walked."""

    def f(u):
        return sse(u) - threshold

    if f(u0) > 0:  # the region is narrower than the inner minimisation's precision (points on a hyperbola)
        return math.exp(u0), math.exp(u0)
    inside_limit = threshold * (1 + 1e-9)

    def end(direction: float) -> float:
        inside = u0
        for k in range(1, 400):
            u = u0 + direction * 0.05 * k
            if f(u) > 0:
                return math.exp(cast(float, brentq(f, min(inside, u), max(inside, u), xtol=1e-10)))
            inside = u
        if direction < 0:
            return 0.0 if limit_low <= inside_limit else math.exp(inside)
        return math.inf if limit_high <= inside_limit else math.exp(inside)

    return end(-1.0), end(1.0)


def _min_over(obj: Any, lo: float, hi: float) -> float:
    """``min obj(v)`` over ``v`` in ``[lo, hi]``: a 121-point grid, then Brent's bounded method around its best."""
    grid = np.linspace(lo, hi, 121)
    vals = obj(grid)
    i = int(np.argmin(vals))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    r: Any = minimize_scalar(
        lambda v: float(obj(np.array([v]))[0]), bounds=(a, b), method="bounded", options={"xatol": 1e-9}
    )
    return float(min(vals[i], r.fun))


def interval_s_min_e_min(
    batch_sizes: Sequence[float], steps: Sequence[float], level: float = 0.95
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Confidence intervals of ``S_min`` (steps) and ``E_min`` (examples: the unit of B) of the fit
    ``S = S_min + E_min/B`` (McCandlish et al. 2018, Eq. 2.11), by the same profile likelihood as
    :func:`interval_b_crit`: on the per-batch points, ``{p : SSE(p) <= SSE_min (1 + F_{1,n-2}(level)/(n-2))}``
    with ``SSE(p)`` the residual sum of squares of ``log S`` with the parameter fixed at ``p`` and the
    other re-optimised (Bates and Watts 1988, section 6.1; Seber and Wild 1989, Eq. 5.35).

    ``S_min`` is the fewest steps to the target at any batch size, ``E_min`` the fewest examples; so
    the interval of the steps at batch size B and of synchronizations to target (``S_min/H``) follow.

    Returns:
        ``((s_lo, s_hi), (e_lo, e_hi))``; a lower end of 0 when the data allow the parameter's zero
        limit (``S_min = 0``: no floor on steps; ``E_min = 0``: steps do not fall with B), an upper end
        of ``inf`` when unbounded; ``((0, inf), (0, inf))`` with fewer than 3 batch sizes.

    Raises:
        ValueError: as :func:`fit_hyperbola`; ``level`` outside (0, 1).
    """
    setup = _profile_setup(batch_sizes, steps, level)
    if setup is None:
        return (0.0, math.inf), (0.0, math.inf)
    B, y, fit, threshold = setup
    if threshold is None:  # points exactly on a hyperbola
        return (fit.s_min, fit.s_min), (fit.e_min, fit.e_min)
    o_zero, o_inf = _limit_sse(B, y)  # E_min = 0 (b_crit -> 0), S_min = 0 (b_crit -> inf)
    w = y + np.log(B)  # log(S B): log E_min where steps scale perfectly
    ls = (float(y.min()) - 12.0, float(y.max()) + 2.0)  # log S_min
    le = (float(w.min()) - 12.0, float(w.max()) + 2.0)  # log E_min

    def sse_at_s_min(s: float) -> float:  # log S_min fixed; log E_min free (and its limit 0)
        def obj(e):
            return ((y[None, :] - np.log(math.exp(s) + np.exp(e)[:, None] / B[None, :])) ** 2).sum(axis=1)

        return min(_min_over(obj, *le), float(((y - s) ** 2).sum()))

    def sse_at_e_min(e: float) -> float:  # log E_min fixed; log S_min free (and its limit 0)
        def obj(w):
            return ((y[None, :] - np.log(np.exp(w)[:, None] + math.exp(e) / B[None, :])) ** 2).sum(axis=1)

        return min(_min_over(obj, *ls), float(((y - e + np.log(B)) ** 2).sum()))

    s0 = math.log(fit.s_min) if fit.s_min > 0 else float(y.min()) - 9.0
    e0 = math.log(fit.e_min) if fit.e_min > 0 else float(w.min()) - 9.0
    # either parameter going to infinity sends the SSE to infinity: nothing is assumed at that end
    return (
        _walk_region(sse_at_s_min, s0, threshold, limit_low=o_inf, limit_high=math.inf),
        _walk_region(sse_at_e_min, e0, threshold, limit_low=o_zero, limit_high=math.inf),
    )


def _reduce_censored(
    B: list[float],
    steps: Sequence[float],
    censored: Sequence[tuple[float, float]],
    upper: Sequence[tuple[float, float]] = (),
) -> CensoredPoints:
    """One point per batch size for :func:`sweeps.analysis.censored.censored_fit`: the mean ``log S`` over a batch
    size's seeds where every seed reached the target exactly; else a lower-censored point at the mean over its
    seeds of each one's ``log`` steps or ``log`` lower bound (a lower bound of that mean) when a seed did not reach
    it; else an upper-censored point at the mean of ``log`` steps and ``log`` upper bounds (a seed already below
    the target at its first milestone: an upper bound of that mean)."""
    logs: dict[float, tuple[list[float], list[float], list[float]]] = {}
    for b, s in zip(B, steps):
        logs.setdefault(float(b), ([], [], []))[0].append(math.log(s))
    for b, bound in censored:
        logs.setdefault(float(b), ([], [], []))[1].append(math.log(bound))
    for b, bound in upper:
        logs.setdefault(float(b), ([], [], []))[2].append(math.log(bound))
    obs = sorted((b, float(np.mean(o))) for b, (o, c, u) in logs.items() if not c and not u)
    cens = sorted((b, float(np.mean(o + c)), 1.0) for b, (o, c, u) in logs.items() if c)
    cens += sorted((b, float(np.mean(o + u)), -1.0) for b, (o, c, u) in logs.items() if u and not c)

    def arr(rows, k):
        return np.array([r[k] for r in rows], dtype=float)

    return CensoredPoints(arr(obs, 0), arr(obs, 1), arr(cens, 0), arr(cens, 1), arr(cens, 2))


def _fit_and_intervals(
    B: list[float],
    steps: Sequence[float],
    censored: Sequence[tuple[float, float]],
    level: float,
    upper: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """The fit and its three intervals (:func:`interval_b_crit`, :func:`interval_s_min_e_min`), or with censored
    points (lower or upper bounds) the censored-normal fit (:func:`sweeps.analysis.censored.censored_fit`, on
    :func:`_reduce_censored`'s points: a batch size with a censored seed is censored as a whole)."""
    if censored or upper:
        return censored_fit(_reduce_censored(B, steps, censored, upper), level)
    ub, us = _per_batch_means(B, steps)
    fit = fit_hyperbola(ub, us)
    lo, hi = interval_b_crit(B, steps, level=level)
    s_ci, e_ci = interval_s_min_e_min(B, steps, level=level)
    return {
        "s_min": fit.s_min,
        "e_min": fit.e_min,
        "b_crit": fit.b_crit,
        "rms_log_residual": fit.rms_log_residual,
        "b_crit_ci": (lo, hi),
        "s_min_ci": s_ci,
        "e_min_ci": e_ci,
    }


def analyze_points(
    batch_sizes: Sequence[float],
    steps: Sequence[float],
    reference_batch: float,
    *,
    level: float = 0.95,
    censored: Sequence[tuple[float, ...]] = (),
    upper_bounds: Sequence[tuple[float, ...]] = (),
    seeds: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Fit one set of (batch size, steps to target) points and describe the knee.

    Several points may share a batch size (seeds); the fit and the interval use one point per batch
    size (mean ``log S``), see :func:`interval_b_crit`.

    Returns a dict with ``status`` (one of :data:`STATUSES`: ``ok``: the knee and its whole interval
    lie inside the swept batch sizes, with at least 2 on each side of the knee; ``edge``: fewer than
    2 batch sizes on one side of the knee, or an interval reaching past the swept range;
    ``below_range``/``above_range``: the knee lies outside the swept batch sizes; ``no_knee``: fewer
    than 3 batch sizes, or an interval unbounded on both sides), ``message``, ``b_crit`` (None unless
    ``ok`` or ``edge``: a knee outside the range is never a bare number), ``b_crit_bound`` (for the
    out-of-range cases), ``b_crit_ci`` (``[lo, hi]``, ``hi`` None when unbounded; None with fewer than
    3 batch sizes), ``s_min``, ``e_min`` with ``s_min_ci`` and ``e_min_ci`` (:func:`interval_s_min_e_min`;
    None with fewer than 3 batch sizes), ``cbs_20``, ``b_compute_overhead_20`` with ``cbs_20_ci`` and
    ``b_compute_overhead_20_ci`` (``b_crit_ci`` mapped through them, :func:`cbs_20_interval`), ``n_points``,
    ``n_batch_sizes``, ``fitted_batch_sizes`` (the distinct batch sizes, sorted: the swept range the status
    refers to), ``rms_log_residual``, ``reference_batch``.

    ``censored``: ``(batch size, steps[, seed])`` lower bounds (a seed that did not reach the target needs more);
    ``upper_bounds``: ``(batch size, steps[, seed])`` upper bounds (a seed already below the target at its first
    milestone needs at most that). Either makes its batch size a censored point of the censored-normal fit
    (:mod:`sweeps.analysis.censored`), never an exact one; ``censored_in_fit`` and ``upper_bounded_in_fit`` list them.
    ``seeds``: each point's training seed; with two or more seeds that each bound a fit, ``b_crit`` and its
    interval combine the seeds' own fits with the between-seed variance
    (:func:`sweeps.analysis.seed_effects.combine_seed_fits`; ``seed_fits`` and ``between_seed_sd_log`` say how).
    """
    B = [float(b) for b in batch_sizes]
    seed_of = list(seeds) if seeds is not None else [0] * len(B)
    censored_s = [
        (float(c[0]), float(c[1]), c[2] if len(c) > 2 else None)
        for c in censored
        if c[1] is not None and c[1] > 0 and math.isfinite(c[1])
    ]
    upper_s = [
        (float(c[0]), float(c[1]), c[2] if len(c) > 2 else None)
        for c in upper_bounds
        if c[1] is not None and c[1] > 0 and math.isfinite(c[1])
    ]
    censored, upper = [c[:2] for c in censored_s], [c[:2] for c in upper_s]
    cens_b = {b for b, _ in censored}  # a batch size with a censored seed is censored as a whole (its mean)
    upper_b = {b for b, _ in upper} - cens_b
    distinct = sorted(set(B) - cens_b - upper_b)
    out: dict[str, Any] = {
        "n_points": sum(1 for b in B if b not in cens_b | upper_b),
        "n_batch_sizes": len(distinct),
        "fitted_batch_sizes": distinct,
        "reference_batch": reference_batch,
        "b_crit_bound": None,
        "censored_in_fit": sorted(cens_b) if len(distinct) >= 3 else [],
        "upper_bounded_in_fit": sorted(upper_b) if len(distinct) >= 3 else [],
    }
    if len(distinct) < 3:
        out.update(
            status="no_knee",
            b_crit=None,
            s_min=None,
            e_min=None,
            cbs_20=None,
            b_compute_overhead_20=None,
            cbs_20_ci=None,
            b_compute_overhead_20_ci=None,
            b_crit_ci=None,
            s_min_ci=None,
            e_min_ci=None,
            rms_log_residual=None,
            message=f"only {len(distinct)} batch size(s) reached the target: the fit needs at least 3",
        )
        return out
    fit = _fit_and_intervals(B, steps, censored, level, upper)
    if len(set(seed_of)) >= 2:
        fit = {**fit, **seed_combined_fit(B, steps, seed_of, censored_s, upper_s, level, out, _fit_and_intervals)}
    lo, hi = fit["b_crit_ci"]
    (s_lo, s_hi), (e_lo, e_hi) = fit["s_min_ci"], fit["e_min_ci"]
    out.update(
        s_min=fit["s_min"],
        e_min=fit["e_min"],
        rms_log_residual=fit["rms_log_residual"],
        b_crit_ci=[lo, hi if math.isfinite(hi) else None],
        b_crit_ci_level=level,
        s_min_ci=[s_lo, s_hi if math.isfinite(s_hi) else None],
        e_min_ci=[e_lo, e_hi if math.isfinite(e_hi) else None],
    )
    out.update(_knee(fit, distinct, reference_batch, out["b_crit_ci"], gap=lambda: gap_text(B, steps, distinct)))
    exact = [(b, x) for b, x in zip(B, steps) if b in distinct]
    why = misfit_reason([b for b, _ in exact], [x for _, x in exact], fit["rms_log_residual"])
    if why is not None and out["status"] != "no_knee":
        out.update(status="misfit", b_crit_bound=None, **_NO_KNEE, message=why)
    return out


_NO_KNEE = dict(b_crit=None, cbs_20=None, b_compute_overhead_20=None, cbs_20_ci=None, b_compute_overhead_20_ci=None)


def _knee(
    fit: dict[str, Any], distinct: list[float], reference_batch: float, ci: list[float | None], gap: Any
) -> dict[str, Any]:
    """:func:`analyze_points`' status, message and knee from a fit on the ``distinct`` fitted batch sizes (``gap()``:
    the distance from perfect scaling in words, for ``above_range``)."""
    lo, hi = fit["b_crit_ci"]
    lo_b, hi_b = distinct[0], distinct[-1]
    fitted = f"the fitted batch sizes ({lo_b:g} to {hi_b:g}, those that reached this target)"
    if lo <= 0.0 and not math.isfinite(hi):
        return dict(
            status="no_knee", **_NO_KNEE, message="the points do not bound b_crit on either side: no knee is identified"
        )
    if fit["b_crit"] < lo_b:
        return dict(
            status="below_range",
            b_crit_bound=f"< {lo_b:g}",
            **_NO_KNEE,
            message=f"the knee lies below the smallest fitted batch size ({lo_b:g}; the fitted batch sizes are "
            f"those that reached this target): every one of them is past the critical batch size",
        )
    if fit["b_crit"] > hi_b:
        return dict(
            status="above_range",
            b_crit_bound=f"> {hi_b:g}",
            **_NO_KNEE,
            message=f"the knee lies above the largest fitted batch size ({hi_b:g}; the fitted batch sizes are "
            f"those that reached this target): {gap()}",
        )
    below = sum(1 for b in distinct if b <= fit["b_crit"])
    above = sum(1 for b in distinct if b >= fit["b_crit"])
    outside = [side for side, out_of in (("below the smallest", lo < lo_b), ("above the largest", hi > hi_b)) if out_of]
    message = ""
    if below < 2 or above < 2:
        message = f"the knee is near the edge of {fitted}: fewer than 2 of them on one side"
    elif outside:
        message = f"the 95 % interval reaches {' and '.join(outside)} of {fitted}: they do not pin the knee down"
    c20_ci, o20_ci = cbs_20_interval(ci, reference_batch)
    return dict(
        status="ok" if below >= 2 and above >= 2 and not outside else "edge",
        b_crit=fit["b_crit"],
        cbs_20=cbs_20(fit["b_crit"], reference_batch),
        b_compute_overhead_20=0.2 * fit["b_crit"],
        cbs_20_ci=c20_ci,
        b_compute_overhead_20_ci=o20_ci,
        message=message,
    )
