"""The hyperbola fit with right-censored points: batch sizes that did not reach a target enter the fit as
"more steps than this", not as dropped points.

A batch size whose trials all stopped above the target loss is known only to need more than ``c`` steps
(``c``: the steps of its budget, :func:`sweeps.analysis.targets.censored_points`). Dropping it keeps a large
batch size in the fit only when its draw was fast, which biases ``b_crit``; treating it as if it had
crossed at ``c`` biases the other way. The standard answer is the censored-normal (Tobit) likelihood
(Tobin 1958, Econometrica 26(1), Eq. 1; Amemiya 1984, J. Econometrics 24, section 2): with ``log S`` normal
around the hyperbola with an unknown sd ``sigma``,

    log L = sum_observed [ -log sigma - (y_i - mu_i)^2 / (2 sigma^2) ] + sum_censored log Phi((mu_j - c_j) / sigma),

``mu = log(S_min + E_min / B)`` (McCandlish et al. 2018, arXiv 1812.06162, Eq. 2.11), ``y = log S``,
``c = log`` of the censored bound. With Olsen's (1978, Econometrica 46(5)) parameters ``theta = 1 / sigma``,
``delta = theta * log S_min`` the negative log-likelihood is jointly convex for a fixed ``b_crit``, so
Newton's method finds the profile at every ``b_crit`` of a grid at once.

The interval is the profile-likelihood region ``{ b : 2 (l_max - l_p(b)) <= N log(1 + F_{1,N-2}(level)/(N-2)) }``
with ``N`` the observed per-batch points (censored ones not counted). Without censored points this is exactly
the F-calibrated region of :func:`sweeps.analysis.fit.interval_b_crit` (there ``2 (l_max - l_p) = N log(SSE/SSE_min)``),
so a sweep in which every batch size reached the target gets the same numbers either way; and a censored point
far below the fit, which carries no information, leaves the interval as it was without it (counting it in ``N``
would narrow the interval for nothing: measured, coverage 0.903 instead of 0.947 in ``benchmarks/search_placement.py``). Its coverage with
censored points is measured by ``benchmarks/search_placement.py`` (docs/benchmarks.md), not assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import log_ndtr
from scipy.stats import f as f_dist

__all__ = ["CENSORED_INTERVAL_METHOD", "CensoredPoints", "censored_fit"]

#: how ``b_crit_ci`` is computed when censored points enter the fit; stated in ``cbs.json``
CENSORED_INTERVAL_METHOD = (
    "with censored points: profile-likelihood interval of log b_crit under the censored-normal (Tobit) likelihood "
    "of log steps (Tobin 1958; Amemiya 1984), on one point per batch size, 2 (l_max - l_p) <= "
    "N log(1 + F(1, N-2)/(N-2)) with N the batch sizes that reached the target: the region above when nothing is censored"
)

_NEWTON_ITERS = 40
_U_STEP = 0.05  # log b_crit grid step of the profile walk
_LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class CensoredPoints:
    """One point per batch size: observed ``log S`` and censored lower bounds of ``log S``.

    Attributes:
        b_obs: batch sizes that reached the target, shape (n_o,), any unit.
        y_obs: their mean ``log`` steps over seeds, shape (n_o,).
        b_cens: batch sizes that did not (for some seed), shape (n_c,).
        c_cens: the ``log`` of the steps each is known to need more than (mean over its seeds of each seed's
            ``log`` steps or ``log`` bound), shape (n_c,); or, where ``s_cens`` is -1, at most (a batch size
            already below the target at its first milestone: interval-censored in ``(0, c]``).
    """

    b_obs: np.ndarray
    y_obs: np.ndarray
    b_cens: np.ndarray
    c_cens: np.ndarray
    #: +1 for a lower bound (needs more than ``c``), -1 for an upper bound (needs at most ``c``), shape (n_c,);
    #: None: every censored point is a lower bound
    s_cens: np.ndarray | None = None

    @property
    def signs(self) -> np.ndarray:
        return np.ones(len(self.b_cens)) if self.s_cens is None else np.asarray(self.s_cens, dtype=float)

    @property
    def n(self) -> int:
        return len(self.b_obs) + len(self.b_cens)

    @property
    def all_b(self) -> np.ndarray:
        return np.concatenate([self.b_obs, self.b_cens])


def _mills(x: np.ndarray) -> np.ndarray:
    """``phi(x) / Phi(x)``, computed in logs (stable far into both tails)."""
    return np.exp(-0.5 * x * x - 0.5 * _LOG_2PI - log_ndtr(x))


def _nll_shift(delta: np.ndarray, theta: np.ndarray, w: np.ndarray, v: np.ndarray, sg: np.ndarray) -> np.ndarray:
    """Negative log-likelihood (constant dropped) in Olsen's parameters; ``w = y - g`` (G, n_o), ``v = c - g``
    (G, n_c), with ``g`` the hyperbola's shape at each grid point; ``delta``, ``theta`` shape (G,); ``sg`` the
    censored points' signs (n_c,): a lower bound adds ``-log Phi(delta - theta v)``, an upper bound
    ``-log Phi(theta v - delta)``."""
    r = theta[:, None] * w - delta[:, None]
    out = -w.shape[1] * np.log(theta) + 0.5 * (r * r).sum(axis=1)
    if v.shape[1]:
        out = out - log_ndtr(sg[None, :] * (delta[:, None] - theta[:, None] * v)).sum(axis=1)
    return out


def _profile_shift(w: np.ndarray, v: np.ndarray, sg: np.ndarray) -> np.ndarray:
    """``min over (log S_min, sigma)`` of the negative log-likelihood at each of G shapes (rows of ``w``, ``v``):
    damped Newton on the convex problem in ``(delta, theta)``, started from the observed points' least squares.
    (Observed points exactly on the curve make the Hessian singular; such rows keep their last finite value.)"""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _newton_shift(w, v, sg)


def _newton_shift(w: np.ndarray, v: np.ndarray, sg: np.ndarray) -> np.ndarray:
    """The body of :func:`_profile_shift`."""
    n_o = w.shape[1]
    m0 = w.mean(axis=1)
    theta = np.sqrt(n_o / np.maximum(((w - m0[:, None]) ** 2).sum(axis=1), 1e-300))
    delta = theta * m0
    f = _nll_shift(delta, theta, w, v, sg)
    for _ in range(_NEWTON_ITERS):
        r = theta[:, None] * w - delta[:, None]
        x = sg[None, :] * (delta[:, None] - theta[:, None] * v)
        lam = _mills(x)
        h = lam * (lam + x)
        g_d = -r.sum(axis=1) - (lam * sg[None, :]).sum(axis=1)
        g_t = -n_o / theta + (r * w).sum(axis=1) + (lam * sg[None, :] * v).sum(axis=1)
        h_dd = n_o + h.sum(axis=1)
        h_tt = n_o / theta**2 + (w * w).sum(axis=1) + (h * v * v).sum(axis=1)
        h_dt = -w.sum(axis=1) - (h * v).sum(axis=1)
        det = h_dd * h_tt - h_dt**2
        s_d = -(h_tt * g_d - h_dt * g_t) / det
        s_t = -(h_dd * g_t - h_dt * g_d) / det
        step = np.ones_like(delta)
        nf = np.full_like(delta, np.inf)  # each halving below sets it
        for _ in range(30):  # halve where the step leaves theta > 0 or raises the objective
            nt = theta + step * s_t
            ok = nt > 0
            nf = np.where(ok, _nll_shift(delta + step * s_d, np.where(ok, nt, 1.0), w, v, sg), np.inf)
            bad = ~(nf <= f + 1e-12)
            if not bad.any():
                break
            step = np.where(bad, step / 2, step)
        moved = nf <= f + 1e-12
        delta = np.where(moved, delta + step * s_d, delta)
        theta = np.where(moved, theta + step * s_t, theta)
        f_new = np.where(moved, nf, f)
        if np.all(np.abs(f - f_new) < 1e-11):
            f = f_new
            break
        f = f_new
    return f


def _shape(u: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(1 + b_crit / B)`` for ``b_crit = exp(u)``: shape (G, len(b))."""
    return np.logaddexp(0.0, u[:, None] - np.log(b)[None, :])


