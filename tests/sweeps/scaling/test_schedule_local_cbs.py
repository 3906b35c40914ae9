"""The ramp under the local critical batch size measured by branching (Merrill et al. 2025; ``critbatch branch``):
interpolated in log-log between its points, held (not extrapolated) beyond the last, a stage held back where the
measured value falls again, and under the lower of it and the study's law where both are given."""

from __future__ import annotations

import math

import pytest

from sweeps.errors import InvalidInput
from sweeps.scaling import StudyMember, scale_result
from sweeps.scaling.schedule import (
    bounded_ramp,
    ceiling_sequences,
    local_cbs_points,
    local_ceiling_sequences,
    ramp_formats,
)

# branch points at 0, 64,000 and 256,000 tokens seen: 8, 16 and 64 sequences (slope 1 in log-log after 64,000)
POINTS = [(0.0, 8.0), (64_000.0, 16.0), (256_000.0, 64.0)]


def test_the_local_ceiling_interpolates_in_log_log_and_holds_the_last_value():
    assert local_ceiling_sequences(POINTS, 0) == 8
    assert local_ceiling_sequences(POINTS, 30_000) == 8  # from 0 tokens: the lower of the two ends
    assert local_ceiling_sequences(POINTS, 128_000) == pytest.approx(32, rel=1e-12)  # half-way in log: sqrt(16 * 64)
    assert local_ceiling_sequences(POINTS, 4e6) == 64  # held, not extrapolated to 1,024
    later = [(1000.0, 4.0), (8000.0, 32.0)]
    assert local_ceiling_sequences(later, 10) == 4  # before the first point: its value
    assert local_ceiling_sequences(later, 2000) == pytest.approx(8, rel=1e-12)


def test_points_come_from_branchs_list_sorted_and_without_the_unmeasured():
    raw = [
        {"tokens_seen": 256000, "k_star": 8, "local_cbs_sequences": 64},
        {"tokens_seen": 0, "k_star": 1, "local_cbs_sequences": 8},
        {"tokens_seen": 128000, "k_star": None, "local_cbs_sequences": None},
    ]
    assert local_cbs_points(raw) == [(0.0, 8.0), (256000.0, 64.0)]
    with pytest.raises(InvalidInput, match="no point has a local CBS"):
        local_cbs_points([{"tokens_seen": 0, "k_star": None, "local_cbs_sequences": None}])
    with pytest.raises(InvalidInput, match="not critbatch branch's"):
        local_cbs_points([{"tokens": 0}])


def test_each_stage_starts_where_the_local_cbs_reaches_it_on_a_whole_step():
    ramp = bounded_ramp(1e6, 64, local_cbs=POINTS)
    stages = ramp["stages"]
    assert [s["batch_size_sequences"] for s in stages] == [8, 16, 32, 64]
    assert {s["bound"] for s in stages} == {"local_cbs"} and ramp["bounds"] == ["local_cbs"]
    assert stages[1]["start_tokens"] == 64_000  # a measured point: 125 steps of 8 x 64 tokens
    assert 128_000 <= stages[2]["start_tokens"] <= 128_000 * 1.01 + 16 * 64  # read on the grid, late not early
    assert stages[3]["start_tokens"] >= 256_000
    for s, nxt in zip(stages, stages[1:] + [{"start_tokens": 1e6}]):
        for t in [s["start_tokens"] + (nxt["start_tokens"] - s["start_tokens"]) * i / 50 for i in range(50)]:
            assert s["batch_size_sequences"] <= local_ceiling_sequences(POINTS, t) * (1 + 1e-12)
    assert ramp["steps"] < ramp["fixed_steps"] == math.ceil(1e6 / (8 * 64))
    assert "holds its last value (64 sequences)" in ramp["warnings"][0]


def test_a_local_cbs_that_falls_again_holds_the_stage_back():
    dip = [(0.0, 8.0), (100_000.0, 32.0), (200_000.0, 16.0), (400_000.0, 32.0)]
    stages = bounded_ramp(1e6, 64, local_cbs=dip)["stages"]
    assert [s["batch_size_sequences"] for s in stages] == [8, 16, 32]
    assert 100_000 <= stages[1]["start_tokens"] < 100_000 + 8 * 64
    assert stages[2]["start_tokens"] >= 400_000  # not at 100,000, where 32 was first reached


def _law():
    members = [
        StudyMember(d, 16 * (d / 2.6e5) ** 0.5, (12 * (d / 2.6e5) ** 0.5, 21 * (d / 2.6e5) ** 0.5))
        for d in (1.3e5, 2.6e5, 5.2e5, 1.05e6)
    ]
    return scale_result(members, predict_tokens=1e8)


def test_with_a_law_the_ramp_stays_under_the_lower_of_the_two_and_says_which():
    result = _law()
    local = [(0.0, 2.0), (1e6, 64.0), (1e7, 4096.0)]  # under the law early, far above it late
    ramp = bounded_ramp(1e8, 64, result=result, local_cbs=local)
    stages = ramp["stages"]
    assert ramp["bounds"] == ["law", "local_cbs"]
    assert stages[0]["bound"] == "local_cbs" and stages[-1]["bound"] == "law"
    smallest = min(m["tokens"] for m in result["members"])
    for s, nxt in zip(stages, stages[1:] + [{"start_tokens": 1e8}]):
        for t in [s["start_tokens"] + (nxt["start_tokens"] - s["start_tokens"]) * i / 50 for i in range(50)]:
            law = ceiling_sequences(result, max(t, smallest))
            assert s["batch_size_sequences"] <= min(law, local_ceiling_sequences(local, t)) * (1 + 1e-12)
    # the formats take the ramp as they take the law's alone
    assert ramp_formats(ramp)["megatron"].split()[0] == f"0:{stages[0]['batch_size_sequences']}"


def test_doublings_that_fall_on_one_step_are_one_stage():
    # the law's lower end is about 19 sequences at 1e6 tokens, where the local CBS lets go of 2
    ramp = bounded_ramp(3e7, 64, result=_law(), local_cbs=[(0.0, 2.0), (1e6, 64.0), (1e7, 4096.0)])
    assert [(s["batch_size_sequences"], s["bound"]) for s in ramp["stages"]] == [(2, "local_cbs"), (16, "law")]
    assert ramp["stages"][1]["start_tokens"] >= 1e6


def test_no_bound_or_bad_sizes_are_refused():
    with pytest.raises(InvalidInput, match="scale.json, a branch run's local CBS"):
        bounded_ramp(1e6, 64)
    with pytest.raises(InvalidInput, match="must be positive"):
        bounded_ramp(0, 64, local_cbs=POINTS)


@pytest.mark.parametrize("tokens_seen, size", [(float("nan"), 8.0), (float("inf"), 8.0), (0.0, float("inf"))])
def test_points_that_are_not_finite_are_refused(tokens_seen, size):
    with pytest.raises(InvalidInput, match="finite"):
        local_cbs_points([{"tokens_seen": tokens_seen, "local_cbs_sequences": size}])


def test_a_local_cbs_first_measured_after_the_start_is_warned_about():
    late = bounded_ramp(1e5, 64, local_cbs=[(5000.0, 8.0), (50000.0, 64.0)])["warnings"]
    assert any(
        "first measured at 5e+03 tokens seen; before that the ramp holds that value (8 sequences)" in w for w in late
    )
    assert not any("first measured" in w for w in bounded_ramp(1e5, 64, local_cbs=POINTS)["warnings"])
