"""The gradient-noise-scale estimator against a problem whose tr(Sigma)/|G|^2 is known."""

import numpy as np
import pytest

from workloads.train.noise_scale import NoiseScaleEMA, step_estimates


def test_step_estimates_need_two_micro_batches():
    with pytest.raises(ValueError):
        step_estimates(1.0, 1.0, 4, 1)


def test_recovers_known_noise_scale_on_linear_regression():
    """Least squares with x ~ N(0, I_d), y = w*.x + e, e ~ N(0, s^2), evaluated at w = w* + delta.

    Per-example gradient g = (delta.x - e) x, so G = delta and
    E|g|^2 = |delta|^2 (d + 2) + s^2 d, hence tr(Sigma) = |delta|^2 (d + 1) + s^2 d and
    B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, Eq. 2.9).
    """
    rng = np.random.default_rng(0)
    d, s = 20, 0.5
    delta = rng.normal(size=d) * 0.3
    truth = (delta @ delta * (d + 1) + s**2 * d) / (delta @ delta)
    b, K = 8, 4  # micro-batches of 8 examples, 4 per step (B_big = 32)
    ema = NoiseScaleEMA(decay=0.999)
    for _ in range(6000):
        x = rng.normal(size=(K, b, d))
        e = rng.normal(size=(K, b)) * s
        r = np.einsum("kbd,d->kb", x, delta) - e
        g_micro = np.einsum("kb,kbd->kd", r, x) / b  # mean gradient per micro-batch
        n_s = float(np.mean(np.sum(g_micro**2, axis=1)))
        n_b = float(np.sum(g_micro.mean(axis=0) ** 2))
        ema.update(*step_estimates(n_s, n_b, b, K))
    assert ema.b_simple == pytest.approx(truth, rel=0.10)
    assert ema.grad_sq_norm == pytest.approx(delta @ delta, rel=0.10)


def test_ema_skips_non_finite_and_round_trips():
    ema = NoiseScaleEMA(decay=0.5)
    ema.update(float("nan"), 1.0)
    assert ema.b_simple is None
    ema.update(2.0, 8.0)
    assert ema.b_simple == pytest.approx(4.0)
    other = NoiseScaleEMA()
    other.load_state_dict(ema.state_dict())
    assert other.b_simple == pytest.approx(4.0)
