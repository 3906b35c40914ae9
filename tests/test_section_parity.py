"""The spec's sections and the workload's config dataclasses that mirror them agree (issue 32, until each pair
is merged into one definition): the same field names, the same defaults, and, where the config checks them,
the same bounds. The spec (``sweeps/spec``) is what users write; the config (``workloads/config.py``) is what
a trial runs; ``sweeps.run.trainable.trial_config`` maps one to the other. A default that differs is a trap for
whoever builds a config by hand (a test, a benchmark): ``ScheduleSpec.warmup_tokens`` was 32768 and
``ScheduleConfig.warmup_tokens`` 0 until this test."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic_core import PydanticUndefined

from sweeps.spec.finetune import FinetuneSpec, LoraSpec
from sweeps.spec.sections import DataSpec, ModelSpec, NoiseScaleSpec, OptimizerSpec, ScheduleSpec, SyncSpec
from workloads.config import (DataConfig, FinetuneConfig, LoraConfig, ModelConfig, NoiseScaleConfig, OptimizerConfig,
                              ScheduleConfig, SyncConfig)

#: (spec section, config dataclass, the spec's fields the config does not have, and why)
PAIRS = [
    (ScheduleSpec, ScheduleConfig, set()),
    (SyncSpec, SyncConfig, set()),
    (LoraSpec, LoraConfig, set()),
    (NoiseScaleSpec, NoiseScaleConfig, set()),
    (FinetuneSpec, FinetuneConfig, set()),
    (OptimizerSpec, OptimizerConfig, set()),  # the config adds the searched lr, lr_rule, beta2 and its half-life
    (DataSpec, DataConfig, set()),
    (ModelSpec, ModelConfig, set()),
]

#: defaults that differ today, each on purpose and still to be merged (issue 32): the spec's model defaults are
#: the main example's size, ModelConfig's the workload tests' tiny model; trial_config passes every model field
#: (a ``d_ff`` of None in the spec is resolved there), so no trial ever runs on ModelConfig's defaults.
KNOWN_DIFFERENT_DEFAULTS = {("ModelSpec", "d_model"), ("ModelSpec", "n_layers"), ("ModelSpec", "d_ff")}


def _spec_defaults(spec_cls) -> dict:
    out = {}
    for name, f in spec_cls.model_fields.items():
        if f.default_factory is not None:
            out[name] = f.default_factory()
        else:
            out[name] = f.default  # PydanticUndefined when required
    return out


def _config_defaults(cfg_cls) -> dict:
    out = {}
    for f in dataclasses.fields(cfg_cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = PydanticUndefined  # required, as a required pydantic field
    return out


def _same(a, b) -> bool:
    norm = lambda v: tuple(v) if isinstance(v, list) else v  # noqa: E731 - YAML lists, frozen tuples
    return norm(a) == norm(b)


@pytest.mark.parametrize("spec_cls, cfg_cls, spec_only", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_each_spec_section_and_its_config_have_the_same_fields_and_defaults(spec_cls, cfg_cls, spec_only):
    spec, cfg = _spec_defaults(spec_cls), _config_defaults(cfg_cls)
    missing = set(spec) - set(cfg) - spec_only
    assert not missing, f"{spec_cls.__name__} fields that {cfg_cls.__name__} lacks: {sorted(missing)}"
    differ = {name for name in set(spec) & set(cfg) if not _same(spec[name], cfg[name])
              and (spec_cls.__name__, name) not in KNOWN_DIFFERENT_DEFAULTS}
    assert not differ, {n: (spec[n], cfg[n]) for n in sorted(differ)}


def test_the_known_different_defaults_still_differ():
    """When one of them is brought in line, take it off the list (so the list says what is left)."""
    for cls_name, field in KNOWN_DIFFERENT_DEFAULTS:
        spec_cls, cfg_cls, _ = next(p for p in PAIRS if p[0].__name__ == cls_name)
        assert not _same(_spec_defaults(spec_cls)[field], _config_defaults(cfg_cls)[field]), (cls_name, field)


@pytest.mark.parametrize("field, bad", [("mode", "allreduce"), ("every_steps", 0), ("outer_lr", 0.0),
                                        ("outer_momentum", 1.0), ("outer_momentum", -0.1)])
def test_the_sync_section_and_config_refuse_the_same_values(field, bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        SyncSpec(**{field: bad})
    with pytest.raises(ValueError):
        SyncConfig(**{field: bad})


def test_the_optimizer_names_are_the_same_list():
    from typing import get_args

    from sweeps.spec.sections import OptimizerName
    from workloads.config import OPTIMIZER_NAMES

    assert set(get_args(OptimizerName)) == set(OPTIMIZER_NAMES)