def _profile_u(pts: CensoredPoints, u: np.ndarray) -> np.ndarray:
    """The profile negative log-likelihood of ``log b_crit`` at each ``u`` (``log S_min``, sigma re-optimised)."""
    u = np.atleast_1d(np.asarray(u, dtype=float))
    return _profile_shift(
        pts.y_obs[None, :] - _shape(u, pts.b_obs), pts.c_cens[None, :] - _shape(u, pts.b_cens), pts.signs
    )


def _threshold(n: int, level: float) -> float:
    """``N log(1 + F_{1,N-2}(level) / (N-2))``: the F-calibrated region as a log-likelihood ratio."""
    return n * math.log1p(f_dist.ppf(level, 1, n - 2) / (n - 2))


def _region(
    prof: Callable[[np.ndarray], np.ndarray],
    x0: float,
    f_max: float,
    lo: float,
    hi: float,
    step: float,
    *,
    bisections: int = 30,
) -> tuple[float, float]:
    """The ends of ``{x : prof(x) <= f_max}`` around ``x0`` within ``[lo, hi]``: a walk of ``step`` (in chunks of 8
    points) refined by ``bisections`` halvings; ``-inf`` / ``inf`` where the region reaches past ``lo`` / ``hi``."""

    def end(direction: float) -> float:
        limit = lo if direction < 0 else hi
        n_steps = int(abs(limit - x0) / step) + 1
        inside = x0
        for start in range(1, n_steps + 1, 8):
            xs = x0 + direction * step * np.arange(start, min(start + 8, n_steps + 1))
            xs = np.clip(xs, lo, hi)
            out_idx = np.nonzero(prof(xs) > f_max)[0]
            if len(out_idx):
                k = int(out_idx[0])
                a, b = (inside if k == 0 else float(xs[k - 1])), float(xs[k])
                for _ in range(bisections):
                    mid = 0.5 * (a + b)
                    a, b = (a, mid) if prof(np.array([mid]))[0] > f_max else (mid, b)
                return 0.5 * (a + b)
            inside = float(xs[-1])
        return -math.inf if direction < 0 else math.inf

    return end(-1.0), end(1.0)


