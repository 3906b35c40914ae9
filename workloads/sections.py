"""The trial config's sections that a sweep spec embeds, each defined once: fields, defaults, bounds, docs.

Frozen, strict pydantic models (unknown fields refused, strict integers refuse booleans, strict booleans
refuse ``"yes"``, ``"on"`` and ``1``). A trial's config (:mod:`workloads.config`) holds them; the sweep spec's
sections (``sweeps.spec``) are their subclasses, which add only a user-facing docstring and what the spec
alone checks. Beside them, the
vocabularies both sides use: optimizer names, sync modes, parallelisms, mixed precisions, and the one
rule that local_sgd and diloco need ddp.

Plain data: imports neither torch nor Ray (the REST service parses specs through it).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, field_validator, model_validator

__all__ = [
    "LR_RULES",
    "MAX_BATCH_SEQUENCES",
    "MAX_TOKENS",
    "MAX_WIDTH",
    "MIXED_PRECISIONS",
    "MODEL_SHORTHAND_FIELDS",
    "OPTIMIZER_NAMES",
    "PARALLELISMS",
    "SYNC_MODES",
    "TRAINING_FIELDS",
    "ConfigSection",
    "DataConfig",
    "FinetuneConfig",
    "LoraConfig",
    "LrRule",
    "MixedPrecision",
    "ModelConfig",
    "NoiseScaleConfig",
    "OptimizerName",
    "OptimizerSettings",
    "Parallelism",
    "PositiveInt",
    "ScheduleConfig",
    "SyncConfig",
    "SyncMode",
    "TrainingConfig",
    "local_sync_error",
    "reads_beta2",
    "replace",
]

#: ``optimizer.name``: built by ``workloads.train.optim.build_optimizer``
OptimizerName = Literal["adamw", "adafactor", "adamw_8bit", "sgd_momentum"]
OPTIMIZER_NAMES = typing.get_args(OptimizerName)
#: the LR scaling rules a sweep may name (``search.lr_rules``); their exponents are
#: ``workloads.train.scaling.LR_RULE_EXPONENTS``
LrRule = Literal["linear", "sqrt", "none"]
LR_RULES = typing.get_args(LrRule)
#: ``TrainingConfig.parallelism``: hand-made data parallelism (one all-reduce) or FSDP2 ``fully_shard``
Parallelism = Literal["ddp", "fsdp"]
PARALLELISMS = typing.get_args(Parallelism)
#: ``TrainingConfig.mixed_precision``: ``auto`` is bf16 autocast on CUDA, float32 elsewhere
MixedPrecision = Literal["auto", "bf16", "fp32"]
MIXED_PRECISIONS = typing.get_args(MixedPrecision)
#: ``SyncConfig.mode``: a gradient all-reduce every step, or replicas that synchronise every H steps
SyncMode = Literal["ddp", "local_sgd", "diloco"]
SYNC_MODES = typing.get_args(SyncMode)

#: Integers refuse booleans, floats and strings (strict): ``true`` is not 1 and ``8.0`` is not 8.
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
#: Upper bounds: generous for any real sweep, small enough that no field can ask for absurd work.
MAX_TOKENS = 10**13  # 10 T tokens: more than a frontier model's whole training run
MAX_BATCH_SEQUENCES = 2**20  # ~1 M sequences per global batch
MAX_WIDTH = 65536  # d_model (today's largest models use <= 16384)


def reads_beta2(name: str) -> bool:
    """Whether optimizer ``name`` has a constant beta2 (the Adam family), which a sweep's ``search.beta2`` sets."""
    return name in ("adamw", "adamw_8bit")


def local_sync_error(mode: str, parallelism: str, *, where: str) -> str | None:
    """The one rule between sync mode and parallelism: local_sgd and diloco keep the whole model on every
    replica, so they need ``ddp``. The message names the fields under ``where`` (``"resources"`` in a spec,
    ``"training"`` in a trial config); None when the pair is allowed."""
    if mode == "ddp" or parallelism == "ddp":
        return None
    return (
        f"{where}.sync: {mode} needs {where}.parallelism ddp (every replica holds the whole model), got {parallelism}"
    )


S = TypeVar("S", bound="ConfigSection")


