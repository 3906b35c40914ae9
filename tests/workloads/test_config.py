"""The trial config: nested frozen sections, an exact dict round trip, errors that name the field,
and the test-only fault plan."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
from pydantic import ValidationError

from workloads.config import (
    BatchConfig,
    DataConfig,
    EvalConfig,
    FinetuneConfig,
    LoraConfig,
    OptimizerConfig,
    RungGateConfig,
    TrialConfig,
    WorkloadConfig,
)
from workloads.errors import DataError
from workloads.testing.faults import FaultPlan


def full() -> TrialConfig:
    return TrialConfig(
        trial_id="t",
        workload=WorkloadConfig(
            name="finetune",
            data=DataConfig(path="/x.jsonl"),
            finetune=FinetuneConfig(checkpoint_dir="/ck", lora=LoraConfig(rank=4)),
        ),
        budget_tokens=4096,
        optimizer=OptimizerConfig(lr=1e-3, beta2_half_life_tokens=2048.0, grad_clip_norm=None),
        batch=BatchConfig(batch_size_sequences=8, warmup=((0, 1), (1024, 2))),
        eval=EvalConfig(milestones_tokens=(2048, 4096)),
        rung_gate=RungGateConfig(barrier_tokens=(2048.0,), key="k"),
    )


def test_to_dict_and_from_dict_round_trip_exactly_also_through_json():
    c = full()
    assert TrialConfig.from_dict(c.to_dict()) == c
    assert TrialConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c  # lists become tuples again
    d = c.to_dict()
    assert d["workload"]["finetune"]["lora"]["target_modules"] == ("q_proj", "v_proj")
    assert d["batch"]["warmup"] == ((0, 1), (1024, 2))


def test_sections_are_frozen():
    c = full()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.batch.batch_size_sequences = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="frozen"):  # a section the spec embeds: a frozen pydantic model
        c.optimizer.lr = 1.0  # type: ignore[misc]


def test_unknown_keys_are_named_by_their_dotted_path():
    d = full().to_dict()
    d["optimizer"]["lrr"] = 1.0
    with pytest.raises(ValueError, match=r"unknown trial config keys: \['optimizer.lrr'\]"):
        TrialConfig.from_dict(d)
    d = full().to_dict()
    d["workload"]["finetune"]["lora"]["r"] = 4
    with pytest.raises(ValueError, match=r"\['workload.finetune.lora.r'\]"):
        TrialConfig.from_dict(d)


def test_workload_names_and_the_finetune_section_are_checked_at_construction():
    with pytest.raises(ValueError, match="unknown workload 'distill'"):
        WorkloadConfig(name="distill", data=DataConfig(path="x"))
    with pytest.raises(DataError, match="needs a 'finetune' section"):
        WorkloadConfig(name="finetune", data=DataConfig(path="x"))
    with pytest.raises(ValidationError, match=r"prompt_template\n.*must contain '\{prompt\}'"):
        FinetuneConfig(checkpoint_dir="x", prompt_template="Question: ")
    with pytest.raises(ValidationError, match=r"packing\n.*'packed' or 'padded'"):
        FinetuneConfig(checkpoint_dir="x", packing="zipped")


def test_lora_to_dict_is_the_json_of_the_meta_file():
    assert LoraConfig(rank=4, alpha=8.0).to_dict() == {
        "rank": 4,
        "alpha": 8.0,
        "dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
    }


def test_fault_plan_fires_on_the_first_attempt_at_its_milestone_only(tmp_path):
    plan = FaultPlan(fail_at_milestone=2)
    plan.before_report(1, 0)
    plan.before_report(2, 1)
    with pytest.raises(RuntimeError, match="injected fault at milestone 2"):
        plan.before_report(2, 0)
    hold = tmp_path / "hold"
    hold.touch()
    plan = FaultPlan(hold_at_milestone=1, hold_file=str(hold))
    plan.after_report(0, 0)  # other milestones and later attempts do not wait
    plan.after_report(1, 1)
    threading.Timer(0.3, hold.unlink).start()
    t0 = time.monotonic()
    plan.after_report(1, 0, poll_s=0.01)
    # it returned because the file went (the timer's unlink at 0.3 s), not before
    assert time.monotonic() - t0 >= 0.25 and not hold.exists()