def censored_fit(pts: CensoredPoints, level: float = 0.95) -> dict[str, Any]:
    """The censored-normal fit of ``S = S_min + E_min / B`` and the profile intervals of ``b_crit``, ``S_min``, ``E_min``.

    Args:
        pts: one point per batch size (:class:`CensoredPoints`), at least 3 observed.
        level: the intervals' confidence level.

    Returns:
        ``{s_min, e_min, b_crit, rms_log_residual (over the observed points), b_crit_ci: (lo, hi),
        s_min_ci, e_min_ci}`` in the unit of B (steps for ``S_min``); an end 0 or ``inf`` where the data do not
        bound it. ``b_crit`` is 0 or ``inf`` when the best fit lies at a limit (no floor on steps, or steps
        that never fall with B).

    Raises:
        ValueError: fewer than 3 observed points, or ``level`` outside (0, 1).
    """
    if len(pts.b_obs) < 3:
        raise ValueError("the censored fit needs at least 3 batch sizes that reached the target")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    all_b = pts.all_b
    lo_u, hi_u = math.log(all_b.min()) - 9.0, math.log(all_b.max()) + 9.0
    grid = np.arange(lo_u, hi_u + _U_STEP / 2, _U_STEP)
    prof = _profile_u(pts, grid)
    i = int(np.argmin(prof))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    for _ in range(60):  # golden-section refinement of the grid's best
        m1, m2 = b - 0.618 * (b - a), a + 0.618 * (b - a)
        p1, p2 = _profile_u(pts, np.array([m1, m2]))
        a, b = (a, m2) if p1 <= p2 else (m1, b)
    u_best = 0.5 * (a + b)
    f_best = float(_profile_u(pts, np.array([u_best]))[0])
    if prof[i] < f_best:
        u_best, f_best = float(grid[i]), float(prof[i])
    f_max = f_best + 0.5 * _threshold(len(pts.b_obs), level)
    u_lo, u_hi = _region(lambda x: _profile_u(pts, x), u_best, f_max, lo_u, hi_u, _U_STEP)
    at_edge = u_best <= lo_u + 1e-9 or u_best >= hi_u - 1e-9
    b_crit = (0.0 if u_best <= lo_u + 1e-9 else math.inf) if at_edge else math.exp(u_best)
    s_min = _s_min_at(pts, u_best)
    e_min = s_min * math.exp(u_best)
    resid = pts.y_obs - (math.log(s_min) + _shape(np.array([u_best]), pts.b_obs)[0])
    s_ci, e_ci = _s_e_intervals(pts, f_max, math.log(s_min), math.log(e_min))
    return {
        "s_min": s_min if not math.isinf(b_crit) else 0.0,
        "e_min": e_min if b_crit > 0 else 0.0,
        "b_crit": b_crit,
        "rms_log_residual": float(np.sqrt(np.mean(resid**2))),
        "b_crit_ci": (
            math.exp(u_lo) if math.isfinite(u_lo) else 0.0,
            math.exp(u_hi) if math.isfinite(u_hi) else math.inf,
        ),
        "s_min_ci": s_ci,
        "e_min_ci": e_ci,
    }