class ConfigSection(BaseModel):
    """A frozen, strict section: unknown fields are refused, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    #: the order of :meth:`fields` (so of a trial's dict, ``TrialConfig.to_dict``) where it is not the fields':
    #: the order the section had as a dataclass, before the spec's section embedded it
    _fields_order: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, section: ConfigSection) -> typing.Self:
        """This class's part of ``section`` (a spec section that embeds it): the same field values, this type,
        and a nested section as the type this class's field names (``FinetuneSpec.lora``, a ``LoraSpec``,
        becomes a ``LoraConfig``)."""
        values = {}
        for name, field in cls.model_fields.items():
            value = getattr(section, name)
            target = next(
                (
                    t
                    for t in (typing.get_args(field.annotation) or (field.annotation,))
                    if isinstance(t, type) and issubclass(t, ConfigSection)
                ),
                None,
            )
            values[name] = target.of(value) if target is not None and isinstance(value, ConfigSection) else value
        return cls(**values)

    def fields(self) -> dict[str, Any]:
        """``{field: value}`` in field order (nested values as they are)."""
        return {name: getattr(self, name) for name in self._fields_order or type(self).model_fields}


def replace(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for a trial config: a dataclass, or a :class:`ConfigSection` (validated again).

    Raises:
        pydantic.ValidationError: a section's new value out of its bounds (a ``ValueError``).
    """
    if isinstance(obj, ConfigSection):
        return type(obj)(**{**obj.fields(), **changes})
    return dataclasses.replace(obj, **changes)


class SyncConfig(ConfigSection):
    """How the data-parallel workers synchronise (``workloads.train.sync``).

    ``ddp``: the step's gradient is all-reduced every step. ``local_sgd``: each worker is a replica
    that steps its own optimizer on its own slice of the global batch; the parameters are averaged
    every ``every_steps`` optimizer steps (Stich 2019, arXiv:1805.09767; Lin et al. 2020,
    arXiv:1808.07217). ``diloco``: the same inner steps; every ``every_steps`` steps an outer SGD step
    with Nesterov momentum on the anchor weights, whose gradient is ``anchor - mean of the replicas``
    (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1). ``every_steps`` is not read under ddp.

    Raises:
        pydantic.ValidationError: an unknown mode, ``every_steps < 1``, ``outer_lr <= 0``, a momentum outside [0, 1).
    """

    mode: SyncMode = Field(
        default="ddp",
        description="ddp: gradient all-reduce every step; local_sgd: parameter averaging every "
        "every_steps steps; diloco: an outer Nesterov step every every_steps steps",
    )
    every_steps: PositiveInt = Field(
        default=16, le=1_000_000, description="H: optimizer steps between synchronisations (local_sgd, diloco)"
    )
    outer_lr: float = Field(
        default=0.7, gt=0, le=100, description="DiLoCo's outer learning rate (Douillard et al. 2023: 0.7)"
    )
    outer_momentum: float = Field(
        default=0.9, ge=0, lt=1, description="DiLoCo's outer Nesterov momentum (Douillard et al. 2023: 0.9)"
    )

    @property
    def local(self) -> bool:
        """Whether the workers are replicas that train apart between synchronisations."""
        return self.mode != "ddp"


