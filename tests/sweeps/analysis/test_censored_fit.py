"""The censored-normal (Tobit) fit: batch sizes short of a target enter the fit as "more steps than this"."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import log_ndtr

from sweeps.analysis.censored import CensoredPoints, censored_fit
from sweeps.analysis.fit import analyze_points, fit_hyperbola, interval_b_crit, interval_s_min_e_min

B = np.array([4, 8, 16, 32, 64, 128, 256], dtype=float)


def _noisy(seed: int, b_crit: float = 15.0, sd: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 200 * (1 + b_crit / B) * np.exp(rng.normal(0, sd, len(B)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_censored_points_it_is_the_least_squares_fit_and_its_intervals(seed):
    S = _noisy(seed)
    r = censored_fit(CensoredPoints(B, np.log(S), np.array([]), np.array([])))
    fit = fit_hyperbola(B, S)
    lo, hi = interval_b_crit(B, S)
    (s_lo, s_hi), (e_lo, e_hi) = interval_s_min_e_min(B, S)
    assert r["b_crit"] == pytest.approx(fit.b_crit, rel=1e-6)
    assert r["b_crit_ci"] == pytest.approx((lo, hi), rel=1e-7)
    # S_min and E_min profile over a grid of b_crit (step 0.05 in log): within 0.5 % of the exact profile
    assert r["s_min_ci"] == pytest.approx((s_lo, s_hi), rel=5e-3)
    assert r["e_min_ci"] == pytest.approx((e_lo, e_hi), rel=5e-3)


def _brute_force(pts: CensoredPoints) -> float:
    """The maximum-likelihood log b_crit by a general-purpose optimiser on the censored log-likelihood."""

    def nll(p: np.ndarray) -> float:
        m, u, s = p
        mu_o = m + np.log1p(math.exp(u) / pts.b_obs)
        mu_c = m + np.log1p(math.exp(u) / pts.b_cens)
        sig = math.exp(s)
        return float(
            len(pts.b_obs) * s
            + ((pts.y_obs - mu_o) ** 2).sum() / (2 * sig * sig)
            - log_ndtr((mu_c - pts.c_cens) / sig).sum()
        )

    best = min(
        (
            minimize(
                nll,
                np.array([5.0, u0, -2.0]),
                method="Nelder-Mead",
                options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000},
            )
            for u0 in (1.0, 2.5, 4.0)
        ),
        key=lambda r: r.fun,
    )
    return float(best.x[1])


def test_the_censored_maximum_likelihood_matches_a_brute_force_optimiser():
    S = _noisy(3)
    pts = CensoredPoints(B[:5], np.log(S[:5]), B[5:], np.log(S[5:]) - 0.2)
    r = censored_fit(pts)
    assert math.log(r["b_crit"]) == pytest.approx(_brute_force(pts), abs=1e-3)


def test_a_censored_bound_above_the_fit_raises_b_crit_and_one_far_below_changes_nothing():
    S = _noisy(4)
    obs = CensoredPoints(B[:5], np.log(S[:5]), np.array([]), np.array([]))
    base = censored_fit(obs)
    fit5 = base["s_min"] + base["e_min"] / 128
    # a bound far below what the fit predicts at B = 128 says almost nothing
    weak = censored_fit(CensoredPoints(B[:5], np.log(S[:5]), np.array([128.0]), np.array([math.log(fit5) - 3.0])))
    assert weak["b_crit"] == pytest.approx(base["b_crit"], rel=1e-3)
    # a bound above it says B = 128 needs more steps than the fit gives: S_min is larger, b_crit smaller
    strong = censored_fit(CensoredPoints(B[:5], np.log(S[:5]), np.array([128.0]), np.array([math.log(fit5) + 0.3])))
    assert strong["s_min"] > base["s_min"]
    assert strong["b_crit"] < base["b_crit"]


def test_the_censored_fit_needs_three_batch_sizes_that_reached_the_target():
    with pytest.raises(ValueError, match="at least 3"):
        censored_fit(CensoredPoints(B[:2], np.log(_noisy(0)[:2]), B[2:], np.log(_noisy(0)[2:])))


def test_analyze_points_puts_censored_batch_sizes_in_the_fit_and_names_them():
    S = _noisy(5)
    plain = analyze_points(B[:5], S[:5], 16.0)
    with_c = analyze_points(B[:5], S[:5], 16.0, censored=[(128.0, float(S[5]) * 0.9), (256.0, float(S[6]) * 0.9)])
    assert plain["censored_in_fit"] == []
    assert with_c["censored_in_fit"] == [128.0, 256.0]
    assert with_c["fitted_batch_sizes"] == plain["fitted_batch_sizes"] == [4.0, 8.0, 16.0, 32.0, 64.0]
    assert with_c["b_crit"] != plain["b_crit"]
    # a bound of None (every trial diverged) or a batch size too few others reached: left out
    assert analyze_points(B[:5], S[:5], 16.0, censored=[(128.0, None)])["b_crit"] == plain["b_crit"]


def test_a_batch_size_with_one_seed_short_of_the_target_is_censored_at_the_mean_of_its_seeds():
    S = _noisy(6)
    bs = list(B[:5]) + [64.0]
    steps = list(S[:5]) + [float(S[4]) * 1.1]  # B = 64 has two seeds that reached it...
    out = analyze_points(bs, steps, 16.0, censored=[(64.0, float(S[4]) * 1.3)])  # ...and one that did not
    assert out["censored_in_fit"] == [64.0]
    assert 64.0 not in out["fitted_batch_sizes"]
