"""The sweep spec's sections: pydantic models for the model, data, evaluation, schedule,
optimizer, noise scale, batch warmup and resources parts of a spec (search: :mod:`sweeps.spec.search`;
tracking: :mod:`sweeps.spec.tracking`; fine-tuning: :mod:`sweeps.spec.finetune`).

Every size names its unit: ``_tokens``, ``_sequences``, ``_steps``, ``_flops``, ``_s``. Every model is
strict (unknown fields refused, integers refuse booleans, booleans refuse ``"yes"`` and ``1``) and frozen. The
whole spec is :class:`sweeps.spec.sweep.SweepSpec`; load it with :func:`sweeps.spec.load_spec`.

The sections a trial's config shares are defined once, in ``workloads.sections`` (through
:mod:`workloads.api`): :class:`ModelSpec`, :class:`DataSpec`, :class:`ScheduleSpec`, :class:`OptimizerSpec`,
:class:`NoiseScaleSpec` and :class:`SyncSpec` subclass them and add only their docstring and what the spec
alone checks or drops from its dump; :class:`ResourcesSpec` declares its training flags with the trial's
``TrainingConfig`` fields (``tests/test_section_parity.py``).

Plain data: imports neither torch nor Ray (``workloads.api`` is torch-free), so the REST service can use it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, field_validator, model_serializer, model_validator

from sweeps.spec.registry import LAUNCHER_REGISTRY, OneOf
from workloads.api import (
    MAX_BATCH_SEQUENCES,
    MAX_TOKENS,
    MAX_WIDTH,
    MODEL_SHORTHAND_FIELDS,
    OPTIMIZER_NAMES,
    TRAINING_FIELDS,
    ConfigSection,
    DataConfig,
    LrRule,
    MixedPrecision,
    ModelConfig,
    NoiseScaleConfig,
    OptimizerName,
    OptimizerSettings,
    Parallelism,
    PositiveInt,
    ScheduleConfig,
    SyncConfig,
)

__all__ = [
    "MAX_BATCH_SEQUENCES",
    "MAX_TOKENS",
    "MAX_WIDTH",
    "MODEL_SHORTHAND_FIELDS",
    "OPTIMIZER_NAMES",
    "BatchWarmupSpec",
    "DataSpec",
    "EvalSpec",
    "LrRule",
    "ModelSpec",
    "NoiseScaleSpec",
    "OptimizerName",
    "OptimizerSpec",
    "PositiveInt",
    "ResourcesSpec",
    "ScheduleSpec",
    "SyncSpec",
]


#: every spec section is as strict as the trial config's (unknown fields refused, frozen, defaults validated);
#: the optimizer names, ``PositiveInt`` and the ``MAX_`` bounds are ``workloads.sections``', re-exported here
_Strict = ConfigSection


class ModelSpec(ModelConfig):
    """A Hugging Face causal LM built from a config (pretraining).

    Either the shorthand (``family`` ``llama`` or ``gpt2`` with ``d_model``, ``n_layers``,
    ``n_heads``, ``d_ff``, ``tie_word_embeddings``) or ``hf_config``: a whole ``transformers``
    config, inline (a mapping with ``model_type``, the arguments of ``AutoConfig.for_model``) or
    the path of a ``config.json``. Never both: a spec that sets a shorthand field beside
    ``hf_config`` is refused (a derived spec clears its base's with ``null``). The vocabulary comes
    from the tokenizer (a config's ``vocab_size`` may only be larger), the sequence length from
    ``context_length_tokens``. What needs ``transformers`` (a known ``model_type``, a
    ``config.json`` that reads, an architecture the FLOPs formula knows unless ``flops_per_token``
    is given) is checked before launch (``sweeps.launch.workload.check_model``).
    """

    @model_validator(mode="before")
    @classmethod
    def _one_form(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in MODEL_SHORTHAND_FIELDS and v is None)}  # null: not given
        if data.get("hf_config") is not None:
            mixed = [k for k in MODEL_SHORTHAND_FIELDS if k in data]
            if mixed:
                raise ValueError(
                    f"hf_config defines the architecture: remove the shorthand field(s) {', '.join(mixed)} "
                    "(in a spec derived with base:, set them to null)"
                )
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # one form in a dump (spec.yaml, the fingerprint); a shorthand spec dumps as it did before hf_config
        out = handler(self)
        drop = MODEL_SHORTHAND_FIELDS if self.hf_config is not None else ("hf_config",)
        drop += ("flops_per_token",) if self.flops_per_token is None else ()
        return {k: v for k, v in out.items() if k not in drop}


class DataSpec(DataConfig):
    """Training text and its tokenizer: a raw file (``path``) or prepared token shards (``shards``).

    Exactly one of the two. A raw text file is prepared into shards once per sweep by the driver
    (``OUT/data``); ``shards`` is what ``critbatch prepare-data`` wrote, a folder every node can
    read or an fsspec URI (copied once per node into a local cache). A spec without ``shards``
    dumps without it, so its fingerprint is what it was before the field existed.
    """

    @field_validator("path")
    @classmethod
    def _non_empty(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip():
            raise ValueError("must not be empty")
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", v):
            # every worker opens data.path as a local file: a URI validated, then failed every trial
            raise ValueError(
                f"{v!r} is a URI; the workers read local files only: give a path every node can read, "
                "or prepare it with `critbatch prepare-data` and give data.shards"
            )
        return v

    @field_validator("shards")
    @classmethod
    def _shards_non_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if (self.path is None) == (self.shards is None):
            raise ValueError(
                "give exactly one of 'path' (a raw text or JSON Lines file) and 'shards' (prepared token shards)"
            )
        return self

    @model_serializer(mode="wrap")
    def _drop_unset_source(self, handler) -> dict[str, Any]:
        out = handler(self)
        for key in ("path", "shards"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


class EvalSpec(_Strict):
    """Evaluation on the held-out split at token milestones shared by every batch size (docs/design.md,
    "Milestones": a report is at the tokens seen after the step that reaches its milestone)."""

    milestones: int = Field(
        default=16, ge=2, le=200, strict=True, description="evaluations per trial, evenly spaced in tokens"
    )
    eval_tokens: PositiveInt = Field(
        default=16384, le=10**9, description="held-out tokens per evaluation (a fixed set; at most 1e9)"
    )
    allow_folded_milestones: bool = Field(
        default=False,
        strict=True,
        description=(
            "accept a batch size whose step (B x context_length_tokens) is longer than the milestone spacing: it reports "
            "once for the milestones one step passes, so fewer points; false: validate and run refuse the spec"
        ),
    )

    @model_serializer(mode="wrap")
    def _drop_default_fold(self, handler) -> dict[str, Any]:
        out = handler(self)  # unset: the dump (and fingerprint) of a spec from before the field existed
        if not out.pop("allow_folded_milestones", False):
            return out
        return {**out, "allow_folded_milestones": True}


class ScheduleSpec(ScheduleConfig):
    """Horizon-free learning-rate schedule (methodology section 11.2).

    ``constant_ema``: linear warmup over ``max(warmup_tokens, warmup_min_steps * B * T)`` tokens
    (the same tokens for every batch size, yet a ramp of at least ``warmup_min_steps`` optimizer
    steps at large batches: Goyal et al. 2017, gradual warmup), then a constant LR; an exponential
    moving average of the weights (half-life in tokens, so equal for every batch size) is what is
    evaluated (Zhang et al. 2024). ``wsd``: warmup-stable-decay, where each milestone's evaluation
    is taken after a short linear decay branch of ``decay_fraction`` of the tokens seen, and
    training continues from the stable branch.
    """


class OptimizerSpec(OptimizerSettings):
    """The optimizer and its settings that are not searched (docs/design.md, "Optimizers").

    ``name``: ``adamw`` (``torch.optim.AdamW``, the default), ``adafactor`` (``torch.optim.Adafactor``:
    no beta1, no constant beta2, eps not read), ``sgd_momentum`` (``torch.optim.SGD`` with momentum
    ``beta1``: no beta2, eps not read) or ``adamw_8bit`` (``bitsandbytes`` AdamW8bit, block-wise 8-bit
    moments; on CUDA, and on CPU from bitsandbytes 0.50). A spec at the default ``adamw`` dumps (and fingerprints) without ``name``.
    """

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # a spec at the default optimizer dumps (and fingerprints) as before optimizer.name existed
        out = handler(self)
        if out.get("name") == "adamw":
            out.pop("name")
        return out


class NoiseScaleSpec(NoiseScaleConfig):
    """Online gradient-noise-scale estimate (McCandlish et al. 2018, Appendix A.1)."""


class BatchWarmupSpec(_Strict):
    """Batch-size warmup: global batch sizes by tokens seen (Merrill et al. 2025).

    ``schedule`` is a list of ``[tokens_seen, multiplier]``: from that many tokens on, the global batch
    is the trial's batch times ``multiplier`` divided by the last multiplier (so the run ends at
    the trial's batch size). Multipliers are integers, increasing, each a factor of the next.
    """

    schedule: list[
        tuple[
            Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)],
            Annotated[int, Field(gt=0, le=MAX_BATCH_SEQUENCES, strict=True)],
        ]
    ] = Field(min_length=1, max_length=64, description="[tokens seen, multiplier] pairs (at most 64)")

    @model_validator(mode="after")
    def _monotone(self) -> BatchWarmupSpec:
        if self.schedule[0][0] != 0:
            raise ValueError("schedule must start at 0 tokens")
        for (t0, m0), (t1, m1) in zip(self.schedule, self.schedule[1:]):
            if t1 <= t0:
                raise ValueError("token thresholds must increase")
            if m1 <= m0 or m1 % m0:
                raise ValueError("multipliers must increase by integer factors")
        return self


#: ``resources`` fields dropped from a dump at these values (``ResourcesSpec._dump``): the training flags' defaults
_TRAINING_DEFAULTS = {name: field.default for name, field in TRAINING_FIELDS.items()}


class SyncSpec(SyncConfig):
    """How a trial's workers synchronise (``resources.sync``; ``workloads.sync``).

    ``ddp``: the step's gradient is all-reduced every optimizer step. ``local_sgd`` and ``diloco``:
    each of the ``resources.workers_per_trial`` workers is a replica that trains on its slice of the
    global batch (global batch = replicas x local batch) with its own optimizer, and the replicas
    synchronise every ``every_steps`` optimizer steps: local SGD averages their parameters (Stich
    2019, arXiv:1805.09767); DiLoCo takes an outer SGD step with Nesterov momentum on the anchor
    weights, the outer gradient being the anchor minus the replicas' mean (Douillard et al. 2023,
    arXiv:2311.08105, Algorithm 1; ``outer_lr`` 0.7 and ``outer_momentum`` 0.9 are their section 3
    values). The noise-scale estimator is off under local_sgd and diloco (no global gradient per
    step: no ``b_simple``). With ``mode: ddp`` the section is left out of the dump (and fingerprint).
    """


class ResourcesSpec(_Strict):
    """Where trials run. Global batch = micro-batch x accumulation steps x workers."""

    workers_per_trial: PositiveInt = Field(default=1, le=4096, description="Ray Train workers per trial (at most 4096)")
    cpus_per_worker: float = Field(default=1.0, gt=0, le=512, description="CPUs per worker (at most 512)")
    gpus_per_worker: float = Field(default=0.0, ge=0, le=16, description="GPUs per worker (at most 16)")
    max_concurrent_trials: PositiveInt = Field(default=2, le=1024, description="trials running at once (at most 1024)")
    micro_batch_size_sequences_max: PositiveInt = Field(
        default=64, le=MAX_BATCH_SEQUENCES, description="largest micro-batch one worker runs at once"
    )
    trial_driver_cpus: float = Field(default=0.01, gt=0, le=1, description="CPU reserved for each trial's Tune driver")
    max_failures: int = Field(
        default=2,
        ge=0,
        le=100,
        strict=True,
        description="worker-failure retries per trial (Ray Train FailureConfig; at most 100)",
    )
    storage_path: str | None = Field(
        default=None,
        description="Tune/Train state shared by every node (a folder or s3:// URI); default: env CRITBATCH_STORAGE_PATH, else the output folder",
    )
    parallelism: Parallelism = TRAINING_FIELDS["parallelism"]  # defined once, with the trial's TrainingConfig
    compile: bool = TRAINING_FIELDS["compile"]
    activation_checkpointing: bool = TRAINING_FIELDS["activation_checkpointing"]
    mixed_precision: MixedPrecision = TRAINING_FIELDS["mixed_precision"]
    sync: SyncSpec = Field(
        default_factory=SyncSpec, description="ddp, local_sgd or diloco: how the workers synchronise (SyncSpec)"
    )
    launcher: Annotated[str, OneOf(LAUNCHER_REGISTRY)] | None = Field(
        default=None,
        description=(
            "how trials are launched: trial_runners (long-lived worker groups that take one trial after another) or "
            "train_run_per_trial (a Ray Train run per trial); unset: trial_runners, or train_run_per_trial where the "
            "driver's environment sets CRITBATCH_TRIAL_RUNNERS=0. The trials' results are the same either way"
        ),
    )

    def __setstate__(self, state: dict[Any, Any]) -> None:
        # a section pickled before ``launcher`` existed (Tune's state of an older sweep) loads with it unset
        state.get("__dict__", {}).setdefault("launcher", None)
        super().__setstate__(state)

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # a spec that leaves the training options at their defaults dumps (and fingerprints) as before they existed
        out = handler(self)
        if self.launcher is None:
            out.pop("launcher", None)
        if self.sync.mode == "ddp":  # its other fields are not read under ddp: the section as before it existed
            out.pop("sync", None)
        return {k: v for k, v in out.items() if k not in _TRAINING_DEFAULTS or v != _TRAINING_DEFAULTS[k]}
