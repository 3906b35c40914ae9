"""The sweep spec: a YAML file validated by pydantic models.

A spec says *what* to sweep (the workload, the model, the data, the per-trial token budget, the
batch sizes, the learning-rate scaling rules and Adam's beta2) and *where* (resources, tracking).
Every size names its unit: ``_tokens``, ``_sequences``, ``_steps``, ``_flops``, ``_s``.

Load and validate with :func:`load_spec`; every invalid field is reported by its dotted path
(``search.batch_sizes_sequences.2``) in one :class:`SpecError`.

This module is plain data: it imports neither torch nor Ray, so the REST service can use it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "SpecError",
    "SweepSpec",
    "ModelSpec",
    "DataSpec",
    "EvalSpec",
    "ScheduleSpec",
    "SearchSpec",
    "InitialPointSpec",
    "Beta2Spec",
    "OptimizerSpec",
    "ResourcesSpec",
    "TrackingSpec",
    "FinetuneSpec",
    "LoraSpec",
    "NoiseScaleSpec",
    "BranchSpec",
    "BudgetSpec",
    "PruningSpec",
    "BatchWarmupSpec",
    "load_spec",
    "resolved_spec_dict",
    "parse_spec",
    "spec_errors",
]

LrRule = Literal["linear", "sqrt", "none"]


class SpecError(ValueError):
    """A sweep spec is invalid.

    Attributes:
        errors: one ``(path, message)`` pair per invalid field; ``path`` is dotted
            (``search.batch_sizes_sequences.2``), or ``<root>`` for file-level problems.
    """

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        lines = "\n".join(f"  {p}: {m}" for p, m in errors)
        super().__init__(f"invalid sweep spec ({len(errors)} error(s)):\n{lines}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


#: Integers refuse booleans, floats and strings (strict): ``true`` is not 1 and ``8.0`` is not 8.
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
#: Upper bounds (issue 14): generous for any real sweep, small enough that no field can ask for absurd work.
MAX_TOKENS = 10**13  # 10 T tokens: more than a frontier model's whole training run
MAX_BATCH_SEQUENCES = 2**20  # ~1 M sequences per global batch
MAX_WIDTH = 65536  # d_model (today's largest models use <= 16384)


class ModelSpec(_Strict):
    """A Hugging Face causal-LM built from a config (pretraining)."""

    family: Literal["llama", "gpt2"] = "llama"
    d_model: PositiveInt = Field(default=96, le=MAX_WIDTH, description="hidden width (at most 65536)")
    n_layers: PositiveInt = Field(default=3, le=1024, description="transformer blocks (at most 1024)")
    n_heads: PositiveInt = Field(default=4, le=1024, description="attention heads (at most 1024)")
    d_ff: PositiveInt | None = Field(
        default=None, le=4 * MAX_WIDTH,
        description="MLP width (at most 262144); default 4*d_model (gpt2) or 8/3*d_model rounded to 16 (llama)"
    )
    context_length_tokens: PositiveInt = Field(default=64, le=2**20, description="sequence length in tokens (at most 1048576)")
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelSpec":
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self

    @property
    def d_ff_resolved(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.family == "gpt2":
            return 4 * self.d_model
        return int(math.ceil(8 * self.d_model / 3 / 16) * 16)


class DataSpec(_Strict):
    """Training text and its tokenizer."""

    path: str = Field(description="text file (pretrain) or JSON Lines (finetune); relative paths resolve from the working directory")
    tokenizer: str = Field(default="byte", description="'byte' (256 byte-level ids) or a local Hugging Face tokenizer directory")
    validation_fraction: float = Field(default=0.1, gt=0.0, lt=0.5)

    @field_validator("path")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", v):
            # every worker opens data.path as a local file: a URI validated, then failed every trial
            raise ValueError(f"{v!r} is a URI; the workers read local files only: give a path every node can read")
        return v


class EvalSpec(_Strict):
    """Evaluation on the held-out split at token milestones shared by every batch size."""

    milestones: int = Field(default=16, ge=2, le=200, strict=True, description="evaluations per trial, evenly spaced in tokens")
    eval_tokens: PositiveInt = Field(default=16384, le=10**9,
                                     description="held-out tokens per evaluation (a fixed set; at most 1e9)")


class ScheduleSpec(_Strict):
    """Horizon-free learning-rate schedule (methodology section 11.2).

    ``constant_ema``: linear warmup over ``max(warmup_tokens, warmup_min_steps * B * T)`` tokens
    (the same tokens for every batch size, yet a ramp of at least ``warmup_min_steps`` optimizer
    steps at large batches: Goyal et al. 2017, gradual warmup), then a constant LR; an exponential
    moving average of the weights (half-life in tokens, so equal for every batch size) is what is
    evaluated (Zhang et al. 2024). ``wsd``: warmup-stable-decay, where each milestone's evaluation
    is taken after a short linear decay branch of ``decay_fraction`` of the tokens seen, and
    training continues from the stable branch.
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


