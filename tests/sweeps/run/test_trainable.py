"""The spec -> workload config conversion of the trainable: every section lands in its place, once, beside
the trial's run context; and the test-only hold plan is read from the environment only when a test names it."""

from __future__ import annotations

import copy

import pytest

from sweeps.launch.launcher import launcher_for, reuse_trial_actors
from sweeps.launch.trainable import SweepTrials, trial_config
from sweeps.launch.workload import workload_config
from sweeps.settings import Settings
from sweeps.spec import parse_spec
from workloads.api import TrialConfig, TrialRunContext, loop_config
from workloads.config import from_loop_config
from workloads.testing.faults import HOLD_HOOKS, FaultPlan, hold_from_env
from workloads.train.hooks import MILESTONE_HOOKS_VAR, milestone_hooks_from_env


def use_trial_runners(spec, settings=None):
    """Whether the sweep's launcher is the trial runners'."""
    return launcher_for(spec, settings).name == "trial_runners"


HP = {
    "batch_size_sequences": 8,
    "seed": 3,
    "lr": 1e-3,
    "lr_rule": "linear",
    "beta2": 0.99,
    "beta2_half_life_tokens": 4096.0,
}


def test_trial_config_takes_each_section_from_the_spec_and_the_sampled_point(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["batch_warmup"] = {"schedule": [[0, 1], [2048, 2]]}
    d["pruning"] = {"enabled": True, "mode": "pause"}
    spec = parse_spec(d)
    c = trial_config(spec, HP, "t0", data_path="/abs/input.txt", rung_gate_key="gate/t0")
    assert c.workload.name == "pretrain" and c.workload.data.path == "/abs/input.txt"
    assert c.workload.model.d_ff == spec.model.d_ff_resolved and c.context_length_tokens == 32
    assert (c.optimizer.lr, c.optimizer.lr_rule, c.optimizer.beta2_half_life_tokens) == (1e-3, "linear", 4096.0)
    assert c.batch.batch_size_sequences == 8 and c.batch.warmup == ((0, 1), (2048, 2))
    assert c.eval.milestones_tokens == tuple(spec.milestones_tokens()) and c.seed == 3
    assert c.rung_gate is not None and c.rung_gate.key == "gate/t0" and c.rung_gate.barrier_tokens
    assert TrialConfig.from_dict(c.to_dict()) == c


def test_the_trial_is_built_once_and_travels_with_its_run_context(tiny_spec_dict):
    spec = parse_spec(copy.deepcopy(tiny_spec_dict))
    wc = workload_config(spec, data_path="/abs/input.txt")
    trials = SweepTrials(
        spec_json=spec.model_dump_json(), workload=wc, storage_path="/st", save_dir_root="/save", exchange="ex"
    )
    _, cfg, context = trials.trial(HP, "t0", 12.5)
    assert cfg == trial_config(spec, HP, "t0", workload=wc)
    assert (
        context
        == TrialRunContext(
            started_unix=12.5, torch_threads=context.torch_threads, save_dir="/save/t0", checkpoint_dir="/st/train-t0"
        )
        and context.torch_threads >= 1
    )
    assert from_loop_config(loop_config(cfg, context)) == (cfg, context)
    _, _, alone = SweepTrials(spec_json=spec.model_dump_json(), workload=wc, storage_path="/st").trial(HP, "t0", 1.0)
    assert alone.save_dir is None and alone.checkpoint_dir is None  # a one-trial worker group: Ray Train keeps them


def test_the_finetune_section_and_its_lora_convert(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["workload"] = "finetune"
    d["finetune"] = {"checkpoint_dir": "/ck", "packing": "padded", "lora": {"rank": 4, "target_modules": ["q_proj"]}}
    wc = workload_config(parse_spec(d))
    assert wc.name == "finetune" and wc.finetune.packing == "padded"
    assert (wc.finetune.lora.rank, wc.finetune.lora.alpha, wc.finetune.lora.target_modules) == (4, 16.0, ("q_proj",))


def test_the_hold_plan_comes_from_the_environment_only_when_a_test_names_its_hooks(tiny_spec_dict, monkeypatch):
    for name in (
        "CRITBATCH_TEST_HOLD_AT_MILESTONE",
        "CRITBATCH_TEST_HOLD_FILE",
        "CRITBATCH_TEST_HOLD_BATCH_SIZES",
        MILESTONE_HOOKS_VAR,
    ):
        monkeypatch.delenv(name, raising=False)
    spec = parse_spec(copy.deepcopy(tiny_spec_dict))
    c8, c32 = (trial_config(spec, dict(HP, batch_size_sequences=b), "t") for b in (8, 32))
    monkeypatch.setenv("CRITBATCH_TEST_HOLD_AT_MILESTONE", "1")
    monkeypatch.setenv("CRITBATCH_TEST_HOLD_FILE", "/tmp/hold")
    assert milestone_hooks_from_env(c8) == ()  # the variables alone turn nothing on
    assert hold_from_env(c8) == [FaultPlan(hold_at_milestone=1, hold_file="/tmp/hold")]
    monkeypatch.setenv(MILESTONE_HOOKS_VAR, HOLD_HOOKS)
    assert milestone_hooks_from_env(c8) == (FaultPlan(hold_at_milestone=1, hold_file="/tmp/hold"),)
    monkeypatch.setenv("CRITBATCH_TEST_HOLD_BATCH_SIZES", "16,32")  # only trials of these batch sizes are held
    assert milestone_hooks_from_env(c32) == (FaultPlan(hold_at_milestone=1, hold_file="/tmp/hold"),)
    assert milestone_hooks_from_env(c8) == ()
    monkeypatch.delenv("CRITBATCH_TEST_HOLD_AT_MILESTONE")
    monkeypatch.delenv("CRITBATCH_TEST_HOLD_FILE")
    assert milestone_hooks_from_env(c32) == ()
    monkeypatch.setenv(MILESTONE_HOOKS_VAR, "no-colon")
    with pytest.raises(ValueError, match="module:factory"):
        milestone_hooks_from_env(c8)


def test_tune_reuses_trial_processes_with_trial_runners_and_else_only_when_no_trial_ends_early(
    tiny_spec_dict, monkeypatch
):
    pruned = []
    for mode in ("pause", "stop"):
        d = copy.deepcopy(tiny_spec_dict)
        d["pruning"] = {"enabled": True, "mode": mode}
        pruned.append(parse_spec(d))
    assert use_trial_runners(parse_spec(tiny_spec_dict)) and all(use_trial_runners(s) for s in pruned)
    assert reuse_trial_actors(parse_spec(tiny_spec_dict)) and all(reuse_trial_actors(s) for s in pruned)
    monkeypatch.setenv("CRITBATCH_TRIAL_RUNNERS", "0")  # one Ray Train run per trial
    assert not use_trial_runners(parse_spec(tiny_spec_dict))
    assert reuse_trial_actors(parse_spec(tiny_spec_dict))
    assert not any(reuse_trial_actors(s) for s in pruned)
    off = Settings(trial_runners=False)  # the settings a sweep carries decide, not the environment read later
    monkeypatch.delenv("CRITBATCH_TRIAL_RUNNERS")
    assert not use_trial_runners(parse_spec(tiny_spec_dict), off) and not any(
        reuse_trial_actors(s, off) for s in pruned
    )


def test_a_reused_actor_waits_for_the_previous_trials_thread_longer_than_tunes_two_seconds(monkeypatch):
    """Tune aborts the next trial when the finished one's thread outlives TUNE_FUNCTION_THREAD_TIMEOUT_S
    (2 s by default; seen losing a trial at load average ~20): every trial process gets 300 s."""
    import inspect

    from ray.tune.trainable import function_trainable

    from sweeps.launch.cluster import trial_env

    # the installed Tune still reads this variable where it resets a reused actor
    assert 'os.environ.get("TUNE_FUNCTION_THREAD_TIMEOUT_S"' in inspect.getsource(
        function_trainable.FunctionTrainable.reset_config
    )
    monkeypatch.delenv("TUNE_FUNCTION_THREAD_TIMEOUT_S", raising=False)
    assert int(trial_env()["TUNE_FUNCTION_THREAD_TIMEOUT_S"]) >= 60
    monkeypatch.setenv("TUNE_FUNCTION_THREAD_TIMEOUT_S", "900")  # an operator's own setting wins
    assert trial_env()["TUNE_FUNCTION_THREAD_TIMEOUT_S"] == "900"


def test_the_trials_name_their_launcher_and_an_older_object_without_one_keeps_its_meaning(tiny_spec_dict):
    """``run_trial`` resolves ``SweepTrials.launcher_name()``; without ``launcher`` (made, or pickled by Tune, before
    it was carried) an exchange meant the trial runners."""
    spec = parse_spec(tiny_spec_dict)
    wc = workload_config(spec)
    made = {"spec_json": spec.model_dump_json(), "workload": wc, "storage_path": "/st"}
    assert SweepTrials(**made, exchange="ex").launcher_name() == "trial_runners"
    assert SweepTrials(**made).launcher_name() == "train_run_per_trial"
    assert SweepTrials(**made, exchange="ex", launcher="train_run_per_trial").launcher_name() == "train_run_per_trial"
