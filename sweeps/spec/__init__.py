"""The sweep spec: a YAML file validated by pydantic models (the public face of this package).

A spec says *what* to sweep (the workload, the model, the data, the per-trial token budget, the
batch sizes, the learning-rate scaling rules and Adam's beta2) and *where* (resources, tracking).
Load and validate with :func:`load_spec`; every invalid field is reported by its dotted path
(``search.batch_sizes_sequences.2``) in one :class:`SpecError`. Sections live in
:mod:`sweeps.spec.sections` and :mod:`sweeps.spec.sweep`, reading in :mod:`sweeps.spec.loading`, the
sweep id and tracking-URI rules in :mod:`sweeps.spec.identity`.

Plain data: imports neither torch nor Ray, so the REST service can use it.
"""

from sweeps.spec.finetune import FinetuneSpec, LoraSpec
from sweeps.spec.loading import (
    SpecError,
    load_spec,
    load_stored_spec,
    parse_spec,
    parse_spec_text,
    parse_stored_spec,
    read_spec_text,
    resolved_spec_dict,
    spec_errors,
)
from sweeps.spec.registry import LAUNCHER_REGISTRY, STRATEGY_REGISTRY, OneOf, Registry
from sweeps.spec.search import Beta2Spec, InitialPointSpec, PrecisionSpec, SearchSpec
from sweeps.spec.sections import (
    MAX_BATCH_SEQUENCES,
    MAX_TOKENS,
    MAX_WIDTH,
    BatchWarmupSpec,
    DataSpec,
    EvalSpec,
    ModelSpec,
    NoiseScaleSpec,
    OptimizerSpec,
    ResourcesSpec,
    ScheduleSpec,
)
from sweeps.spec.sweep import ArmSpec, BranchSpec, BudgetSpec, PruningSpec, SweepSpec
from sweeps.spec.tracking import TrackingSpec

__all__ = [
    "MAX_BATCH_SEQUENCES",
    "MAX_TOKENS",
    "MAX_WIDTH",
    "LAUNCHER_REGISTRY",
    "STRATEGY_REGISTRY",
    "ArmSpec",
    "BatchWarmupSpec",
    "Beta2Spec",
    "BranchSpec",
    "BudgetSpec",
    "DataSpec",
    "EvalSpec",
    "FinetuneSpec",
    "InitialPointSpec",
    "LoraSpec",
    "ModelSpec",
    "NoiseScaleSpec",
    "OneOf",
    "OptimizerSpec",
    "PrecisionSpec",
    "PruningSpec",
    "Registry",
    "ResourcesSpec",
    "ScheduleSpec",
    "SearchSpec",
    "SpecError",
    "SweepSpec",
    "TrackingSpec",
    "load_spec",
    "load_stored_spec",
    "parse_spec",
    "parse_spec_text",
    "parse_stored_spec",
    "read_spec_text",
    "resolved_spec_dict",
    "spec_errors",
]