class Beta2Spec(_Strict):
    """Adam's beta2: fixed values, or a token half-life range (Marek et al. 2025).

    With a half-life ``t_half`` in tokens, ``beta2 = 0.5 ** (B*T / t_half)``.
    Exactly one of ``values`` and ``half_life_tokens`` is given.
    """

    values: list[Annotated[float, Field(gt=0.0, lt=1.0)]] | None = None
    half_life_tokens: tuple[Annotated[float, Field(gt=0, le=MAX_TOKENS)], Annotated[float, Field(gt=0, le=MAX_TOKENS)]] | None = Field(
        default=None, description="[low, high] in tokens (at most 1e13), searched log-uniformly"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> "Beta2Spec":
        if (self.values is None) == (self.half_life_tokens is None):
            raise ValueError("give exactly one of 'values' and 'half_life_tokens'")
        if self.values is not None and not self.values:
            raise ValueError("'values' must not be empty")
        if self.half_life_tokens is not None and self.half_life_tokens[0] > self.half_life_tokens[1]:
            raise ValueError("half_life_tokens: low must be <= high")
        return self


class InitialPointSpec(_Strict):
    """A known configuration evaluated first at every batch size (Optuna ``enqueue_trial``).

    Each field is one searched dimension; a dimension left out is sampled as usual. Give ``beta2``
    when the spec searches ``beta2.values``, ``beta2_half_life_tokens`` when it searches
    ``beta2.half_life_tokens`` (tokens, so the same point means the same averaging horizon at every
    batch size).
    """

    lr_rule: LrRule | None = Field(default=None, description="one of search.lr_rules")
    lr_multiplier: float | None = Field(default=None, gt=0, le=1000,
                                        description="within search.lr_multiplier [low, high] (at most 1000)")
    beta2: float | None = Field(default=None, gt=0.0, lt=1.0, description="one of search.beta2.values")
    beta2_half_life_tokens: float | None = Field(
        default=None, gt=0, le=MAX_TOKENS,
        description="beta2 as a token half-life in tokens, within search.beta2.half_life_tokens (at most 1e13)")

    @model_validator(mode="after")
    def _something(self) -> "InitialPointSpec":
        if all(v is None for v in (self.lr_rule, self.lr_multiplier, self.beta2, self.beta2_half_life_tokens)):
            raise ValueError("give at least one of lr_rule, lr_multiplier, beta2, beta2_half_life_tokens")
        if self.beta2 is not None and self.beta2_half_life_tokens is not None:
            raise ValueError("give beta2 or beta2_half_life_tokens, not both")
        return self

    def given(self) -> dict[str, Any]:
        """The dimensions this point fixes, ``{name: value}``."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class SearchSpec(_Strict):
    """What is searched: batch sizes (a grid), and per batch size the LR rule, multiplier and beta2."""

    batch_sizes_sequences: list[Annotated[int, Field(gt=0, le=MAX_BATCH_SEQUENCES, strict=True)]] = Field(
        min_length=1, max_length=64, description="global batch sizes in sequences (1-64 of them, each at most 2^20)")
    base_lr: float = Field(gt=0, lt=10)
    base_batch_size_sequences: PositiveInt = Field(le=MAX_BATCH_SEQUENCES, description="the batch the base LR is for (sequences)")
    lr_rules: list[LrRule] = Field(default_factory=lambda: ["sqrt"], min_length=1)
    lr_multiplier: tuple[Annotated[float, Field(gt=0, le=1000)], Annotated[float, Field(gt=0, le=1000)]] = (1.0, 1.0)
    beta2: Beta2Spec = Field(default_factory=lambda: Beta2Spec(values=[0.99]))
    trials_per_batch_size: PositiveInt = Field(default=1, le=1000, description="Optuna trials per batch size (at most 1000)")
    algorithm: Literal["optuna"] = "optuna"
    initial_points: list[InitialPointSpec] = Field(
        default_factory=list, max_length=1000,
        description="configurations evaluated first at every batch size, in order, before Optuna samples "
                    "(enqueued trials of each batch size's study); they count in trials_per_batch_size")

    @field_validator("batch_sizes_sequences")
    @classmethod
    def _unique_sorted(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("batch sizes must be unique")
        return sorted(v)

    @field_validator("lr_rules")
    @classmethod
    def _unique_rules(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("LR rules must be unique")
        return v

    @model_validator(mode="after")
    def _ranges(self) -> "SearchSpec":
        lo, hi = self.lr_multiplier
        if lo > hi:
            raise ValueError("lr_multiplier: low must be <= high")
        errs = [f"initial_points.{i}.{msg}" for i, p in enumerate(self.initial_points) for msg in self._outside(p)]
        if len(self.initial_points) > self.trials_per_batch_size:
            errs.append(f"initial_points: {len(self.initial_points)} point(s), more than trials_per_batch_size="
                        f"{self.trials_per_batch_size} (they count in it)")
        seen: dict[tuple, int] = {}
        for i, p in enumerate(self.initial_points):
            key = tuple(sorted(p.given().items()))
            if key in seen:
                errs.append(f"initial_points.{i}: the same point as initial_points.{seen[key]}")
            seen.setdefault(key, i)
        if errs:
            raise ValueError("; ".join(errs))
        return self

    def _outside(self, p: "InitialPointSpec") -> list[str]:
        """Why an initial point lies outside the searched space (one message per field)."""
        out = []
        if p.lr_rule is not None and p.lr_rule not in self.lr_rules:
            out.append(f"lr_rule: {p.lr_rule!r} is not one of lr_rules {list(self.lr_rules)}")
        lo, hi = self.lr_multiplier
        if p.lr_multiplier is not None and not lo <= p.lr_multiplier <= hi:
            out.append(f"lr_multiplier: {p.lr_multiplier:g} lies outside lr_multiplier [{lo:g}, {hi:g}]")
        if p.beta2 is not None:
            if self.beta2.values is None:
                out.append("beta2: the spec searches beta2.half_life_tokens: give beta2_half_life_tokens")
            elif p.beta2 not in self.beta2.values:
                out.append(f"beta2: {p.beta2:g} is not one of beta2.values {list(self.beta2.values)}")
        if p.beta2_half_life_tokens is not None:
            if self.beta2.half_life_tokens is None:
                out.append("beta2_half_life_tokens: the spec searches beta2.values: give beta2")
            else:
                lo2, hi2 = self.beta2.half_life_tokens
                if not lo2 <= p.beta2_half_life_tokens <= hi2:
                    out.append(f"beta2_half_life_tokens: {p.beta2_half_life_tokens:g} lies outside "
                               f"beta2.half_life_tokens [{lo2:g}, {hi2:g}]")
        return out


class OptimizerSpec(_Strict):
    """AdamW settings that are not searched."""

    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    grad_clip_norm: float | None = Field(default=1.0, gt=0, le=1e6)
    divergence_loss_factor: float = Field(
        default=1.5, gt=1.0, le=100, description="a trial diverges when its loss exceeds this factor x ln(vocab) or is not finite"
    )


class NoiseScaleSpec(_Strict):
    """Online gradient-noise-scale estimate (McCandlish et al. 2018, Appendix A.1)."""

    enabled: bool = True
    ema_decay: float = Field(default=0.95, gt=0, lt=1)


class BatchWarmupSpec(_Strict):
    """Batch-size warmup: global batch sizes by tokens seen (Merrill et al. 2025).

    ``schedule`` is a list of ``[tokens_seen, multiplier]``: from that many tokens on, the global batch
    is the trial's batch times ``multiplier`` divided by the last multiplier (so the run ends at
    the trial's batch size). Multipliers are integers, increasing, each a factor of the next.
    """

    schedule: list[tuple[Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)],
                         Annotated[int, Field(gt=0, le=MAX_BATCH_SEQUENCES, strict=True)]]] = Field(
        min_length=1, max_length=64, description="[tokens seen, multiplier] pairs (at most 64)")

    @model_validator(mode="after")
    def _monotone(self) -> "BatchWarmupSpec":
        if self.schedule[0][0] != 0:
            raise ValueError("schedule must start at 0 tokens")
        for (t0, m0), (t1, m1) in zip(self.schedule, self.schedule[1:]):
            if t1 <= t0:
                raise ValueError("token thresholds must increase")
            if m1 <= m0 or m1 % m0:
                raise ValueError("multipliers must increase by integer factors")
        return self


class ResourcesSpec(_Strict):
    """Where trials run. Global batch = micro-batch x accumulation steps x workers."""

    workers_per_trial: PositiveInt = Field(default=1, le=4096, description="Ray Train workers per trial (at most 4096)")
    cpus_per_worker: float = Field(default=1.0, gt=0, le=512, description="CPUs per worker (at most 512)")
    gpus_per_worker: float = Field(default=0.0, ge=0, le=16, description="GPUs per worker (at most 16)")
    max_concurrent_trials: PositiveInt = Field(default=2, le=1024, description="trials running at once (at most 1024)")
    micro_batch_size_sequences_max: PositiveInt = Field(default=64, le=MAX_BATCH_SEQUENCES,
                                                        description="largest micro-batch one worker runs at once")
    trial_driver_cpus: float = Field(default=0.01, gt=0, le=1, description="CPU reserved for each trial's Tune driver")
    max_failures: int = Field(default=2, ge=0, le=100, strict=True,
                              description="worker-failure retries per trial (Ray Train FailureConfig; at most 100)")
    storage_path: str | None = Field(
        default=None,
        description="Tune/Train state shared by every node (a folder or s3:// URI); default: env CRITBATCH_STORAGE_PATH, else the output folder",
    )


class TrackingSpec(_Strict):
    """MLflow tracking. The experiment is named after the sweep unless given."""

    uri: str | None = Field(default=None, description="MLflow tracking URI; default: --tracking-uri, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    experiment: str | None = None
    checkpoint_artifact_max_mb: float = Field(default=50.0, ge=0, le=100_000)


class LoraSpec(_Strict):
    """LoRA adapters through ``peft``."""

    rank: PositiveInt = Field(default=8, le=4096)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)


class FinetuneSpec(_Strict):
    """Supervised fine-tuning of a local Hugging Face checkpoint on instruction JSON Lines."""

    checkpoint_dir: str
    prompt_field: str = "question"
    response_field: str = "answer"
    prompt_template: str = "Question: {prompt}\nAnswer: "
    packing: Literal["packed", "padded"] = "packed"
    truncate: bool = Field(default=False, description="truncate over-long examples (counted and reported) instead of refusing")
    lora: LoraSpec | None = None


class BranchSpec(_Strict):
    """Local critical batch size by branching (Merrill et al. 2025)."""

    points_fraction: list[Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=lambda: [0.0, 0.1, 0.25, 0.5, 1.0])
    multipliers: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: [0.5, 1, 2, 4, 8])
    window_tokens: PositiveInt = Field(default=32768, le=MAX_TOKENS)
    epsilon: float = Field(default=0.01, gt=0)
    base_batch_size_sequences: PositiveInt | None = Field(default=None, le=MAX_BATCH_SEQUENCES)


class BudgetSpec(_Strict):
    """Sweep-wide limits; the sweep plans to fit and stops cleanly when one runs out."""

    sweep_flops: float | None = Field(default=None, gt=0, le=1e30, description="FLOPs for the whole sweep (at most 1e30)")
    wall_clock_s: float | None = Field(default=None, gt=0, le=90 * 86400, description="seconds (at most 90 days)")


class PruningSpec(_Strict):
    """Equal-compute early stopping within each batch size (rungs in FLOPs)."""

    enabled: bool = False
    grace_fraction: float = Field(default=0.25, gt=0, lt=1, description="first rung, as a fraction of the trial budget")
    reduction_factor: float = Field(default=2.0, gt=1, le=100)
    min_trials_per_rung: PositiveInt = Field(default=2, le=1000)
    rule: Literal["loss_at_rung", "predicted_final"] = Field(
        default="predicted_final",
        description="what a trial is judged on at a rung: its validation loss there, or its loss at the budget "
                    "predicted from the rung's fit points (sweeps.scheduler, docs/search_efficiency.md)")
    fit_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [0.5, 0.75, 1.0],
        description="predicted_final: where the loss is read for the fit, as fractions of the rung's FLOPs")

    mode: Literal["stop", "pause"] = Field(
        default="pause",
        description="stop: a trial is judged when it reaches a rung, against the values recorded there so far "
                    "(asynchronous successive halving); pause: it waits paused at the rung until every trial of "
                    "its batch size has reached it, then the best resume from their checkpoints (successive "
                    "halving; fewer FLOPs, one restart per promoted trial)")
    margin: float | None = Field(
        default=None, ge=0,
        description="if set: at a rung, the trials whose value is within this many nats of the best recorded "
                    "there (same batch size) continue, instead of the top 1/reduction_factor")

    @field_validator("fit_fractions")
    @classmethod
    def _fit_fractions(cls, v: list[float]) -> list[float]:
        if len(set(v)) < 2 or len(set(v)) != len(v):
            raise ValueError("give at least 2 distinct fractions")
        return sorted(v)


class SweepSpec(_Strict):
    """A whole critical-batch-size sweep."""

    name: str = Field(description="sweep name: letters, digits, '-', '_' and '.'; names the MLflow experiment")
    workload: Literal["pretrain", "finetune"] = "pretrain"
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec
    finetune: FinetuneSpec | None = None
    budget_tokens: PositiveInt = Field(le=MAX_TOKENS, description="training tokens per trial (equal for every batch size; at most 1e13)")
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    search: SearchSpec
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    noise_scale: NoiseScaleSpec = Field(default_factory=NoiseScaleSpec)
    batch_warmup: BatchWarmupSpec | None = None
    branch: BranchSpec | None = None
    pruning: PruningSpec = Field(default_factory=PruningSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]] = Field(
        default_factory=lambda: [0], min_length=1, max_length=100, description="training seeds (1-100 of them)")
    targets: list[Annotated[float, Field(gt=0, le=1000)]] | None = Field(max_length=20,
        default=None, description="target validation losses; default: chosen from the curves (3-5 reached by the small batches)"
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", v):
            raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be unique")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "SweepSpec":
        errs: list[str] = []
        w = self.resources.workers_per_trial
        bad = [b for b in self.search.batch_sizes_sequences if b % w]
        if bad:
            errs.append(f"search.batch_sizes_sequences: {bad} not divisible by resources.workers_per_trial={w}")
        T = self.model.context_length_tokens
        largest = max(self.search.batch_sizes_sequences) * T
        if self.budget_tokens < 2 * largest:
            errs.append(
                f"budget_tokens ({self.budget_tokens}) gives the largest batch ({largest} tokens/step) fewer than 2 steps"
            )
        if self.schedule.warmup_tokens >= self.budget_tokens:
            errs.append("schedule.warmup_tokens must be smaller than budget_tokens")
        if self.workload == "finetune" and self.finetune is None:
            errs.append("finetune: required when workload is 'finetune'")
        if self.workload == "pretrain" and self.finetune is not None:
            errs.append("finetune: only allowed when workload is 'finetune'")
        if errs:
            raise ValueError("; ".join(errs))
        return self

    # ---- derived values -------------------------------------------------------------------------

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name

    @property
    def n_trials(self) -> int:
        """Planned Tune trials: batch sizes x trials per batch size x seeds."""
        return len(self.search.batch_sizes_sequences) * self.search.trials_per_batch_size * len(self.seeds)

    def milestones_tokens(self) -> list[int]:
        """Token counts at which every trial evaluates, evenly spaced, the last one the budget."""
        n = self.eval.milestones
        return [int(round(self.budget_tokens * (i + 1) / n)) for i in range(n)]

    def fingerprint(self) -> str:
        """A short hash of the spec's content (used as part of the sweep id)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts = []
    for p in loc:
        if isinstance(p, str) and p.startswith("function-"):
            continue
        text = str(p)
        # keys that would make the dotted path ambiguous are quoted
        parts.append(text if text and "." not in text and not text.isspace() else repr(text))
    return ".".join(parts) if parts else "<root>"


def spec_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Turn a pydantic ``ValidationError`` into ``(dotted path, message)`` pairs."""
    out = []
    for e in exc.errors():
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        out.append((_format_loc(tuple(e["loc"])), msg))
    return out


def parse_spec(data: Any) -> SweepSpec:
    """Validate a parsed spec (a mapping).

    Raises:
        SpecError: with every invalid field's path.
    """
    if not isinstance(data, dict):
        raise SpecError([("<root>", f"a sweep spec must be a mapping, got {type(data).__name__}")])
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(spec_errors(exc)) from None


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml_with_base(p: Path, seen: tuple[Path, ...] = ()) -> Any:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([("<root>", f"spec file not found: {p}")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("<root>", f"cannot read spec file {p}: {exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("<root>", f"not valid YAML: {exc}")]) from None
    if isinstance(data, dict) and "base" in data:
        ref = data.pop("base")
        if not isinstance(ref, str):
            raise SpecError([("base", "must be the path of another spec file")])
        bp = (p.parent / ref).resolve()
        if bp in seen:
            raise SpecError([("base", f"circular base: {bp}")])
        base = _read_yaml_with_base(bp, seen + (p.resolve(),))
        if not isinstance(base, dict):
            raise SpecError([("base", f"{ref} is not a mapping")])
        data = _deep_merge(base, data)
    return data


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML (or JSON) sweep spec file.

    A spec may derive from another: ``base: other.yaml`` (relative to the spec's folder) loads that
    spec first and deep-merges this file's fields over it, so variants do not copy and drift.

    Raises:
        SpecError: the file (or its base) is missing, is not YAML, or has invalid fields (each
            named by path).
    """
    return parse_spec(_read_yaml_with_base(Path(path)))


def resolved_spec_dict(path: str | Path) -> dict:
    """The spec file's content with its ``base`` chain merged (what :func:`load_spec` validates)."""
    data = _read_yaml_with_base(Path(path))
    if not isinstance(data, dict):
        raise SpecError([("<root>", f"a sweep spec must be a mapping, got {type(data).__name__}")])
    return data


def parse_spec_text(text: str) -> SweepSpec:
    """Validate a spec given as YAML or JSON text.

    Raises:
        SpecError: not YAML, or invalid fields.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("<root>", f"not valid YAML: {exc}")]) from None
    return parse_spec(data)
