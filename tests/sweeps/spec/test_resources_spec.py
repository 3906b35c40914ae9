"""resources' training options: parallelism, compile, activation checkpointing, mixed precision."""

import copy

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.launch.trainable import batch_plan_params, training_params, trial_config
from sweeps.spec import SpecError, parse_spec
from sweeps.tracking import schema
from tests.conftest import write_spec

NEW = ("parallelism", "compile", "activation_checkpointing", "mixed_precision")
HP = {
    "batch_size_sequences": 8,
    "seed": 0,
    "lr": 1e-3,
    "lr_rule": "sqrt",
    "beta2": 0.99,
    "beta2_half_life_tokens": 4096.0,
}


def _with(d: dict, **resources) -> dict:
    d = copy.deepcopy(d)
    d.setdefault("resources", {}).update(resources)
    return d


def test_defaults_are_todays_path_and_leave_the_dump_and_fingerprint_as_before(tiny_spec_dict):
    s = parse_spec(tiny_spec_dict)
    r = s.resources
    assert (r.parallelism, r.compile, r.activation_checkpointing, r.mixed_precision) == ("ddp", False, False, "auto")
    assert not set(NEW) & set(s.model_dump()["resources"])  # spec.yaml and the sweep id as before the fields
    changed = parse_spec(_with(tiny_spec_dict, compile=True))
    assert changed.model_dump()["resources"]["compile"] is True
    assert changed.fingerprint() != s.fingerprint()
    assert parse_spec(changed.model_dump(mode="json")) == changed  # round trip through spec.yaml


def test_the_options_reach_the_trial_config_and_the_mlflow_params(tiny_spec_dict):
    d = _with(
        tiny_spec_dict,
        parallelism="fsdp",
        workers_per_trial=2,
        compile=True,
        activation_checkpointing=True,
        mixed_precision="bf16",
    )
    s = parse_spec(d)
    t = trial_config(s, HP, "t0", data_path="x").training
    assert (t.parallelism, t.compile, t.activation_checkpointing, t.mixed_precision) == ("fsdp", True, True, "bf16")
    assert training_params(s) == {
        "parallelism": "fsdp",
        "compile": True,
        "activation_checkpointing": True,
        "mixed_precision": "bf16",
        "sync": "ddp",
        "sync_every_steps": 1,
        "replicas": 2,
    }
    assert tuple(training_params(s)) == schema.TRAINING_PARAMS


def test_fsdp_with_the_noise_scale_plans_two_micro_batches_per_worker(tiny_spec_dict):
    ddp = parse_spec(_with(tiny_spec_dict, workers_per_trial=2, micro_batch_size_sequences_max=64))
    fsdp = parse_spec(_with(tiny_spec_dict, workers_per_trial=2, micro_batch_size_sequences_max=64, parallelism="fsdp"))
    assert batch_plan_params(ddp, 8) == {"micro_batch_size_sequences": 4, "grad_accum_steps": 1, "workers": 2}
    assert batch_plan_params(fsdp, 8) == {"micro_batch_size_sequences": 2, "grad_accum_steps": 2, "workers": 2}


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {"parallelism": "fsdp", "workers_per_trial": 1},
            "resources.parallelism: fsdp shards the model over a trial's "
            "workers and needs workers_per_trial >= 2 (got 1)",
        ),
        ({"parallelism": "zero3"}, "resources.parallelism"),
        ({"mixed_precision": "fp16"}, "resources.mixed_precision"),
        ({"compile": "yes"}, "resources.compile"),
        ({"activation_checkpointing": 1}, "resources.activation_checkpointing"),
    ],
)
def test_bad_options_are_refused_naming_the_field(tiny_spec_dict, changes, message):
    with pytest.raises(SpecError) as e:
        parse_spec(_with(tiny_spec_dict, **changes))
    assert message in str(e.value)


def test_fsdp_is_refused_for_finetuning_and_branching(tiny_spec_dict):
    d = _with(tiny_spec_dict, parallelism="fsdp", workers_per_trial=2)
    d["workload"], d["finetune"] = "finetune", {"checkpoint_dir": "/nowhere"}
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    assert "resources.parallelism: fsdp is for the pretrain workload; finetune (full or LoRA) runs ddp" in str(e.value)
    d = _with(tiny_spec_dict, parallelism="fsdp", workers_per_trial=2)
    d["branch"] = {}
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    assert "resources.parallelism: fsdp cannot run branch" in str(e.value)


def test_cli_validate_exits_2_on_a_bad_training_option(tmp_path, tiny_spec_dict):
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, _with(tiny_spec_dict, mixed_precision="fp8")))])
    assert r.exit_code == 2, r.output
    assert "resources.mixed_precision" in r.output
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, _with(tiny_spec_dict, parallelism="fsdp")))])
    assert r.exit_code == 2, r.output
    assert "workers_per_trial >= 2" in r.output
