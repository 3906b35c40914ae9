"""The per-trial configuration a worker receives: nested, frozen, keyword-only data, defined once.

Built by the sweep from the spec plus the sampled hyperparameters (``sweeps/run/trainable.py``) and
sent to Ray Train workers as a dict (:meth:`TrialConfig.to_dict` / :meth:`TrialConfig.from_dict`,
an exact round trip). Every size carries its unit in its name.

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
      faults: FaultPlan | None           set by tests only
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from workloads.errors import DataError
from workloads.faults import FaultPlan

__all__ = [
    "TrialConfig",
    "TRIAL_STARTED_KEY",
    "TORCH_THREADS_KEY",
    "CHECKPOINT_DIR_KEY",
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
    "PARALLELISMS",
    "MIXED_PRECISIONS",
    "SyncConfig",
    "SYNC_MODES",
    "RungGateConfig",
    "FaultPlan",
    "WORKLOAD_NAMES",
    "OPTIMIZER_NAMES",
]

#: the workloads a config may name (their entries are in :mod:`workloads.api`)
WORKLOAD_NAMES = ("pretrain", "finetune")
#: ``OptimizerConfig.name``: built by :func:`workloads.optim.build_optimizer`
OPTIMIZER_NAMES = ("adamw", "adafactor", "adamw_8bit", "sgd_momentum")
#: ``TrainingConfig.parallelism``: hand-made data parallelism (one all-reduce) or FSDP2 ``fully_shard``
PARALLELISMS = ("ddp", "fsdp")
#: ``TrainingConfig.mixed_precision``: ``auto`` is bf16 autocast on CUDA, float32 elsewhere
MIXED_PRECISIONS = ("auto", "bf16", "fp32")
#: ``SyncConfig.mode``: a gradient all-reduce every step, or replicas that synchronise every H steps
SYNC_MODES = ("ddp", "local_sgd", "diloco")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Hugging Face causal LM's architecture (pretraining) and the trained sequence length.

    Fine-tuning reads its architecture from the checkpoint and uses only ``context_length_tokens``.

    Attributes:
        family: ``"llama"`` or ``"gpt2"``.
        d_model: residual width; ``n_heads`` must divide it.
        n_layers: transformer blocks.
        n_heads: attention heads (as many key/value heads).
        d_ff: MLP hidden width.
        context_length_tokens: ``T``, tokens per sequence (input positions of a row).
        tie_word_embeddings: share the input embedding and the LM head.
        hf_config: a whole ``transformers`` config as keyword arguments of
            ``AutoConfig.for_model`` (``model_type`` included); when set it defines the
            architecture and the six fields above are not read. None: the shorthand above.
        flops_per_token: training FLOPs per token given by the spec (forward + backward), used
            instead of ``workloads.flops``' formula; None: counted from the config.
    """

    family: str = "llama"
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 176
    context_length_tokens: int = 64
    tie_word_embeddings: bool = False
    hf_config: dict[str, Any] | None = dataclasses.field(default=None, hash=False)
    flops_per_token: float | None = None


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The training text and its tokenizer.

    Attributes:
        path: a text file (pretraining) or JSON Lines (fine-tuning), absolute on the workers; None
            when pretraining reads only ``shards``.
        tokenizer: ``"byte"`` (256 ids) or a local Hugging Face tokenizer directory.
        validation_fraction: the held-out tail (of tokens, or of examples when fine-tuning); with
            ``shards`` the split is the index's.
        shards: pretraining: a prepared token-shard folder or fsspec URI (``workloads.shards``) the
            workers memory-map; when set, ``path`` is not read by the workers.
    """

    path: str | None = None
    tokenizer: str = "byte"
    validation_fraction: float = 0.1
    shards: str | None = None


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA adapters (``peft``): only they train.

    Attributes:
        rank: ``r`` of each adapter pair.
        alpha: ``lora_alpha`` (the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input (draws from the torch RNG in training forwards).
        target_modules: a module is adapted when its name ends with one of these.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")

    def to_dict(self) -> dict[str, Any]:
        """``{rank, alpha, dropout, target_modules}`` with a list of modules (JSON, ``peft``)."""
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules)}


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    """Supervised fine-tuning of a local checkpoint on instruction JSON Lines.

    Attributes:
        checkpoint_dir: a local Hugging Face checkpoint (``config.json`` + weights), or a LoRA
            adapter directory saved by this workload.
        prompt_field, response_field: JSON keys of each line.
        prompt_template: text around the prompt; must contain ``{prompt}`` (replaced literally, so
            other braces are kept as they are).
        packing: ``"packed"`` or ``"padded"``.
        truncate: cut over-long examples to the context length (counted; an example whose prompt
            alone fills the context is skipped, also counted) instead of refusing the data.
        lora: None (full fine-tuning) or the adapters.

    Raises:
        DataError: a template without ``{prompt}``, an unknown packing, an empty field name.
    """

    checkpoint_dir: str
    prompt_field: str = "question"
    response_field: str = "answer"
    prompt_template: str = "Question: {prompt}\nAnswer: "
    packing: str = "packed"
    truncate: bool = False
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if "{prompt}" not in self.prompt_template:
            raise DataError(f"finetune.prompt_template must contain '{{prompt}}': {self.prompt_template!r}")
        if self.packing not in ("packed", "padded"):
            raise DataError(f"finetune.packing must be 'packed' or 'padded', got {self.packing!r}")
        if not self.prompt_field or not self.response_field:
            raise DataError("finetune.prompt_field and finetune.response_field must not be empty")

    def template(self, prompt: str) -> str:
        """The prompt text the model sees."""
        return self.prompt_template.replace("{prompt}", prompt)


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


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer with the trial's peak LR and beta2, already scaled for ``BatchConfig.batch_size_sequences``.

    Attributes:
        name: one of :data:`OPTIMIZER_NAMES` (:func:`workloads.optim.build_optimizer` says which
            hyperparameters each one reads).
        lr: peak learning rate at the trial's batch (after warmup).
        lr_rule: ``"linear"``, ``"sqrt"`` or ``"none"``: how the LR follows the batch during
            batch-size warmup (``workloads.scaling.scaled_lr``).
        beta1: Adam beta1.
        beta2: Adam beta2 at the trial's batch (reported until the first step).
        beta2_half_life_tokens: the second-moment EMA's half-life in tokens; beta2 follows the
            batch in force (``workloads.scaling.beta2_from_half_life``).
        eps: Adam epsilon.
        weight_decay: decoupled weight decay.
        grad_clip_norm: global gradient-norm clip, or None.
        divergence_loss_factor: a step whose loss exceeds this times ``ln(vocab)`` is not applied
            and ends the trial as diverged.

    Raises:
        ValueError: an unknown ``name``.
    """

    name: str = "adamw"
    lr: float
    lr_rule: str = "sqrt"
    beta1: float = 0.9
    beta2: float = 0.99
    beta2_half_life_tokens: float
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = 1.0
    divergence_loss_factor: float = 1.5

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZER_NAMES:
            raise ValueError(f"unknown optimizer {self.name!r}; known: {list(OPTIMIZER_NAMES)}")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """LR warmup and how a milestone's model is evaluated (methodology section 11.2).

    Attributes:
        kind: ``"constant_ema"`` (constant LR, a bias-corrected weight EMA is evaluated) or
            ``"wsd"`` (each milestone is evaluated after a short linear-decay branch).
        warmup_tokens: linear LR warmup in tokens (the same for every batch size).
        warmup_min_steps: the warmup lasts at least this many optimizer steps of the first batch
            (``workloads.scaling.warmup_length_tokens``).
        ema_half_life_tokens: the weight EMA's half-life in tokens (``constant_ema``).
        decay_fraction: a WSD decay branch lasts this fraction of the tokens seen.
    """

    kind: str = "constant_ema"
    warmup_tokens: int = 32768  # the spec's default (sweeps.spec.sections.ScheduleSpec; tests/test_section_parity.py)
    warmup_min_steps: int = 4
    ema_half_life_tokens: float = 32768.0
    decay_fraction: float = 0.1


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
    """

    milestones_tokens: tuple[int, ...]
    eval_tokens: int = 16384
    raw_every_milestone: bool = False
    checkpoint_every_milestones: int = 1


@dataclass(frozen=True, kw_only=True)
class NoiseScaleConfig:
    """The gradient-noise-scale estimator (McCandlish et al. 2018, Eq. A.2).

    Attributes:
        enabled: estimate ``B_simple`` (needs at least two micro-batches per step).
        ema_decay: decay of its bias-corrected EMAs, per optimizer step.
    """

    enabled: bool = True
    ema_decay: float = 0.95


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    """How the data-parallel workers synchronise (``workloads.sync``).

    Attributes:
        mode: ``"ddp"`` (the step's gradient is all-reduced every step), ``"local_sgd"`` (each
            worker is a replica that steps its own optimizer on its own slice of the global batch;
            the parameters are averaged every ``every_steps`` optimizer steps; Stich 2019,
            arXiv:1805.09767; Lin et al. 2020, arXiv:1808.07217) or ``"diloco"`` (the same inner
            steps; every ``every_steps`` steps an outer SGD step with Nesterov momentum on the
            anchor weights, whose gradient is ``anchor - mean of the replicas``; Douillard et al.
            2023, arXiv:2311.08105, Algorithm 1).
        every_steps: ``H``, optimizer steps between synchronisations (not read under ddp).
        outer_lr: DiLoCo's outer learning rate (0.7 in Douillard et al. 2023, section 3).
        outer_momentum: DiLoCo's outer Nesterov momentum (0.9 in Douillard et al. 2023, section 3).

    Raises:
        ValueError: an unknown mode, ``every_steps < 1``, ``outer_lr <= 0``, a momentum outside [0, 1).
    """

    mode: str = "ddp"
    every_steps: int = 16
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.mode not in SYNC_MODES:
            raise ValueError(f"training.sync.mode must be one of {list(SYNC_MODES)}, got {self.mode!r}")
        if isinstance(self.every_steps, bool) or not isinstance(self.every_steps, int) or self.every_steps < 1:
            raise ValueError(f"training.sync.every_steps must be an integer >= 1, got {self.every_steps!r}")
        if not self.outer_lr > 0:
            raise ValueError(f"training.sync.outer_lr must be > 0, got {self.outer_lr!r}")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"training.sync.outer_momentum must be in [0, 1), got {self.outer_momentum!r}")

    @property
    def local(self) -> bool:
        """Whether the workers are replicas that train apart between synchronisations."""
        return self.mode != "ddp"


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """How the model is run (``workloads.parallel``); none of it changes the step's mathematics.

    Attributes:
        parallelism: ``"ddp"`` (every rank holds the model; one all-reduce of the step's gradient)
            or ``"fsdp"`` (FSDP2 ``fully_shard`` of every decoder layer and the root; needs a
            process group of at least 2 ranks).
        compile: ``torch.compile`` the model (the whole model under ddp, each decoder layer under fsdp).
        activation_checkpointing: recompute each decoder layer's activations in the backward pass
            (Hugging Face ``activation_checkpointing_enable``, non-reentrant).
        mixed_precision: ``"auto"`` (bf16 autocast on CUDA, float32 elsewhere), ``"bf16"`` (bf16
            autocast on any device, CPU autocast included) or ``"fp32"``; weights, gradients and
            optimizer state stay float32.
        sync: how the workers synchronise (:class:`SyncConfig`; local_sgd and diloco only under ddp).

    Raises:
        ValueError: an unknown ``parallelism`` or ``mixed_precision``, a non-boolean flag, a
            local_sgd or diloco ``sync`` under fsdp.
    """

    parallelism: str = "ddp"
    compile: bool = False
    activation_checkpointing: bool = False
    mixed_precision: str = "auto"
    sync: SyncConfig = SyncConfig()

    def __post_init__(self) -> None:
        if self.parallelism not in PARALLELISMS:
            raise ValueError(f"training.parallelism must be one of {list(PARALLELISMS)}, got {self.parallelism!r}")
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise ValueError(f"training.mixed_precision must be one of {list(MIXED_PRECISIONS)}, "
                             f"got {self.mixed_precision!r}")
        for name in ("compile", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"training.{name} must be true or false, got {getattr(self, name)!r}")
        if self.sync.local and self.parallelism != "ddp":
            raise ValueError(f"training.sync.mode {self.sync.mode!r} needs parallelism 'ddp' (every replica holds "
                             f"the whole model), got {self.parallelism!r}")


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


#: Key of the Ray Train loop config (beside :meth:`TrialConfig.to_dict`'s) holding when the trial
#: started, Unix seconds: set by the Tune trainable, read by ``workloads._ray_adapter`` (``startup_s``).
TRIAL_STARTED_KEY = "_trial_started_unix"
#: Key of the Ray Train loop config holding the intra-op threads every worker of the trial uses
#: (:func:`workloads.determinism.torch_threads_per_worker`): set by the Tune trainable, applied by ``workloads.determinism``.
TORCH_THREADS_KEY = "_torch_threads"
CHECKPOINT_DIR_KEY = "_checkpoint_dir"  #: a trial runner's trial: its own checkpoint folder (workloads/_ray_runner.py)


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
        faults: set only by tests (:class:`workloads.faults.FaultPlan`).
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
    faults: FaultPlan | None = None

    @property
    def context_length_tokens(self) -> int:
        """``T`` (``workload.model.context_length_tokens``), which the loop reads everywhere."""
        return self.workload.model.context_length_tokens

    def to_dict(self) -> dict[str, Any]:
        """A nested dict of plain values (sections as dicts); :meth:`from_dict` inverts it exactly."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialConfig":
        """Rebuild from :meth:`to_dict` (lists are accepted for tuples, e.g. after JSON).

        Raises:
            ValueError: an unknown key, named by its dotted path (``optimizer.lrr``).
            DataError: see :class:`WorkloadConfig` and :class:`FinetuneConfig`.
        """
        return _build(cls, d, "")


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    """``cls(**d)`` with nested sections built from dicts and sequences made tuples."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"unknown trial config keys: {sorted(where + k for k in unknown)}")
    return cls(**{k: _coerce(hints[k], v, f"{where}{k}.") for k, v in d.items()})


def _coerce(tp: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(inner[0], value, where) if len(inner) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return _build(tp, value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, where) for v in value)
        return tuple(_coerce(a, v, where) for a, v in zip(args, value))
    return value
