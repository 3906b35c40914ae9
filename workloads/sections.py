"""The trial config's sections that a sweep spec embeds, each defined once: fields, defaults, bounds, docs.

Frozen, strict pydantic models (unknown fields refused, strict integers refuse booleans). A trial's
config (:mod:`workloads.config`) holds them; the sweep spec's sections (``sweeps.spec``) are their
subclasses, which add only a user-facing docstring and what the spec alone checks. Beside them, the
vocabularies both sides use: optimizer names, sync modes, parallelisms, mixed precisions, and the one
rule that local_sgd and diloco need ddp.

Plain data: imports neither torch nor Ray (the REST service parses specs through it).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer

__all__ = [
    "ConfigSection", "replace", "SyncConfig", "NoiseScaleConfig", "LoraConfig", "ScheduleConfig", "DataConfig",
    "OptimizerSettings", "OptimizerName", "OPTIMIZER_NAMES", "reads_beta2", "SyncMode", "SYNC_MODES", "Parallelism",
    "PARALLELISMS", "MixedPrecision", "MIXED_PRECISIONS", "local_sync_error", "PositiveInt", "MAX_TOKENS",
    "MAX_BATCH_SEQUENCES", "MAX_WIDTH",
]

#: ``optimizer.name``: built by ``workloads.optim.build_optimizer``
OptimizerName = Literal["adamw", "adafactor", "adamw_8bit", "sgd_momentum"]
OPTIMIZER_NAMES = typing.get_args(OptimizerName)
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
#: Upper bounds (issue 14): generous for any real sweep, small enough that no field can ask for absurd work.
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
    return (f"{where}.sync: {mode} needs {where}.parallelism ddp (every replica holds the whole model), "
            f"got {parallelism}")


S = TypeVar("S", bound="ConfigSection")


class ConfigSection(BaseModel):
    """A frozen, strict section: unknown fields are refused, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    #: the order of :meth:`fields` (so of a trial's dict, ``TrialConfig.to_dict``) where it is not the fields':
    #: the order the section had as a dataclass, before the spec's section embedded it
    _fields_order: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls: type[S], section: "ConfigSection") -> S:
        """This class's part of ``section`` (a spec section that embeds it): the same field values, this type."""
        return cls(**{name: getattr(section, name) for name in cls.model_fields})

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
    """How the data-parallel workers synchronise (``workloads.sync``).

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
        default="ddp", description="ddp: gradient all-reduce every step; local_sgd: parameter averaging every "
                                   "every_steps steps; diloco: an outer Nesterov step every every_steps steps")
    every_steps: PositiveInt = Field(default=16, le=1_000_000,
                                     description="H: optimizer steps between synchronisations (local_sgd, diloco)")
    outer_lr: float = Field(default=0.7, gt=0, le=100, description="DiLoCo's outer learning rate (Douillard et al. 2023: 0.7)")
    outer_momentum: float = Field(default=0.9, ge=0, lt=1,
                                  description="DiLoCo's outer Nesterov momentum (Douillard et al. 2023: 0.9)")

    @property
    def local(self) -> bool:
        """Whether the workers are replicas that train apart between synchronisations."""
        return self.mode != "ddp"


class NoiseScaleConfig(ConfigSection):
    """The gradient-noise-scale estimator (McCandlish et al. 2018, Eq. A.2 and Appendix A.1).

    Attributes:
        enabled: estimate ``B_simple`` (needs at least two micro-batches per step).
        ema_decay: decay of its bias-corrected EMAs, per optimizer step, in (0, 1).
    """

    enabled: bool = True
    ema_decay: float = Field(default=0.95, gt=0, lt=1)


#: module names: a YAML list, held as a tuple (hashable, frozen); dumped as a list
_ModuleNames = Annotated[list[str], Field(min_length=1), AfterValidator(tuple),
                         PlainSerializer(list, return_type=list[str])]


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
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules)}


class ScheduleConfig(ConfigSection):
    """LR warmup and how a milestone's model is evaluated (methodology section 11.2).

    Attributes:
        kind: ``"constant_ema"`` (constant LR, a bias-corrected weight EMA is evaluated) or
            ``"wsd"`` (each milestone is evaluated after a short linear-decay branch).
        decay_fraction: a WSD decay branch lasts this fraction of the tokens seen, in (0, 0.5].
        warmup_tokens, warmup_min_steps, ema_half_life_tokens: their field descriptions
            (``workloads.scaling.warmup_length_tokens``).
    """

    kind: Literal["constant_ema", "wsd"] = "constant_ema"
    warmup_tokens: int = Field(default=32768, ge=0, le=MAX_TOKENS, strict=True,
                               description="linear LR warmup, in tokens (the same for every batch size; at most 1e13)")
    warmup_min_steps: int = Field(
        default=4, ge=0, le=10000, strict=True,
        description="the warmup lasts at least this many optimizer steps of the trial's batch: it ramps over "
                    "max(warmup_tokens, warmup_min_steps * B * T) tokens, the LR factor of a step being "
                    "min(1, tokens seen after it / that length) (0: warmup_tokens alone)")
    ema_half_life_tokens: float = Field(default=32768.0, gt=0, le=MAX_TOKENS, description="weight-EMA half-life in tokens (at most 1e13)")
    decay_fraction: float = Field(default=0.1, gt=0, le=0.5)


class DataConfig(ConfigSection):
    """The training text and its tokenizer (a trial's: ``path`` absolute on the workers).

    Pretraining reads ``shards`` when set (a prepared token-shard folder or fsspec URI the workers
    memory-map, ``workloads.shards``; ``path`` is then not read) and ``path`` (a text file) otherwise;
    fine-tuning reads ``path`` (JSON Lines). ``validation_fraction`` is the held-out tail (of tokens, or
    of examples when fine-tuning); with ``shards`` the split is the index's.
    """

    path: str | None = Field(default=None, description="text file (pretrain) or JSON Lines (finetune); relative paths resolve from the working directory")
    shards: str | None = Field(default=None, description="pretrain: a folder of prepared token shards (its index.json) "
                                                        "or an fsspec URI (s3://, gs://, ...); see critbatch prepare-data")
    tokenizer: str = Field(default="byte", description="'byte' (256 byte-level ids) or a local Hugging Face tokenizer directory; "
                                                       "with shards, the one that made them (its hash is checked)")
    validation_fraction: float = Field(default=0.1, gt=0.0, lt=0.5, description="held-out fraction of data.path's tokens "
                                                                                 "(with shards the split is the index's)")

    _fields_order = ("path", "tokenizer", "validation_fraction", "shards")


class OptimizerSettings(ConfigSection):
    """The optimizer's settings that do not depend on the batch (the spec's ``optimizer`` section; the
    trial's :class:`workloads.config.OptimizerConfig` adds the LR and beta2 scaled for its batch).

    ``name`` is one of :data:`OPTIMIZER_NAMES` (``workloads.optim.build_optimizer`` says which
    hyperparameters each one reads); ``eps`` is Adam's epsilon, ``weight_decay`` decoupled weight decay,
    ``grad_clip_norm`` the global gradient-norm clip (None: no clip).
    """

    name: OptimizerName = Field(
        default="adamw", description="adamw | adafactor | adamw_8bit (bitsandbytes, 8-bit moments) | sgd_momentum "
                                     "(momentum = beta1); adafactor and sgd_momentum have no beta2")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="Adam beta1; sgd_momentum's momentum; not read by adafactor")
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    grad_clip_norm: float | None = Field(default=1.0, gt=0, le=1e6)
    divergence_loss_factor: float = Field(
        default=1.5, gt=1.0, le=100, description="a trial diverges when its loss exceeds this factor x ln(vocab) or is not finite"
    )

    @property
    def reads_beta2(self) -> bool:
        """Whether this optimizer has a constant beta2 (:func:`reads_beta2`)."""
        return reads_beta2(self.name)
