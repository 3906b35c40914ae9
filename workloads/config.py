"""The per-trial configuration a worker receives: plain, frozen, keyword-only data.

Built by the sweep from the spec plus the sampled hyperparameters, and sent to Ray Train workers
as a dict (:meth:`TrialConfig.to_dict` / :meth:`TrialConfig.from_dict`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrialConfig"]


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """Everything one trial's training loop needs. Sizes carry their unit in the name."""

    trial_id: str
    workload: str = "pretrain"
    # model (pretraining); fine-tuning reads its architecture from the checkpoint
    family: str = "llama"
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 176
    context_length_tokens: int = 64
    tie_word_embeddings: bool = False
    # data
    data_path: str
    tokenizer: str = "byte"
    validation_fraction: float = 0.1
    # budget and evaluation
    budget_tokens: int
    milestones_tokens: tuple[int, ...]
    eval_tokens: int = 16384
    eval_raw_every_milestone: bool = False
    # schedule
    schedule_kind: str = "constant_ema"
    warmup_tokens: int = 0
    # the LR ramps over max(warmup_tokens, warmup_min_steps * B * T) tokens (workloads.scaling.warmup_length_tokens)
    warmup_min_steps: int = 4
    ema_half_life_tokens: float = 32768.0
    decay_fraction: float = 0.1
    # batch
    batch_size_sequences: int
    micro_batch_size_sequences_max: int = 64
    batch_warmup: tuple[tuple[int, int], ...] | None = None
    # optimizer (lr and beta2 already scaled for batch_size_sequences)
    lr: float
    lr_rule: str = "sqrt"
    beta1: float = 0.9
    beta2: float = 0.99
    beta2_half_life_tokens: float
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = 1.0
    divergence_loss_factor: float = 1.5
    # measurement
    noise_scale_enabled: bool = True
    noise_scale_ema_decay: float = 0.95
    seed: int = 0
    checkpoint_every_milestones: int = 1
    save_hf_checkpoint: bool = False
    # fault injection for tests: raise at this milestone index on the first attempt only
    fail_at_milestone: int | None = None
    # fault injection for tests: after reporting this milestone index on the first attempt, wait
    # while the file ``hold_file`` exists (a test kills the worker in that window, then deletes it)
    hold_at_milestone: int | None = None
    hold_file: str | None = None
    finetune: dict[str, Any] | None = field(default=None)
    # pruning mode "pause" (sweeps/pruning/scheduler.py): after the report that reaches one of these token
    # positions (the rungs), wait until the sweep's scheduler has decided to let the trial go on: the
    # value under the Ray KV key ``rung_gate_key`` reaches the reported tokens (a paused or pruned
    # trial is stopped while it waits, so it never trains past its rung)
    rung_barrier_tokens: tuple[float, ...] | None = None
    rung_gate_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown trial config keys: {sorted(unknown)}")
        d = dict(d)
        d["milestones_tokens"] = tuple(d["milestones_tokens"])
        if d.get("batch_warmup") is not None:
            d["batch_warmup"] = tuple(tuple(x) for x in d["batch_warmup"])
        if d.get("rung_barrier_tokens") is not None:
            d["rung_barrier_tokens"] = tuple(d["rung_barrier_tokens"])
        return cls(**d)