class TrainingConfig(ConfigSection):
    """How the model is run (``workloads.train.parallel``); none of it changes the step's mathematics.

    ``parallelism``: ``"ddp"`` (every rank holds the model; one all-reduce of the step's gradient) or
    ``"fsdp"`` (FSDP2 ``fully_shard`` of every decoder layer and the root; needs a process group of at
    least 2 ranks). ``compile``: ``torch.compile`` the model (the whole model under ddp, each decoder layer
    under fsdp). ``activation_checkpointing``: recompute each decoder layer's activations in the backward
    pass (Hugging Face ``gradient_checkpointing_enable``, non-reentrant). ``mixed_precision``: ``"auto"``
    (bf16 autocast on CUDA, float32 elsewhere), ``"bf16"`` (bf16 autocast on any device, CPU autocast
    included) or ``"fp32"``; weights, gradients and optimizer state stay float32. ``sync``: how the workers
    synchronise (:class:`SyncConfig`; local_sgd and diloco only under ddp, :func:`local_sync_error`).
    The spec's ``resources`` section declares its four flags with these very fields (``TRAINING_FIELDS``).

    Raises:
        pydantic.ValidationError: an unknown ``parallelism`` or ``mixed_precision``, a non-boolean flag, a
            local_sgd or diloco ``sync`` under fsdp.
    """

    parallelism: Parallelism = Field(
        default="ddp",
        description="ddp: every worker holds the model, one all-reduce per step; fsdp: FSDP2 fully_shard "
        "of each decoder layer and the root (pretrain, at least 2 workers)",
    )
    compile: bool = Field(
        default=False, strict=True, description="torch.compile the model (each decoder layer under fsdp)"
    )
    activation_checkpointing: bool = Field(
        default=False, strict=True, description="recompute decoder-layer activations in backward"
    )
    mixed_precision: MixedPrecision = Field(
        default="auto", description="autocast: auto = bf16 on GPU, fp32 on CPU; bf16 also on CPU; fp32 never"
    )
    sync: SyncConfig = SyncConfig()

    @model_validator(mode="after")
    def _local_sync_needs_ddp(self) -> TrainingConfig:
        error = local_sync_error(self.sync.mode, self.parallelism, where="training")
        if error:
            raise ValueError(error)
        return self


#: the flags of :class:`TrainingConfig` that the spec's ``resources`` section declares with the same field
#: definitions (default, bounds, description): ``resources.parallelism = TRAINING_FIELDS["parallelism"]`` (typed
#: ``Any``: a class body assigns each to an annotated field, as pydantic reads a ``Field(...)``)
TRAINING_FIELDS: dict[str, typing.Any] = {
    name: TrainingConfig.model_fields[name]
    for name in ("parallelism", "compile", "activation_checkpointing", "mixed_precision")
}


class NoiseScaleConfig(ConfigSection):
    """The gradient-noise-scale estimator (McCandlish et al. 2018, Eq. A.2 and Appendix A.1).

    Attributes:
        enabled: estimate ``B_simple`` (needs at least two micro-batches per step).
        ema_decay: decay of its bias-corrected EMAs, per optimizer step, in (0, 1).
    """

    enabled: bool = Field(default=True, strict=True)
    ema_decay: float = Field(default=0.95, gt=0, lt=1)


#: module names: a YAML list, held as a tuple (hashable, frozen); dumped as a list
_ModuleNames = Annotated[
    list[str], Field(min_length=1), AfterValidator(tuple), PlainSerializer(list, return_type=list[str])
]


class LoraConfig(ConfigSection):
    """LoRA adapters (``peft``): only they train.

    Attributes:
        rank: ``r`` of each adapter pair (at most 4096).
        alpha: ``lora_alpha`` (the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input, in [0, 1) (draws from the torch RNG in training forwards).
        target_modules: a module is adapted when its name ends with one of these (a tuple; at least one).
    """

    rank: PositiveInt = Field(default=8, le=4096)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: _ModuleNames = Field(default_factory=lambda: ["q_proj", "v_proj"])

    def to_dict(self) -> dict[str, Any]:
        """``{rank, alpha, dropout, target_modules}`` with a list of modules (JSON, ``peft``)."""
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "target_modules": list(self.target_modules),
        }


