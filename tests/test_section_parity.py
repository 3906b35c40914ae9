"""The spec's sections and the trial config's: one definition each.

The spec's ``SyncSpec``, ``NoiseScaleSpec``, ``LoraSpec``, ``ScheduleSpec``, ``DataSpec``, ``OptimizerSpec``,
``ModelSpec`` and ``FinetuneSpec`` are subclasses of the config's sections (``workloads/sections.py``) that add no
field: a field's name, default, bounds and doc live in the config's class alone. What a spec section adds is
its docstring (the OpenAPI document's description), the checks and dump rules only a spec has (``ModelSpec``:
one form, shorthand or ``hf_config``; ``DataSpec``: ``path`` or ``shards``), and ``FinetuneSpec.lora`` typed as
the spec's ``LoraSpec`` (the same section). ``sweeps.launch.trainable.trial_config`` maps one to the other.
"""

from __future__ import annotations

import pytest

from sweeps.spec.finetune import FinetuneSpec, LoraSpec
from sweeps.spec.sections import DataSpec, ModelSpec, NoiseScaleSpec, OptimizerSpec, ScheduleSpec, SyncSpec
from workloads.config import (
    DataConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    NoiseScaleConfig,
    OptimizerConfig,
    ScheduleConfig,
    SyncConfig,
)
from workloads.sections import OptimizerSettings

#: (spec section, the config section it embeds): the spec's adds a docstring and spec-only checks, no field
MERGED = [
    (SyncSpec, SyncConfig),
    (NoiseScaleSpec, NoiseScaleConfig),
    (LoraSpec, LoraConfig),
    (ScheduleSpec, ScheduleConfig),
    (DataSpec, DataConfig),
    (OptimizerSpec, OptimizerSettings),
    (ModelSpec, ModelConfig),
    (FinetuneSpec, FinetuneConfig),
]

#: fields a spec section re-types as the spec's own class of the same section
RETYPED = {("FinetuneSpec", "lora")}


@pytest.mark.parametrize("spec_cls, cfg_cls", MERGED, ids=[p[0].__name__ for p in MERGED])
def test_a_merged_spec_section_is_its_config_section_with_nothing_added(spec_cls, cfg_cls):
    assert issubclass(spec_cls, cfg_cls)
    assert spec_cls.model_fields.keys() == cfg_cls.model_fields.keys()
    for name, field in cfg_cls.model_fields.items():
        if (spec_cls.__name__, name) in RETYPED:
            continue
        assert repr(spec_cls.model_fields[name]) == repr(field), name  # default, bounds, description
    assert spec_cls.model_config == cfg_cls.model_config


def test_the_optimizer_config_is_the_spec_settings_and_the_sampled_ones():
    assert issubclass(OptimizerConfig, OptimizerSettings)
    assert set(OptimizerConfig.model_fields) - set(OptimizerSettings.model_fields) == {
        "lr",
        "lr_rule",
        "beta2",
        "beta2_half_life_tokens",
    }


@pytest.mark.parametrize("spec_cls, cfg_cls", MERGED, ids=[p[0].__name__ for p in MERGED])
def test_of_takes_the_config_part_of_a_spec_section(spec_cls, cfg_cls):
    required = {DataSpec: {"path": "x.txt"}, FinetuneSpec: {"checkpoint_dir": "ck", "lora": {}}}
    spec = spec_cls(**required.get(spec_cls, {}))
    cfg = cfg_cls.of(spec)

    def plain(v):
        return {k: plain(x) if hasattr(x, "fields") else x for k, x in v.fields().items()}

    assert type(cfg) is cfg_cls and plain(cfg) == plain(spec)


def test_the_finetune_section_embeds_the_merged_lora_section():
    assert FinetuneSpec.model_fields["lora"].annotation == LoraSpec | None
    assert FinetuneConfig.model_fields["lora"].annotation == LoraConfig | None
    assert issubclass(LoraSpec, LoraConfig)


@pytest.mark.parametrize("cls", [DataConfig, OptimizerConfig])
def test_a_fields_order_names_every_field_once(cls):
    """``TrialConfig.to_dict`` keeps the key order these sections had as dataclasses."""
    assert sorted(cls._fields_order) == sorted(cls.model_fields)


def test_replace_rebuilds_a_section_and_validates_it_again():
    from pydantic import ValidationError

    from workloads.config import replace

    s = ScheduleConfig()
    assert replace(s, warmup_min_steps=0) == ScheduleConfig(warmup_min_steps=0)
    with pytest.raises(ValidationError, match="warmup_tokens"):
        replace(s, warmup_tokens=-1)


def test_local_sync_needs_ddp_in_one_place():
    from workloads.config import TrainingConfig
    from workloads.sections import local_sync_error

    assert local_sync_error("ddp", "fsdp", where="x") is None and local_sync_error("diloco", "ddp", where="x") is None
    assert local_sync_error("local_sgd", "fsdp", where="resources") == (
        "resources.sync: local_sgd needs resources.parallelism ddp (every replica holds the whole model), got fsdp"
    )
    with pytest.raises(ValueError, match=r"training\.sync: diloco needs training\.parallelism ddp"):
        TrainingConfig(parallelism="fsdp", sync=SyncConfig(mode="diloco"))


def test_the_spec_resources_declare_the_training_flags_with_the_trial_config_fields():
    """``resources.parallelism``, ``compile``, ``activation_checkpointing`` and ``mixed_precision`` are the
    trial's ``TrainingConfig`` fields (one definition); ``TrainingConfig.of(resources)`` takes them and the sync."""
    from sweeps.spec.sections import ResourcesSpec
    from workloads.sections import TRAINING_FIELDS, TrainingConfig

    for name, field in TRAINING_FIELDS.items():
        assert repr(ResourcesSpec.model_fields[name]) == repr(field), name
    r = ResourcesSpec(parallelism="fsdp", compile=True, sync={"mode": "ddp", "every_steps": 4})
    t = TrainingConfig.of(r)
    assert (t.parallelism, t.compile, type(t.sync), t.sync.every_steps) == ("fsdp", True, SyncConfig, 4)


def test_of_converts_a_nested_spec_section_to_the_config_type():
    f = FinetuneConfig.of(FinetuneSpec(checkpoint_dir="ck", lora={"rank": 4}))
    assert type(f.lora) is LoraConfig and f == FinetuneConfig(checkpoint_dir="ck", lora=LoraConfig(rank=4))
