"""The per-trial configuration a worker receives: nested, frozen, keyword-only data, defined once.

Built by the sweep from the spec plus the sampled hyperparameters (``sweeps/launch/trainable.py``) and
sent to Ray Train workers as a dict (:meth:`TrialConfig.to_dict` / :meth:`TrialConfig.from_dict`,
an exact round trip). Every size carries its unit in its name. The sections a sweep spec embeds (data,
LoRA, the optimizer's settings, schedule, noise scale, sync) are frozen pydantic models defined once in
:mod:`workloads.sections` and re-exported here; the others are frozen dataclasses (:func:`replace` works on both).

::

    TrialConfig
      workload: WorkloadConfig     which workload and what it reads (the same for every trial of a sweep)
        model: ModelConfig           architecture (pretraining) and the sequence length (both workloads)
        data: DataConfig             corpus or JSON Lines file, tokenizer, held-out fraction
        finetune: FinetuneConfig     checkpoint, fields, template, packing; lora: LoraConfig | None
      optimizer: OptimizerConfig   which optimizer (AdamW by default), LR and beta2 already scaled for the trial's batch
      schedule: ScheduleConfig     LR warmup, weight EMA or WSD decay branches
      batch: BatchConfig           global batch, micro-batch cap, batch-size warmup
      eval: EvalConfig             report milestones, held-out tokens, checkpoint cadence
      noise_scale: NoiseScaleConfig
      training: TrainingConfig     data parallelism (ddp, fsdp), sync (ddp, local_sgd, diloco), compile, ...
      rung_gate: RungGateConfig | None   pruning mode "pause"

Beside it travels a :class:`TrialRunContext`: what the process that starts the trial knows about this
run of it (when it started, the worker's threads, where it saves), which is no part of the trial's
definition. Ray Train's loop config carries both (:func:`loop_config`, :func:`from_loop_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from workloads.errors import DataError
from workloads.sections import (
    MIXED_PRECISIONS,
    OPTIMIZER_NAMES,
    PARALLELISMS,
    SYNC_MODES,
    ConfigSection,
    DataConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    NoiseScaleConfig,
    OptimizerSettings,
    ScheduleConfig,
    SyncConfig,
    TrainingConfig,
    replace,
)

__all__ = [
    "MIXED_PRECISIONS",
    "OPTIMIZER_NAMES",
    "PARALLELISMS",
    "SYNC_MODES",
    "WORKLOAD_NAMES",
    "BatchConfig",
    "DataConfig",
    "EvalConfig",
    "FinetuneConfig",
    "LoraConfig",
    "ModelConfig",
    "NoiseScaleConfig",
    "OptimizerConfig",
    "RungGateConfig",
    "ScheduleConfig",
    "SyncConfig",
    "TrainingConfig",
    "TrialConfig",
    "TrialRunContext",
    "WorkloadConfig",
    "WorkloadName",
    "from_loop_config",
    "loop_config",
    "replace",
]

#: the workloads a config may name (their entries are in :mod:`workloads.registry`; ``sweeps.spec``'s ``workload``
#: field takes this type)
WorkloadName = typing.Literal["pretrain", "finetune"]
WORKLOAD_NAMES = typing.get_args(WorkloadName)


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """Which workload a trial runs and what it reads: the same for every trial of a sweep.

    Attributes:
        name: ``"pretrain"`` or ``"finetune"`` (:data:`WORKLOAD_NAMES`).
        model: the architecture and ``context_length_tokens``.
        data: the data file and tokenizer.
        finetune: required by (and only read by) the ``finetune`` workload.

    Raises:
        ValueError: an unknown workload name.
        DataError: the ``finetune`` workload without its section.
    """

    name: str = "pretrain"
    model: ModelConfig = ModelConfig()
    data: DataConfig
    finetune: FinetuneConfig | None = None

    def __post_init__(self) -> None:
        if self.name not in WORKLOAD_NAMES:
            raise ValueError(f"unknown workload {self.name!r}; known: {sorted(WORKLOAD_NAMES)}")
        if self.name == "finetune" and self.finetune is None:
            raise DataError("the finetune workload needs a 'finetune' section (checkpoint_dir, fields, template)")


class OptimizerConfig(OptimizerSettings):
    """The optimizer with the trial's peak LR and beta2, already scaled for ``BatchConfig.batch_size_sequences``.

    The batch-independent settings (``name``, ``beta1``, ``eps``, ``weight_decay``, ``grad_clip_norm``,
    ``divergence_loss_factor``) are :class:`workloads.sections.OptimizerSettings`'; this adds:

    Attributes:
        lr: peak learning rate at the trial's batch (after warmup).
        lr_rule: ``"linear"``, ``"sqrt"`` or ``"none"``: how the LR follows the batch during
            batch-size warmup (``workloads.train.scaling.scaled_lr``).
        beta2: Adam beta2 at the trial's batch (reported until the first step).
        beta2_half_life_tokens: the second-moment EMA's half-life in tokens; beta2 follows the
            batch in force (``workloads.train.scaling.beta2_from_half_life``).

    Raises:
        pydantic.ValidationError: an unknown ``name``, a setting out of its bounds (a ``ValueError``).
    """

    lr: float
    lr_rule: str = "sqrt"
    beta2: float = 0.99
    beta2_half_life_tokens: float

    _fields_order = (
        "name",
        "lr",
        "lr_rule",
        "beta1",
        "beta2",
        "beta2_half_life_tokens",
        "eps",
        "weight_decay",
        "grad_clip_norm",
        "divergence_loss_factor",
    )


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """The global batch and how it is split.

    Attributes:
        batch_size_sequences: ``B``, sequences per optimizer step over all workers (the final
            batch with batch-size warmup).
        micro_batch_size_sequences_max: the largest micro-batch a worker computes at once.
        warmup: batch-size warmup ``((tokens_seen_threshold, multiplier), ...)`` from 0, the batch
            being ``B * multiplier / last multiplier``; None for a constant batch.
    """

    batch_size_sequences: int
    micro_batch_size_sequences_max: int = 64
    warmup: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """When the loop reports, on how much held-out data, and which reports carry a checkpoint.

    Attributes:
        milestones_tokens: tokens seen at which to evaluate and report (increasing).
        eval_tokens: held-out tokens per evaluation.
        raw_every_milestone: also evaluate the raw (non-EMA) weights at every milestone, not only
            at the last.
        checkpoint_every_milestones: rank 0 saves the loop state with every n-th report (0: never).
        stop_at_loss: end the trial at its first milestone whose validation loss is at or below this
            (nats; its last report is then ``done``, status ``completed``, ``stopped_at_loss`` true); None:
            train the whole budget. Token reallocation (``search.precision.reallocate_tokens``) sets it to
            the lowest target loss the sweep declared: past it a trial informs no target.
    """

    milestones_tokens: tuple[int, ...]
    eval_tokens: int = 16384
    raw_every_milestone: bool = False
    checkpoint_every_milestones: int = 1
    stop_at_loss: float | None = None


@dataclass(frozen=True, kw_only=True)
class RungGateConfig:
    """Pruning mode ``pause`` (``sweeps/pruning``): after the report that reaches one of these token
    positions (the rungs), wait until the value under the Ray KV key ``key`` reaches the reported
    tokens (a paused or pruned trial is stopped while it waits, so it never trains past its rung).

    Attributes:
        barrier_tokens: the rungs, in tokens seen.
        key: the Ray KV key the sweep's scheduler writes.
    """

    barrier_tokens: tuple[float, ...]
    key: str


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """Everything one trial's training loop needs.

    Attributes:
        trial_id: the Tune trial id.
        workload: which workload, on which model and data.
        budget_tokens: tokens to train (the last milestone).
        optimizer, schedule, batch, eval, noise_scale, training: the sections above.
        seed: the model initialisation and the data stream.
        rung_gate: set only in pruning mode ``pause``.
    """

    trial_id: str
    workload: WorkloadConfig
    budget_tokens: int
    optimizer: OptimizerConfig
    schedule: ScheduleConfig = ScheduleConfig()
    batch: BatchConfig
    eval: EvalConfig
    noise_scale: NoiseScaleConfig = NoiseScaleConfig()
    training: TrainingConfig = TrainingConfig()
    seed: int = 0
    rung_gate: RungGateConfig | None = None

    @property
    def context_length_tokens(self) -> int:
        """``T`` (``workload.model.context_length_tokens``), which the loop reads everywhere."""
        return self.workload.model.context_length_tokens

    def to_dict(self) -> dict[str, Any]:
        """A nested dict of plain values (sections as dicts); :meth:`from_dict` inverts it exactly."""
        return _plain(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialConfig:
        """Rebuild from :meth:`to_dict` (lists are accepted for tuples, e.g. after JSON).

        Raises:
            ValueError: an unknown key, named by its dotted path (``optimizer.lrr``).
            DataError: see :class:`WorkloadConfig`.
            pydantic.ValidationError: a section's value out of its bounds (``workloads.sections``).
        """
        return _build(cls, d, "")


@dataclass(frozen=True, kw_only=True)
class TrialRunContext:
    """How one trial is run, beside what it is (:class:`TrialConfig`): set by the Tune trainable
    (``sweeps/launch/trainable.py``), read by the Ray worker entries (``workloads.ray``).

    Attributes:
        started_unix: when the trial started (Unix seconds): the first report of each attempt then
            carries ``startup_s`` and ``startup_ray_s``; None leaves them out.
        torch_threads: the intra-op threads every worker of the trial uses
            (:func:`workloads.train.determinism.torch_threads_per_worker`); None keeps torch's default.
        save_dir: a folder on shared storage where rank 0 saves the final Hugging Face checkpoint; None: none.
        checkpoint_dir: a trial runner's trial (``workloads.ray.runner``): the folder of its own loop-state
            checkpoints; None for a one-trial worker group (Ray Train keeps those).
    """

    started_unix: float | None = None
    torch_threads: int | None = None
    save_dir: str | None = None
    checkpoint_dir: str | None = None


#: the keys of Ray Train's loop config (a dict, as ``TorchTrainer(train_loop_config=...)`` takes it)
_TRIAL, _CONTEXT = "trial", "context"


def loop_config(cfg: TrialConfig, context: TrialRunContext) -> dict[str, Any]:
    """The Ray Train loop config (and trial-exchange item) of a trial: the two objects, as built."""
    return {_TRIAL: cfg, _CONTEXT: context}


def from_loop_config(config: dict[str, Any]) -> tuple[TrialConfig, TrialRunContext]:
    """Inverse of :func:`loop_config`.

    Raises:
        TypeError: ``config`` was not made by :func:`loop_config`.
    """
    cfg, context = config.get(_TRIAL), config.get(_CONTEXT, TrialRunContext())
    if not isinstance(cfg, TrialConfig) or not isinstance(context, TrialRunContext):
        raise TypeError(
            f"a trial's loop config holds {_TRIAL!r} (TrialConfig) and {_CONTEXT!r} (TrialRunContext), "
            f"got keys {sorted(config)}"
        )
    return cfg, context


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s walk, which also turns the pydantic sections into dicts (in field order)."""
    if isinstance(value, ConfigSection):
        return {k: _plain(v) for k, v in value.fields().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_plain(k), _plain(v)) for k, v in value.items())
    return copy.deepcopy(value)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, ConfigSection)


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    """``cls(**d)`` with nested sections built from dicts and sequences made tuples."""
    names = set(cls.model_fields) if _is_section(cls) else {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"unknown trial config keys: {sorted(where + k for k in unknown)}")
    if _is_section(cls):  # validated by pydantic, which makes its sequences tuples itself; nested sections first
        return cls(
            **{
                k: _coerce(cls.model_fields[k].annotation, v, f"{where}{k}.") if isinstance(v, dict) else v
                for k, v in d.items()
            }
        )
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(hints[k], v, f"{where}{k}.") for k, v in d.items()})


def _coerce(tp: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(inner[0], value, where) if len(inner) == 1 else value
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or _is_section(tp)) and isinstance(value, dict):
        return _build(tp, value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, where) for v in value)
        return tuple(_coerce(a, v, where) for a, v in zip(args, value))
    return value