class FinetuneConfig(ConfigSection):
    """Supervised fine-tuning of a local checkpoint on instruction JSON Lines.

    ``checkpoint_dir``: a local Hugging Face checkpoint (``config.json`` + weights), or a LoRA adapter
    directory saved by this workload. ``prompt_field``, ``response_field``: JSON keys of each line.
    ``prompt_template``: text around the prompt; must contain ``{prompt}`` (replaced literally, so other
    braces are kept as they are). ``packing``: ``"packed"`` or ``"padded"``. ``truncate``: cut over-long
    examples to the context length (counted; an example whose prompt alone fills the context is skipped,
    also counted) instead of refusing the data. ``lora``: None (full fine-tuning) or the adapters.

    Raises:
        pydantic.ValidationError: a template without ``{prompt}``, an unknown packing, an empty field name.
    """

    checkpoint_dir: str
    prompt_field: str = "question"
    response_field: str = "answer"
    prompt_template: str = "Question: {prompt}\nAnswer: "
    packing: Literal["packed", "padded"] = "packed"
    truncate: bool = Field(
        default=False, strict=True, description="truncate over-long examples (counted and reported) instead of refusing"
    )
    lora: LoraConfig | None = None

    @field_validator("prompt_template")
    @classmethod
    def _has_prompt(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise ValueError(f"must contain '{{prompt}}': {v!r}")
        return v

    @field_validator("prompt_field", "response_field")
    @classmethod
    def _named(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty (a JSON key of each line)")
        return v

    def template(self, prompt: str) -> str:
        """The prompt text the model sees."""
        return self.prompt_template.replace("{prompt}", prompt)


class ScheduleConfig(ConfigSection):
    """LR warmup and how a milestone's model is evaluated (methodology section 11.2).

    Attributes:
        kind: ``"constant_ema"`` (constant LR, a bias-corrected weight EMA is evaluated) or
            ``"wsd"`` (each milestone is evaluated after a short linear-decay branch).
        decay_fraction: a WSD decay branch lasts this fraction of the tokens seen, in (0, 0.5].
        warmup_tokens, warmup_min_steps, ema_half_life_tokens: their field descriptions
            (``workloads.train.scaling.warmup_length_tokens``).
    """

    kind: Literal["constant_ema", "wsd"] = "constant_ema"
    warmup_tokens: int = Field(
        default=32768,
        ge=0,
        le=MAX_TOKENS,
        strict=True,
        description="linear LR warmup, in tokens (the same for every batch size; at most 1e13)",
    )
    warmup_min_steps: int = Field(
        default=4,
        ge=0,
        le=10000,
        strict=True,
        description="the warmup lasts at least this many optimizer steps of the trial's batch: it ramps over "
        "max(warmup_tokens, warmup_min_steps * B * T) tokens, the LR factor of a step being "
        "min(1, tokens seen after it / that length) (0: warmup_tokens alone)",
    )
    ema_half_life_tokens: float = Field(
        default=32768.0, gt=0, le=MAX_TOKENS, description="weight-EMA half-life in tokens (at most 1e13)"
    )
    decay_fraction: float = Field(default=0.1, gt=0, le=0.5)


#: the shorthand's fields: the architecture in five numbers (and tied heads), when ``hf_config`` is not given
MODEL_SHORTHAND_FIELDS = ("family", "d_model", "n_layers", "n_heads", "d_ff", "tie_word_embeddings")


class ModelConfig(ConfigSection):
    """A Hugging Face causal LM's architecture (pretraining) and the trained sequence length.

    Either the shorthand (``family`` with ``d_model``, ``n_layers``, ``n_heads`` (as many key/value heads),
    ``d_ff``, ``tie_word_embeddings``) or ``hf_config``: a whole ``transformers`` config as keyword
    arguments of ``AutoConfig.for_model`` (``model_type`` included), which then defines the architecture;
    a spec may give the path of a ``config.json`` instead, which the sweep reads before a trial starts.
    ``context_length_tokens`` is ``T``, the tokens per sequence; fine-tuning reads its architecture from
    the checkpoint and uses only it. ``flops_per_token``: training FLOPs per token (forward + backward)
    used instead of ``workloads.model.flops``' formula (None: counted from the config).

    Raises:
        pydantic.ValidationError: a field out of its bounds, ``n_heads`` not dividing ``d_model`` (shorthand),
            an ``hf_config`` that is neither a mapping with ``model_type`` nor a local path.
    """

    family: Literal["llama", "gpt2"] = "llama"
    d_model: PositiveInt = Field(default=96, le=MAX_WIDTH, description="hidden width (at most 65536)")
    n_layers: PositiveInt = Field(default=3, le=1024, description="transformer blocks (at most 1024)")
    n_heads: PositiveInt = Field(default=4, le=1024, description="attention heads (at most 1024)")
    d_ff: PositiveInt | None = Field(
        default=None,
        le=4 * MAX_WIDTH,
        description="MLP width (at most 262144); default 4*d_model (gpt2) or 8/3*d_model rounded to 16 (llama)",
    )
    context_length_tokens: PositiveInt = Field(
        default=64, le=2**20, description="sequence length in tokens (at most 1048576)"
    )
    tie_word_embeddings: bool = Field(default=False, strict=True)
    hf_config: dict[str, Any] | str | None = Field(
        default=None,
        description="a transformers config instead of the shorthand: a mapping with model_type (AutoConfig.for_model), "
        "or the path of a config.json (relative paths resolve from the working directory)",
    )
    flops_per_token: float | None = Field(
        default=None,
        gt=0,
        le=1e18,
        description="training FLOPs per token (forward + backward) instead of the formula's; required for an "
        "architecture the formula does not know (mixture of experts, other model types)",
    )

    @field_validator("hf_config", mode="before")
    @classmethod
    def _hf_config(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (str, dict)):
            raise ValueError(f"give a mapping with model_type or the path of a config.json, not {type(v).__name__}")
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("must not be empty: the path of a config.json")
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", v):
                raise ValueError(f"{v!r} is a URI; give a local config.json path or the config inline")
        elif isinstance(v, dict):
            model_type = v.get("model_type")
            if not isinstance(model_type, str) or not model_type.strip():
                raise ValueError("an inline config needs model_type (a transformers model type, e.g. 'llama')")
        return v

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hf_config is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self

    @property
    def d_ff_resolved(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.family == "gpt2":
            return 4 * self.d_model
        return int(math.ceil(8 * self.d_model / 3 / 16) * 16)


class DataConfig(ConfigSection):
    """The training text and its tokenizer (a trial's: ``path`` absolute on the workers).

    Pretraining reads ``shards`` when set (a prepared token-shard folder or fsspec URI the workers
    memory-map, ``workloads.data.shards``; ``path`` is then not read) and ``path`` (a text file) otherwise;
    fine-tuning reads ``path`` (JSON Lines). ``validation_fraction`` is the held-out tail (of tokens, or
    of examples when fine-tuning); with ``shards`` the split is the index's.
    """

    path: str | None = Field(
        default=None,
        description="text file (pretrain) or JSON Lines (finetune); relative paths resolve from the working directory",
    )
    shards: str | None = Field(
        default=None,
        description="pretrain: a folder of prepared token shards (its index.json) "
        "or an fsspec URI (s3://, gs://, ...); see critbatch prepare-data",
    )
    tokenizer: str = Field(
        default="byte",
        description="'byte' (256 byte-level ids) or a local Hugging Face tokenizer directory; "
        "with shards, the one that made them (its hash is checked)",
    )
    validation_fraction: float = Field(
        default=0.1,
        gt=0.0,
        lt=0.5,
        description="held-out fraction of data.path's tokens (with shards the split is the index's)",
    )

    _fields_order = ("path", "tokenizer", "validation_fraction", "shards")


class OptimizerSettings(ConfigSection):
    """The optimizer's settings that do not depend on the batch (the spec's ``optimizer`` section; the
    trial's :class:`workloads.config.OptimizerConfig` adds the LR and beta2 scaled for its batch).

    ``name`` is one of :data:`OPTIMIZER_NAMES` (``workloads.train.optim.build_optimizer`` says which
    hyperparameters each one reads); ``eps`` is Adam's epsilon, ``weight_decay`` decoupled weight decay,
    ``grad_clip_norm`` the global gradient-norm clip (None: no clip).
    """

    name: OptimizerName = Field(
        default="adamw",
        description="adamw | adafactor | adamw_8bit (bitsandbytes, 8-bit moments) | sgd_momentum "
        "(momentum = beta1); adafactor and sgd_momentum have no beta2",
    )
    beta1: float = Field(
        default=0.9, ge=0.0, lt=1.0, description="Adam beta1; sgd_momentum's momentum; not read by adafactor"
    )
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    grad_clip_norm: float | None = Field(default=1.0, gt=0, le=1e6)
    divergence_loss_factor: float = Field(
        default=1.5,
        gt=1.0,
        le=100,
        description="a trial diverges when its loss exceeds this factor x ln(vocab) or is not finite",
    )

    @property
    def reads_beta2(self) -> bool:
        """Whether this optimizer has a constant beta2 (:func:`reads_beta2`)."""
        return reads_beta2(self.name)
