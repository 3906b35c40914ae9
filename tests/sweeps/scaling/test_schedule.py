"""The batch-size ramp from a study's law: doubling stages that start under the lower end of the law's interval,
the same ramp in each trainer's format (checked against each format's documented rules: Megatron-LM's
``--step-batch-size-schedule``, OLMo-core's ``BatchSizeSchedulerCallback`` checks, Levanter's ``ScheduleStep``
offsets; critbatch's own ``batch_warmup`` block with its spec model and the loop's step count), and the steps it
saves over the largest fixed batch that stays under b_crit from the start."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.errors import InvalidInput
from sweeps.scaling import StudyMember, scale_result
from sweeps.scaling.schedule import batch_size_ramp, bounded_ramp, ceiling_sequences, ramp_formats


def _result(gamma: float = 0.5):
    members = [
        StudyMember(d, 16 * (d / 2.6e5) ** gamma, (12 * (d / 2.6e5) ** gamma, 21 * (d / 2.6e5) ** gamma))
        for d in (1.3e5, 2.6e5, 5.2e5, 1.05e6)
    ]
    return scale_result(members, predict_tokens=1e8)


def test_each_stage_doubles_and_starts_under_the_lower_bound():
    result = _result()
    ramp = batch_size_ramp(result, 1e8, 64)
    stages = ramp["stages"]
    assert stages[0]["start_tokens"] == 0 and len(stages) >= 4
    for prev, s in zip(stages, stages[1:]):
        assert s["batch_size_sequences"] == 2 * prev["batch_size_sequences"]
        assert ceiling_sequences(result, s["start_tokens"]) >= s["batch_size_sequences"]
        # a stage starts on a whole step of the one before it
        assert (s["start_tokens"] - prev["start_tokens"]) == (s["start_step"] - prev["start_step"]) * prev[
            "batch_size_sequences"
        ] * 64
    assert ramp["steps"] < ramp["fixed_steps"] == math.ceil(1e8 / (stages[0]["batch_size_sequences"] * 64))


def test_the_formats_follow_each_trainers_rules():
    ramp = batch_size_ramp(_result(), 1e8, 64)
    f = ramp_formats(ramp)
    # Megatron-LM: "T0:BS0 T1:BS1 ...", thresholds in tokens, the first 0, batch sizes in samples
    pairs = [tuple(int(x) for x in item.split(":")) for item in f["megatron"].split()]
    assert pairs[0][0] == 0 and [p[0] for p in pairs] == sorted({p[0] for p in pairs})
    # OLMo-core: as many batch sizes (tokens) as Durations, starting at 0, increasing, integer factors, no repeats
    olmo = f["olmo_core"]
    assert len(olmo["batch_sizes"]) == len(olmo["schedule"]) and olmo["schedule"][0]["value"] == 0
    assert {d["unit"] for d in olmo["schedule"]} == {"tokens"}
    # the class names OLMo-core's TrainerConfig.from_dict needs to build the callback and its Durations
    assert olmo["_CLASS_"] == "olmo_core.train.callbacks.batch_size_scheduler.BatchSizeSchedulerCallback"
    assert {d["_CLASS_"] for d in olmo["schedule"]} == {"olmo_core.train.common.Duration"}
    for a, b in zip(olmo["batch_sizes"], olmo["batch_sizes"][1:]):
        assert b > a and b % a == 0
    # Levanter: the token offset its BatchSchedule computes at each start step equals the ramp's start tokens
    steps = f["levanter"]["train_batch_size"]
    offset = 0
    for prev, s, stage in zip(steps, steps[1:], ramp["stages"][1:]):
        offset += (s["start"] - prev["start"]) * prev["value"]
        assert offset * 64 == stage["start_tokens"]


def _ramp_phases(ramp):
    """``[(batch_size_sequences, steps), ...]`` of the ramp's stages, from their start steps and its total."""
    stages = ramp["stages"]
    ends = [s["start_step"] for s in stages[1:]] + [ramp["steps"]]
    return [(s["batch_size_sequences"], end - s["start_step"]) for s, end in zip(stages, ends)]


@pytest.mark.parametrize("total_tokens", [1e6, 1e8])
def test_the_critbatch_block_is_a_batch_warmup_spec_that_takes_the_ramps_steps(total_tokens):
    from sweeps.spec.sections import BatchWarmupSpec
    from workloads.train.batching import batch_schedule_steps

    ramp = batch_size_ramp(_result(), total_tokens, 64)
    block = ramp_formats(ramp)["critbatch"]
    warmup = BatchWarmupSpec.model_validate(block["batch_warmup"])
    assert len(warmup.schedule) == len(ramp["stages"]) >= 2
    assert block["final_batch_size_sequences"] == ramp["stages"][-1]["batch_size_sequences"]
    phases = batch_schedule_steps(int(total_tokens), 64, block["final_batch_size_sequences"], warmup.schedule)
    assert phases == _ramp_phases(ramp) and sum(n for _, n in phases) == ramp["steps"]


