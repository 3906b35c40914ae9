"""The power law of the critical batch size in the token budget: recovered from synthetic studies with a known
exponent, its interval covering at its level, its prediction interval widening with the extrapolation, and its
statuses (too few budgets, a member not ok, curvature)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweeps.errors import InvalidInput
from sweeps.scaling import StudyMember, fit_power_law, log_standard_error

Z95 = 1.959963984540054
#: the widths (upper/lower of a 95 % interval) of one sweep's b_crit on real training, per target loss, as the
#: replay of real curves measured them (benchmarks/real_coverage.py; docs/benchmarks.md): 1.9x to 3.6x
REPLAY_WIDTHS = (1.93, 2.49, 3.49, 3.47, 3.63)


def _member(tokens: float, ln_b: float, width: float, status: str = "ok") -> StudyMember:
    half = math.log(width) / 2
    return StudyMember(
        tokens=tokens,
        batch_size_sequences=math.exp(ln_b),
        batch_size_ci_sequences=(math.exp(ln_b - half), math.exp(ln_b + half)),
        status=status,
    )


def _study(rng, gamma: float, budgets, b0: float = 12.0, d0: float = 2.6e5) -> list[StudyMember]:
    """Members whose estimates scatter around the law by exactly the error their intervals claim."""
    out = []
    for d in budgets:
        width = float(rng.choice(REPLAY_WIDTHS))
        se = math.log(width) / (2 * Z95)
        out.append(_member(d, math.log(b0) + gamma * math.log(d / d0) + rng.normal(0, se), width))
    return out


def test_the_standard_error_of_a_symmetric_log_interval():
    assert log_standard_error((10 / math.e, 10 * math.e), 0.95) == pytest.approx(1 / Z95)
    with pytest.raises(InvalidInput, match="positive and increasing"):
        log_standard_error((3.0, 2.0), 0.95)


def test_a_noiseless_study_recovers_the_exponent_and_level():
    members = [_member(d, math.log(12 * (d / 2.6e5) ** 0.5), 2.0) for d in (1.3e5, 2.6e5, 5.2e5, 1.05e6)]
    law = fit_power_law(members)
    assert law.gamma == pytest.approx(0.5, abs=1e-9)
    assert law.predict(2.6e5).batch_size_sequences == pytest.approx(12.0, rel=1e-9)
    assert law.status == "ok" and law.tau2 == 0.0
    assert law.gamma_ci[0] < 0.5 < law.gamma_ci[1]


@pytest.mark.parametrize("n_budgets", [2, 3, 4, 5])
def test_the_exponents_interval_covers_at_its_level_on_simulated_studies(n_budgets):
    """Each member errs as much as its interval says (the replay of real training measured its intervals to
    cover at least that: 60 of 60); the exponent's 95 % interval must then cover the true exponent in >= 93 %."""
    rng = np.random.default_rng(n_budgets)
    budgets = [1.3e5 * 2.0**k for k in range(n_budgets)]
    trials = 1000
    covered = 0
    for _ in range(trials):
        law = fit_power_law(_study(rng, 0.45, budgets))
        covered += law.gamma_ci[0] <= 0.45 <= law.gamma_ci[1]
    assert covered / trials >= 0.93, covered / trials


def test_a_random_exponent_is_not_found_where_there_is_none():
    """Against chance: with no growth (gamma = 0), the interval holds 0 as often as its level says."""
    rng = np.random.default_rng(7)
    budgets = [1.3e5 * 2.0**k for k in range(4)]
    holds_zero = sum(fit_power_law(_study(rng, 0.0, budgets)).gamma_ci[0] <= 0.0 for _ in range(1000))
    assert holds_zero / 1000 >= 0.93


def test_the_prediction_interval_widens_with_the_extrapolation():
    members = _study(np.random.default_rng(3), 0.5, [1.3e5, 2.6e5, 5.2e5, 1.05e6])
    law = fit_power_law(members)
    widths = []
    for factor in (1, 10, 100, 1000):
        p = law.predict(1.05e6 * factor)
        assert p.extrapolation_factor == pytest.approx(factor)
        assert p.interval[0] < p.batch_size_sequences < p.interval[1]
        widths.append(p.interval[1] / p.interval[0])
    assert widths == sorted(widths) and widths[-1] > 2 * widths[0]


