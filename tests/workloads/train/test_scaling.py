import math

import pytest

from workloads.train.scaling import beta2_from_half_life, half_life_from_beta2, scaled_lr


@pytest.mark.parametrize(
    "rule,expected",
    [("linear", 0.003 * 4), ("sqrt", 0.003 * 2), ("none", 0.003)],
)
def test_scaled_lr_by_hand(rule, expected):
    # B = 64, B0 = 16: kappa = 4
    assert scaled_lr(0.003, 16, 64, rule) == pytest.approx(expected)


def test_scaled_lr_multiplier_and_smaller_batch():
    # sqrt rule, B = 4, B0 = 16 -> lr * 0.5, times m = 1.5
    assert scaled_lr(0.002, 16, 4, "sqrt", 1.5) == pytest.approx(0.002 * 0.5 * 1.5)


def test_scaled_lr_rejects_unknown_rule():
    with pytest.raises(ValueError, match="unknown LR scaling rule"):
        scaled_lr(0.1, 1, 2, "cubic")


def test_beta2_half_life_worked_example():
    # Marek et al. 2025 / methodology 6.1: GPT-3-XL beta2 = 0.95 at 512 x 2048 tokens per step;
    # the same half-life at batch 1 gives 0.9999.
    t_half = half_life_from_beta2(0.95, 512, 2048)
    assert t_half == pytest.approx(512 * 2048 * math.log(0.5) / math.log(0.95))
    assert t_half == pytest.approx(14.16e6, rel=1e-3)
    assert beta2_from_half_life(t_half, 1, 2048) == pytest.approx(0.99990, abs=1e-5)


def test_beta2_half_life_by_hand():
    # B*T = 16*64 = 1024 tokens per step, half-life 2048 tokens -> 0.5 ** 0.5
    assert beta2_from_half_life(2048, 16, 64) == pytest.approx(math.sqrt(0.5))
    # half the half-life -> beta2 squared relation: beta(2B) = beta(B)**2
    b1 = beta2_from_half_life(10000, 8, 64)
    assert beta2_from_half_life(10000, 16, 64) == pytest.approx(b1**2)


def test_half_life_rejects_bad_beta():
    with pytest.raises(ValueError):
        half_life_from_beta2(1.0, 1, 1)
