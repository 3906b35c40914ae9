"""The trial's schedule as pure functions of tokens seen: batch phases, LR, beta2, WSD branches.

Methodology section 11.2: linear warmup in tokens, then a constant LR. The warmup is
``warmup_tokens`` (the same for every batch size) but at least ``warmup_min_steps`` optimizer steps
of the first batch (Goyal et al. 2017, gradual warmup); each step's factor is taken from the tokens
seen after it (:func:`workloads.train.scaling.warmup_factor`). With batch-size warmup the LR follows the
batch in force by the trial's scaling rule (:func:`workloads.train.scaling.scaled_lr`) and beta2 by the
token half-life (:func:`workloads.train.scaling.beta2_from_half_life`). ``wsd`` evaluates each milestone
after a short linear-decay branch (:func:`wsd_branch_steps`, :func:`wsd_lr_scale`).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.config import TrialConfig
from workloads.train.batching import BatchPlan, plan_batch
from workloads.train.scaling import beta2_from_half_life, scaled_lr, warmup_factor, warmup_length_tokens

__all__ = ["BatchPhase", "Schedule", "batch_phases", "wsd_branch_steps", "wsd_lr_scale"]


@dataclass(frozen=True)
class BatchPhase:
    """The batch in force from ``first_tokens_seen`` on, and how a step of it is computed."""

    first_tokens_seen: int
    batch_size_sequences: int
    plan: BatchPlan


def batch_phases(cfg: TrialConfig, workers: int, min_micro_batches_total: int) -> list[BatchPhase]:
    """The batch phases of a trial: one without batch-size warmup; else one per warmup threshold,
    with batch ``B * multiplier // last multiplier``.

    Raises:
        ValueError: a phase's batch not divisible by ``workers`` (``workloads.train.batching.plan_batch``).
    """
    b_final, mx = cfg.batch.batch_size_sequences, cfg.batch.micro_batch_size_sequences_max
    if not cfg.batch.warmup:
        return [BatchPhase(0, b_final, plan_batch(b_final, workers, mx, min_micro_batches_total))]
    last = cfg.batch.warmup[-1][1]
    out = []
    for thr, mult in cfg.batch.warmup:
        b = b_final * mult // last
        out.append(BatchPhase(thr, b, plan_batch(b, workers, mx, min_micro_batches_total)))
    return out


class Schedule:
    """The batch, LR and beta2 of each optimizer step of one trial (pure: no state but the config).

    Args:
        cfg: the trial.
        phases: :func:`batch_phases` of the trial.
    """

    def __init__(self, cfg: TrialConfig, phases: list[BatchPhase]):
        self.cfg = cfg
        self.phases = phases
        T = cfg.context_length_tokens
        # the warmup is at least warmup_min_steps steps of the batch the run starts with (the one in
        # force during the ramp; with batch-size warmup the ramp does not restart when the batch grows)
        self.warmup_len_tokens = warmup_length_tokens(
            cfg.schedule.warmup_tokens, cfg.schedule.warmup_min_steps, phases[0].batch_size_sequences * T
        )

    def phase_at(self, tokens_seen: int) -> BatchPhase:
        """The phase in force at ``tokens_seen``: the last whose threshold it has reached."""
        phase = self.phases[0]
        for p in self.phases:
            if tokens_seen >= p.first_tokens_seen:
                phase = p
        return phase

    def hparams(self, batch_size_sequences: int, tokens_after_step: int, lr_scale: float = 1.0) -> tuple[float, float]:
        """``(lr, beta2)`` of a step of ``batch_size_sequences`` after which ``tokens_after_step`` were seen.

        ``lr = scaled_lr(lr, B, b, lr_rule) * warmup_factor(tokens_after_step, warmup) * lr_scale``
        (``lr`` is the peak at the trial's batch ``B``; ``lr_scale`` is a WSD branch's decay) and
        ``beta2 = 0.5 ** (b * T / beta2_half_life_tokens)`` (Marek et al. 2025).
        """
        opt = self.cfg.optimizer
        lr = (
            scaled_lr(opt.lr, self.cfg.batch.batch_size_sequences, batch_size_sequences, opt.lr_rule)
            * warmup_factor(tokens_after_step, self.warmup_len_tokens)
            * lr_scale
        )
        beta2 = beta2_from_half_life(opt.beta2_half_life_tokens, batch_size_sequences, self.cfg.context_length_tokens)
        return lr, beta2


def wsd_branch_steps(
    decay_fraction: float, tokens_seen: int, batch_size_sequences: int, context_length_tokens: int
) -> int:
    """Optimizer steps of a WSD decay branch: ``max(1, round(decay_fraction * tokens_seen / (b * T)))``."""
    return max(1, round(decay_fraction * tokens_seen / (batch_size_sequences * context_length_tokens)))


def wsd_lr_scale(i: int, n_steps: int) -> float:
    """LR factor of step ``i`` (0-based) of an ``n_steps`` decay branch: ``1 - (i + 1) / (n_steps + 1)``
    (linear towards 0, never reaching it)."""
    return 1.0 - (i + 1) / (n_steps + 1)