def test_two_budgets_give_an_interval_from_the_members_alone_and_say_the_form_is_untested():
    law = fit_power_law([_member(1.7e9, math.log(2000), 1.3), _member(2.4e10, math.log(11000), 1.4)])
    se = math.hypot(math.log(1.3), math.log(1.4)) / (2 * Z95) / math.log(2.4e10 / 1.7e9)
    assert law.gamma_ci[1] - law.gamma == pytest.approx(Z95 * se, rel=1e-9)
    assert any("assumed, not tested" in c for c in law.caveats)


def test_statuses_too_few_budgets_member_not_ok_and_curvature():
    with pytest.raises(InvalidInput, match="too_few_budgets"):
        fit_power_law([_member(1e6, 2.0, 2.0), StudyMember(2e6, None, None, status="above_range", label="big")])
    law = fit_power_law(
        [
            _member(1e6, 2.0, 2.0),
            _member(2e6, 2.4, 2.0, status="edge"),
            StudyMember(4e6, None, None, status="above_range", label="big"),
        ]
    )
    assert law.status == "member_not_ok" and law.excluded == ["big: status above_range, no interval"]
    bent = [_member(1e6 * 2.0**k, 2.0 + 0.6 * k - 0.15 * k * k, 1.05) for k in range(5)]
    assert fit_power_law(bent).status == "curvature"
    straight = [_member(1e6 * 2.0**k, 2.0 + 0.6 * k, 1.05) for k in range(5)]
    assert fit_power_law(straight).status == "ok"


def test_model_size_moving_with_the_budget_is_said_to_be_inseparable():
    members = [
        StudyMember(20 * n, 100 * (n / 1e8) ** 0.5, (80 * (n / 1e8) ** 0.5, 125 * (n / 1e8) ** 0.5), n_params=n)
        for n in (1e8, 4e8, 1.6e9)
    ]
    assert "cannot tell data size from model size" in fit_power_law(members).n_params_note


def test_model_size_apart_from_the_budget_gets_its_own_exponent():
    """Members at crossed sizes and budgets where b_crit depends on D only: the model-size exponent's interval
    holds 0 and the data exponent is the true one."""
    members = []
    for i, (n, d) in enumerate([(1e8, 2e9), (1e8, 8e9), (4e8, 2e9), (4e8, 8e9), (1.6e9, 4e9), (1.6e9, 1.6e10)]):
        b = 100 * (d / 2e9) ** 0.5 * (1 + 0.02 * (-1) ** i)
        members.append(StudyMember(d, b, (b / 1.3, b * 1.3), n_params=n))
    note = fit_power_law(members).n_params_note
    assert "at fixed D, ~ N^" in note
    lo, hi = (float(x) for x in note.split("interval [")[1].split("]")[0].split(", "))
    assert lo < 0 < hi
    assert abs(float(note.split("at fixed N ~ D^")[1].split(" ")[0]) - 0.5) < 0.05


def test_the_answer_says_a_prediction_below_the_smallest_budget_is_an_extrapolation():
    from sweeps.scaling import scale_result

    members = [_member(d, math.log(12 * (d / 2.6e5) ** 0.5), 2.0) for d in (1.3e5, 2.6e5, 5.2e5)]
    assert "extrapolated 130x below the smallest budget swept" in scale_result(members, predict_tokens=1e3)["answer"]
    assert "inside the budgets swept" in scale_result(members, predict_tokens=3e5)["answer"]
    assert "extrapolated 3.85x beyond the largest budget swept" in scale_result(members, predict_tokens=2e6)["answer"]


def test_the_plots_prediction_label_says_beyond_only_beyond_the_largest_budget():
    from sweeps.scaling.plot import _prediction_label

    assert _prediction_label(954.0) == "prediction, 954x beyond the largest budget"
    assert _prediction_label(0.417) == "prediction, at 0.417x the largest budget"
