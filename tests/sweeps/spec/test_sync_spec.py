"""resources.sync: ddp (the default, dropped from the dump), local_sgd and diloco; the refusals; the
trial config and MLflow params."""

import copy

import pytest

from sweeps.launch.trainable import training_params, trial_config
from sweeps.spec import SpecError, parse_spec
from sweeps.tracking import schema

HP = {
    "batch_size_sequences": 8,
    "seed": 0,
    "lr": 1e-3,
    "lr_rule": "sqrt",
    "beta2": 0.99,
    "beta2_half_life_tokens": 4096.0,
}


def _with(d: dict, sync: dict | None = None, **resources) -> dict:
    d = copy.deepcopy(d)
    d.setdefault("resources", {}).update(resources)
    if sync is not None:
        d["resources"]["sync"] = sync
    return d


def test_the_default_is_ddp_and_leaves_the_dump_and_fingerprint_as_before(tiny_spec_dict):
    s = parse_spec(tiny_spec_dict)
    assert s.resources.sync.mode == "ddp" and "sync" not in s.model_dump()["resources"]
    # under ddp the other fields are not read: the spec is the same sweep
    same = parse_spec(_with(tiny_spec_dict, sync={"mode": "ddp", "every_steps": 4}))
    assert same.fingerprint() == s.fingerprint()
    diloco = parse_spec(_with(tiny_spec_dict, sync={"mode": "diloco"}, workers_per_trial=2))
    assert diloco.model_dump()["resources"]["sync"] == {
        "mode": "diloco",
        "every_steps": 16,
        "outer_lr": 0.7,
        "outer_momentum": 0.9,
    }
    assert diloco.fingerprint() != parse_spec(_with(tiny_spec_dict, workers_per_trial=2)).fingerprint()
    assert parse_spec(diloco.model_dump(mode="json")) == diloco  # round trip through spec.yaml


def test_sync_reaches_the_trial_config_and_the_mlflow_params(tiny_spec_dict):
    s = parse_spec(
        _with(tiny_spec_dict, sync={"mode": "diloco", "every_steps": 8, "outer_lr": 0.5}, workers_per_trial=2)
    )
    y = trial_config(s, HP, "t0", data_path="x").training.sync
    assert (y.mode, y.every_steps, y.outer_lr, y.outer_momentum) == ("diloco", 8, 0.5, 0.9)
    p = training_params(s)
    assert {k: p[k] for k in ("sync", "sync_every_steps", "replicas", "outer_lr", "outer_momentum")} == {
        "sync": "diloco",
        "sync_every_steps": 8,
        "replicas": 2,
        "outer_lr": 0.5,
        "outer_momentum": 0.9,
    }
    assert tuple(p) == schema.TRAINING_PARAMS + schema.SYNC_OUTER_PARAMS
    local = training_params(
        parse_spec(_with(tiny_spec_dict, sync={"mode": "local_sgd", "every_steps": 4}, workers_per_trial=2))
    )
    assert (local["sync"], local["sync_every_steps"], tuple(local)) == ("local_sgd", 4, schema.TRAINING_PARAMS)
    assert {"comm_bytes_per_step", "comm_bytes_total", "comm_time_s", "syncs"} <= set(schema.METRIC_KEYS)


@pytest.mark.parametrize(
    "changes,extra,message",
    [
        ({"workers_per_trial": 1}, {}, "resources.sync: local_sgd needs workers_per_trial >= 2 replicas (got 1)"),
        (
            {"workers_per_trial": 2, "parallelism": "fsdp"},
            {},
            "resources.sync: local_sgd needs resources.parallelism ddp",
        ),
        (
            {"workers_per_trial": 2},
            {"workload": "finetune", "finetune": {"checkpoint_dir": "/nowhere"}},
            "resources.sync: local_sgd is for the pretrain workload",
        ),
        ({"workers_per_trial": 2}, {"branch": {}}, "resources.sync: local_sgd cannot run branch"),
        (
            {"workers_per_trial": 2},
            {"batch_warmup": {"schedule": [[0, 1], [256, 2]]}},
            "resources.sync: local_sgd cannot run with batch_warmup",
        ),
    ],
)
def test_replicas_are_refused_where_they_cannot_run(tiny_spec_dict, changes, extra, message):
    d = _with(tiny_spec_dict, sync={"mode": "local_sgd"}, **changes)
    d.update(extra)
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    assert message in str(e.value)


def test_a_sync_period_longer_than_a_trial_is_refused_naming_the_batch_sizes(tiny_spec_dict):
    # tiny: budget 8192 tokens, context 32: B = 8 runs 32 steps, B = 16 runs 16
    assert parse_spec(_with(tiny_spec_dict, sync={"mode": "diloco", "every_steps": 16}, workers_per_trial=2))
    with pytest.raises(SpecError) as e:
        parse_spec(_with(tiny_spec_dict, sync={"mode": "local_sgd", "every_steps": 17}, workers_per_trial=2))
    assert (
        "resources.sync.every_steps=17 is more than the optimizer steps of batch size(s) [16] "
        "(budget_tokens / (batch x context) = [16])"
    ) in str(e.value)
    with pytest.raises(SpecError, match=r"batch size\(s\) \[4, 8, 16\]"):
        parse_spec(_with(tiny_spec_dict, sync={"mode": "diloco", "every_steps": 100000}, workers_per_trial=2))


@pytest.mark.parametrize(
    "sync,field",
    [
        ({"mode": "gossip"}, "resources.sync.mode"),
        ({"mode": "diloco", "every_steps": 0}, "resources.sync.every_steps"),
        ({"mode": "diloco", "every_steps": True}, "resources.sync.every_steps"),
        ({"mode": "diloco", "outer_lr": 0}, "resources.sync.outer_lr"),
        ({"mode": "diloco", "outer_momentum": 1.0}, "resources.sync.outer_momentum"),
        ({"mode": "diloco", "h": 4}, "resources.sync.h"),
    ],
)
def test_bad_sync_fields_are_named(tiny_spec_dict, sync, field):
    with pytest.raises(SpecError) as e:
        parse_spec(_with(tiny_spec_dict, sync=sync, workers_per_trial=2))
    assert field in str(e.value)
