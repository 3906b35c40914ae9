"""Several training seeds: each seed's fit, combined with the between-seed variance (a random effect shared by
every batch size of a seed), instead of one fit to the seeds' mean log steps.

On the main job's model one seed moves the steps of every batch size of 32 or more together by 12-17 % at a
fixed LR (docs/benchmarks.md, "Real-training coverage"): the seed is an effect shared across batch sizes, which
an average of log steps per batch size hides (the seeds then disagree beyond the interval, and the interval never
learns it). So each seed is fitted on its own (:func:`sweeps.analysis.fit.analyze_points`'s fit, censored points
included), its ``log b_crit`` given a standard error from its 95 % profile interval, and the seeds combined by
the DerSimonian-Laird random-effects estimator (DerSimonian and Laird 1986, Controlled Clinical Trials 7(3),
Eqs. 1-4): weights ``w_i = 1 / se_i^2``, ``Q = sum w_i (u_i - u_w)^2``,
``tau^2 = max(0, (Q - (k - 1)) / (sum w - sum w^2 / sum w))``, then weights ``1 / (se_i^2 + tau^2)``.
The interval is ``u* +- z_level se*`` on ``log b_crit``, ``se* = (sum 1 / (se_i^2 + tau^2))^(-1/2)``. With two
seeds ``tau^2`` rests on one difference; Hartung and Knapp's t quantile (Statistics in Medicine 20(24), 2001)
would multiply the half-width by 6.5 there, an interval no one could use. Its coverage on real curves is
measured instead: ``benchmarks/real_coverage.py --seeds-per-sweep 2`` (docs/benchmarks.md).

Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from scipy.stats import norm

__all__ = ["RANDOM_EFFECTS_METHOD", "combine_seed_fits", "seed_combined_fit"]

#: how ``b_crit_ci`` is made with two or more seeds; stated in ``cbs.json``
RANDOM_EFFECTS_METHOD = (
    "with two or more seeds: each seed fitted on its own, log b_crit combined across seeds by DerSimonian-Laird "
    "random effects (the between-seed variance tau^2 added to each seed's own), interval u +- z se"
)


def combine_seed_fits(fits: Sequence[tuple[float, float, float]], level: float = 0.95) -> dict[str, Any] | None:
    """Combine per-seed estimates of ``b_crit`` (module docstring).

    Args:
        fits: per seed ``(b_crit, lo, hi)``: the estimate and its ``level`` profile interval (any unit). A seed
            whose estimate is not positive and finite, or whose interval is open on a side, is left out.
        level: the intervals' confidence level.

    Returns:
        ``{b_crit, b_crit_ci: (lo, hi), tau_log (between-seed sd of log b_crit), n_seeds}``, or None with fewer
        than two usable seeds.

    Raises:
        ValueError: ``level`` outside (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    z = norm.ppf(0.5 + level / 2)
    rows = [
        (math.log(b), (math.log(hi) - math.log(lo)) / (2 * z))
        for b, lo, hi in fits
        if b and 0 < lo <= b <= hi and math.isfinite(hi) and math.isfinite(b)
    ]
    rows = [(u, max(se, 1e-6)) for u, se in rows]
    k = len(rows)
    if k < 2:
        return None
    w = [1.0 / se**2 for _, se in rows]
    sw = sum(w)
    u_w = sum(wi * u for wi, (u, _) in zip(w, rows)) / sw
    q = sum(wi * (u - u_w) ** 2 for wi, (u, _) in zip(w, rows))
    tau2 = max(0.0, (q - (k - 1)) / (sw - sum(wi * wi for wi in w) / sw))
    ws = [1.0 / (se**2 + tau2) for _, se in rows]
    u_star = sum(wi * u for wi, (u, _) in zip(ws, rows)) / sum(ws)
    se_star = math.sqrt(1.0 / sum(ws))
    half = z * se_star
    return {
        "b_crit": math.exp(u_star),
        "b_crit_ci": (math.exp(u_star - half), math.exp(u_star + half)),
        "tau_log": math.sqrt(tau2),
        "n_seeds": k,
    }


def seed_combined_fit(
    B: list[float],
    steps: Sequence[float],
    seed_of: list[int],
    censored: list[tuple],
    upper: list[tuple],
    level: float,
    out: dict[str, Any],
    fit: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """``{b_crit, b_crit_ci}`` from each seed's own fit combined with the between-seed variance
    (:func:`combine_seed_fits`), and ``out`` given ``seed_fits`` and ``between_seed_sd_log``; {} when fewer than
    two seeds bound a fit (the pooled fit stands).

    Args:
        B, steps, seed_of: the exact points (batch size, steps to target, seed).
        censored, upper: ``(batch size, bound, seed)`` lower and upper bounds (seed None: every seed's).
        fit: the fit of one set of points, ``fit(B, steps, censored, level, upper) -> {b_crit, b_crit_ci, ...}``
            (:func:`sweeps.analysis.fit.analyze_points`'s).
    """
    per = []
    for seed in sorted(set(seed_of)):
        idx = [i for i, x in enumerate(seed_of) if x == seed]
        b_s, s_s = [B[i] for i in idx], [steps[i] for i in idx]
        c_s = [c[:2] for c in censored if c[2] in (seed, None)]
        u_s = [c[:2] for c in upper if c[2] in (seed, None)]
        if len(set(b_s) - {c[0] for c in c_s} - {c[0] for c in u_s}) < 3:
            continue
        f = fit(b_s, s_s, c_s, level, u_s)
        per.append({"seed": seed, "b_crit": f["b_crit"], "b_crit_ci": list(f["b_crit_ci"])})
    combined = combine_seed_fits([(p["b_crit"], *p["b_crit_ci"]) for p in per], level)
    out["seed_fits"] = [
        {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in p.items()} for p in per
    ]
    if combined is None:
        return {}
    out["between_seed_sd_log"] = combined["tau_log"]
    return {"b_crit": combined["b_crit"], "b_crit_ci": combined["b_crit_ci"]}
