"""The public interface of ``workloads``: the only module ``sweeps`` imports.

A :class:`Workload` entry per name (``pretrain``, ``finetune``) says what a sweep may ask of a
workload: its config section, the function a Ray Train worker runs, its FLOPs per token, its
input checks. Beside the entries: the per-trial config (:class:`TrialConfig` and its sections),
what a trial reports at each milestone (:class:`TrialReport`, its
:class:`TrialOutcome` and the key names derived from its fields), the scaling rules, the FLOP convention, the tokenizer checks, the worker function
(``train_fn_per_worker``), the
Ray session plumbing of the Tune trainable (``drain_report_queue``), the checkpoint builder
(``init_checkpoint``) and the data preparation (``prepare_data`` for ``critbatch prepare-data``,
``prepare_text_file`` for the driver's ``data.path``; ``workloads.data.prepare``). And the project's one
error base (:class:`CritbatchError`, :class:`InvalidInput`, :class:`DataError`; ``workloads.errors``),
which ``sweeps.errors`` re-exports.

Importing this module is light (no torch): the entries are built on first use and the
torch-backed functions load on first access (module ``__getattr__``), so ``critbatch validate``
and the tracking code do not pay for the training stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workloads.config import (
    WORKLOAD_NAMES,
    BatchConfig,
    DataConfig,
    EvalConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    NoiseScaleConfig,
    OptimizerConfig,
    RungGateConfig,
    ScheduleConfig,
    SyncConfig,
    TrainingConfig,
    TrialConfig,
    TrialRunContext,
    WorkloadConfig,
    WorkloadName,
    loop_config,
)
from workloads.data.tokenizer import has_tokenizer_files
from workloads.errors import CritbatchError, DataError, InvalidInput
from workloads.model.flops import FLOPS_CONVENTION, FLOPS_MODEL_TYPES, GIVEN_FLOPS_CONVENTION, unknown_architecture
from workloads.registry import Workload, get_workload
from workloads.sections import (
    LR_RULES,
    MAX_BATCH_SEQUENCES,
    MAX_TOKENS,
    MAX_WIDTH,
    MIXED_PRECISIONS,
    MODEL_SHORTHAND_FIELDS,
    OPTIMIZER_NAMES,
    PARALLELISMS,
    SYNC_MODES,
    TRAINING_FIELDS,
    ConfigSection,
    LrRule,
    MixedPrecision,
    OptimizerName,
    OptimizerSettings,
    Parallelism,
    PositiveInt,
    SyncMode,
    local_sync_error,
    reads_beta2,
    replace,
)
from workloads.train.batching import BatchPlan, min_micro_batches_total, plan_batch
from workloads.train.determinism import DETERMINISTIC_WARN_ONLY, torch_threads_per_worker
from workloads.train.report import (
    COMM_METRICS,
    MLFLOW_METRICS,
    ONCE_PER_ATTEMPT,
    REPORT_KEYS,
    TrialOutcome,
    TrialReport,
)
from workloads.train.scaling import beta2_from_half_life, half_life_from_beta2, scaled_lr, warmup_length_tokens

if TYPE_CHECKING:  # loaded on first access, see _LAZY
    from workloads.data.corpus import tokenizer_vocab_size
    from workloads.data.prepare import PrepareResult, prepare_data, prepare_text_file
    from workloads.finetune import init_checkpoint
    from workloads.model.hf import check_model_config, model_vocab_size
    from workloads.ray.adapter import train_fn_per_worker
    from workloads.ray.compat import drain_report_queue
    from workloads.ray.runner import runner_fn_per_worker

__all__ = [
    "file_sha256",
    "Workload",
    "get_workload",
    "WORKLOAD_NAMES",
    "WorkloadName",
    "TrialConfig",
    "TrialReport",
    "TrialOutcome",
    "REPORT_KEYS",
    "MLFLOW_METRICS",
    "ONCE_PER_ATTEMPT",
    "COMM_METRICS",
    "TrialRunContext",
    "loop_config",
    "DETERMINISTIC_WARN_ONLY",
    "torch_threads_per_worker",
    "WorkloadConfig",
    "ModelConfig",
    "DataConfig",
    "FinetuneConfig",
    "LoraConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "BatchConfig",
    "EvalConfig",
    "NoiseScaleConfig",
    "TrainingConfig",
    "SyncConfig",
    "RungGateConfig",
    "CritbatchError",
    "InvalidInput",
    "DataError",
    "BatchPlan",
    "plan_batch",
    "min_micro_batches_total",
    "FLOPS_CONVENTION",
    "FLOPS_MODEL_TYPES",
    "GIVEN_FLOPS_CONVENTION",
    "unknown_architecture",
    "check_model_config",
    "model_vocab_size",
    "scaled_lr",
    "beta2_from_half_life",
    "half_life_from_beta2",
    "warmup_length_tokens",
    "has_tokenizer_files",
    "tokenizer_vocab_size",
    "train_fn_per_worker",
    "drain_report_queue",
    "init_checkpoint",
    "prepare_data",
    "prepare_text_file",
    "PrepareResult",
    "runner_fn_per_worker",
    # the sections a sweep spec embeds (workloads.sections) and their vocabularies
    "ConfigSection",
    "OptimizerSettings",
    "replace",
    "OPTIMIZER_NAMES",
    "OptimizerName",
    "LR_RULES",
    "LrRule",
    "reads_beta2",
    "SYNC_MODES",
    "SyncMode",
    "PARALLELISMS",
    "Parallelism",
    "MIXED_PRECISIONS",
    "MixedPrecision",
    "local_sync_error",
    "PositiveInt",
    "MAX_TOKENS",
    "MAX_BATCH_SEQUENCES",
    "MAX_WIDTH",
    "MODEL_SHORTHAND_FIELDS",
    "TRAINING_FIELDS",
]


#: public names whose modules import torch (or Ray Train): loaded on first access
_LAZY = {
    "tokenizer_vocab_size": "workloads.data.corpus",
    "train_fn_per_worker": "workloads.ray.adapter",
    "runner_fn_per_worker": "workloads.ray.runner",  # a trial runner's worker loop (sweeps/launch/runners.py)
    "drain_report_queue": "workloads.ray.compat",
    "init_checkpoint": "workloads.finetune",
    "check_model_config": "workloads.model.hf",  # the model's config built before launch: model_type, vocab, FLOPs
    "model_vocab_size": "workloads.model.hf",
    "prepare_data": "workloads.data.prepare",  # token shards (critbatch prepare-data; the driver's data.path)
    "prepare_text_file": "workloads.data.prepare",
    "PrepareResult": "workloads.data.prepare",
    "file_sha256": "workloads.data.shards",  # the content hash the shard index records (the driver pins inputs with it)
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