def _s_min_at(pts: CensoredPoints, u: float) -> float:
    """The maximum-likelihood ``S_min`` at ``log b_crit = u``: a golden-section search over ``log S_min``, sigma
    re-optimised at each (:func:`_nll_theta`)."""
    g_o, g_c = _shape(np.array([u]), pts.b_obs)[0], _shape(np.array([u]), pts.b_cens)[0]

    def best(m):
        return float(_nll_theta(m + g_o[None, :], m + g_c[None, :], pts)[0])

    lo, hi = (
        float((pts.y_obs - g_o).min()) - 5.0,
        float(max((pts.y_obs - g_o).max(), (pts.c_cens - g_c).max(initial=-np.inf))) + 5.0,
    )
    for _ in range(80):  # golden section on the convex-in-practice profile over log S_min
        m1, m2 = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, m2) if best(m1) <= best(m2) else (m1, hi)
    return math.exp(0.5 * (lo + hi))


def _nll_theta(mu_o: np.ndarray, mu_c: np.ndarray, pts: CensoredPoints) -> np.ndarray:
    """``min over sigma`` of the negative log-likelihood (the shift's form, constant dropped) at given means
    ``mu_o`` (G, n_o), ``mu_c`` (G, n_c): Newton on ``theta = 1/sigma``, convex for fixed means."""
    w = pts.y_obs[None, :] - mu_o
    d = pts.signs[None, :] * (mu_c - pts.c_cens[None, :])
    n_o, rss = w.shape[1], (w * w).sum(axis=1)
    theta = np.sqrt(n_o / np.maximum(rss, 1e-300))

    def f(t: np.ndarray) -> np.ndarray:
        return -n_o * np.log(t) + 0.5 * t * t * rss - log_ndtr(t[:, None] * d).sum(axis=1)

    cur = f(theta)
    for _ in range(_NEWTON_ITERS):
        x = theta[:, None] * d
        lam = _mills(x)
        g = -n_o / theta + theta * rss - (d * lam).sum(axis=1)
        h = n_o / theta**2 + rss + (d * d * lam * (lam + x)).sum(axis=1)
        step = -g / h
        nt = theta + step
        nt = np.where(nt > 0, nt, theta / 2)
        new = f(nt)
        better = new <= cur
        theta = np.where(better, nt, theta)
        if np.all(np.abs(cur - np.where(better, new, cur)) < 1e-11):
            cur = np.where(better, new, cur)
            break
        cur = np.where(better, new, cur)
    return cur


def _s_e_intervals(
    pts: CensoredPoints, f_max: float, a0: float, e0: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The profile intervals of ``S_min`` and ``E_min`` at the same ``f_max``: each parameter's ``log`` fixed on a
    walk, the other (through ``log b_crit`` on a grid) and sigma re-optimised."""
    all_b = pts.all_b
    u_grid = np.arange(math.log(all_b.min()) - 9.0, math.log(all_b.max()) + 9.0, 0.05)

    def prof_s(a: np.ndarray) -> np.ndarray:  # log S_min fixed: mu = a + log(1 + b_crit/B)
        return np.array(
            [
                _grid_min(_nll_theta(ai + _shape(u_grid, pts.b_obs), ai + _shape(u_grid, pts.b_cens), pts))
                for ai in np.atleast_1d(a)
            ]
        )

    def prof_e(e: np.ndarray) -> np.ndarray:  # log E_min fixed: mu = e + log(1/b_crit + 1/B)
        return np.array(
            [
                _grid_min(_nll_theta(ei + _shape_e(u_grid, pts.b_obs), ei + _shape_e(u_grid, pts.b_cens), pts))
                for ei in np.atleast_1d(e)
            ]
        )

    y_lo, y_hi = float(pts.y_obs.min()), float(pts.y_obs.max())
    s = _region(prof_s, a0, f_max, y_lo - 12.0, y_hi + 2.0, 0.05, bisections=12)
    w = pts.y_obs + np.log(pts.b_obs)
    e = _region(prof_e, e0, f_max, float(w.min()) - 12.0, float(w.max()) + 2.0, 0.05, bisections=12)

    def ends(r):
        return (
            math.exp(r[0]) if math.isfinite(r[0]) else 0.0,
            math.exp(r[1]) if math.isfinite(r[1]) else math.inf,
        )

    return ends(s), ends(e)


def _grid_min(vals: np.ndarray) -> float:
    """The minimum of a smooth function sampled on an even grid: the parabola through the best sample and its
    two neighbours (the sample itself at the grid's ends)."""
    i = int(np.argmin(vals))
    if i == 0 or i == len(vals) - 1:
        return float(vals[i])
    f0, f1, f2 = float(vals[i - 1]), float(vals[i]), float(vals[i + 1])
    curv = f0 - 2 * f1 + f2
    return f1 - (f0 - f2) ** 2 / (8 * curv) if curv > 0 else f1


def _shape_e(u: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(1/b_crit + 1/B)`` for ``b_crit = exp(u)``: shape (G, len(b))."""
    return np.logaddexp(-u[:, None], -np.log(b)[None, :])