def test_the_critbatch_block_trains_in_a_spec_and_leaves_out_a_stage_of_no_steps():
    import yaml

    from sweeps.spec import parse_spec
    from tests.conftest import ROOT

    stages = [
        {"start_tokens": 0, "batch_size_sequences": 4, "start_step": 0},
        {"start_tokens": 2048, "batch_size_sequences": 8, "start_step": 8},  # no steps: the next starts here too
        {"start_tokens": 2048, "batch_size_sequences": 16, "start_step": 8},
    ]
    block = ramp_formats({"stages": stages, "steps": 12, "tokens_per_sequence": 64})["critbatch"]
    assert block == {"batch_warmup": {"schedule": [[0, 1], [2048, 4]]}, "final_batch_size_sequences": 16}
    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "shakespeare-char.yaml").read_text())
    d["data"]["path"] = str(ROOT / d["data"]["path"])
    d["batch_warmup"] = block["batch_warmup"]
    d["search"]["batch_sizes_sequences"] = [block["final_batch_size_sequences"]]
    warmup = parse_spec(d).batch_warmup
    assert warmup is not None and warmup.schedule == [(0, 1), (2048, 4)]


def test_a_law_that_does_not_grow_has_no_ramp():
    with pytest.raises(InvalidInput, match="does not grow"):
        batch_size_ramp(_result(gamma=-0.2), 1e8, 64)


def test_the_command_writes_the_five_formats(tmp_path):
    import json

    (tmp_path / "scale.json").write_text(json.dumps(_result()))
    res = CliRunner().invoke(
        app,
        [
            "schedule",
            str(tmp_path / "scale.json"),
            "--total-tokens",
            "1e8",
            "--tokens-per-sequence",
            "64",
            "--output",
            str(tmp_path / "s"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "critbatch.yaml",
        "levanter.yaml",
        "megatron.txt",
        "olmo_core.json",
        "schedule.json",
    ]
    assert (tmp_path / "s" / "megatron.txt").read_text().startswith('--step-batch-size-schedule "0:')
    import yaml

    from sweeps.spec.sections import BatchWarmupSpec

    text = (tmp_path / "s" / "critbatch.yaml").read_text()
    assert text.startswith("# a critbatch spec block") and "search.batch_sizes_sequences: [" in text
    warmup = yaml.safe_load(text)["batch_warmup"]
    assert BatchWarmupSpec.model_validate(warmup).schedule[0] == (0, 1)
    res = CliRunner().invoke(
        app,
        [
            "schedule",
            str(tmp_path / "nope.json"),
            "--total-tokens",
            "1e8",
            "--tokens-per-sequence",
            "64",
            "--output",
            str(tmp_path / "t"),
        ],
    )
    assert res.exit_code == 2 and "not a study's scale.json" in res.output and not (tmp_path / "t").exists()


def test_a_lower_bound_under_one_sequence_starts_the_ramp_at_one_and_says_so():
    members = [
        StudyMember(d, 2 * (d / 2.6e5) ** 0.5, (0.3 * (d / 2.6e5) ** 0.5, 12 * (d / 2.6e5) ** 0.5))
        for d in (1.3e5, 2.6e5)
    ]
    ramp = batch_size_ramp(scale_result(members), 1e8, 64)
    assert ramp["stages"][0]["batch_size_sequences"] == 1 and "under one" in ramp["warnings"][0]


def test_the_ceiling_read_from_scale_json_is_the_laws_own_lower_bound():
    from sweeps.scaling import fit_power_law

    members = [
        StudyMember(d, 16 * (d / 2.6e5) ** 0.5, (12 * (d / 2.6e5) ** 0.5, 21 * (d / 2.6e5) ** 0.5))
        for d in (1.3e5, 2.6e5, 5.2e5, 1.05e6)
    ]
    law, result = fit_power_law(members), scale_result(members)
    for tokens in (1e5, 1e6, 1e8):
        assert ceiling_sequences(result, tokens) == pytest.approx(law.predict(tokens).interval[0], rel=1e-12)


def test_a_run_shorter_than_the_smallest_budget_studied_is_warned_about():
    result = _result()
    assert not any("fewer than the smallest budget" in w for w in batch_size_ramp(result, 1e8, 64)["warnings"])
    short = batch_size_ramp(result, 1e4, 64)["warnings"]
    assert any("1e+04 tokens are fewer than the smallest budget the study measured (1.3e+05)" in w for w in short)
    both = bounded_ramp(1e4, 64, result=result, local_cbs=[(0.0, 8.0)])["warnings"]
    assert any("fewer than the smallest budget" in w for w in both)


def test_a_law_of_the_20_percent_cbs_is_warned_about():
    members = [
        StudyMember(d, 20 * (d / 2.6e5) ** 0.3, (17 * (d / 2.6e5) ** 0.3, 24 * (d / 2.6e5) ** 0.3))
        for d in (1.3e5, 2.6e5, 5.2e5, 1.05e6)
    ]
    cbs_20 = {**scale_result(members), "quantity": "cbs_20"}
    assert any("law is of cbs_20, not b_crit" in w for w in batch_size_ramp(cbs_20, 1e7, 64)["warnings"])
    assert not any("not b_crit" in w for w in batch_size_ramp(_result(), 1e7, 64)["warnings"])


def test_no_stage_exceeds_the_largest_batch_allowed_not_even_the_first():
    result = _result()
    first = batch_size_ramp(result, 1e8, 64)["stages"][0]["batch_size_sequences"]
    assert first >= 4
    for ramp in (
        batch_size_ramp(result, 1e8, 64, max_batch_size_sequences=first // 2 + 1),
        bounded_ramp(1e8, 64, result=result, max_batch_size_sequences=first // 2 + 1),
    ):
        assert [s["batch_size_sequences"] for s in ramp["stages"]] == [first // 2]
        assert ramp["fixed_batch_size_sequences"] == first // 2
