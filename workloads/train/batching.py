"""Splitting a global batch into workers, gradient accumulation steps and micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchPlan", "batch_schedule_steps", "min_micro_batches_total", "plan_batch"]


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """How one optimizer step's global batch is computed.

    ``global_batch_size_sequences = micro_batch_size_sequences * grad_accum_steps * workers``.
    """

    global_batch_size_sequences: int
    micro_batch_size_sequences: int
    grad_accum_steps: int
    workers: int

    @property
    def micro_batches_total(self) -> int:
        """Micro-batches per step over all workers (``K`` in the noise-scale estimator)."""
        return self.grad_accum_steps * self.workers


def min_micro_batches_total(noise_scale: bool, parallelism: str, workers: int) -> int:
    """The ``min_micro_batches_total`` of :func:`plan_batch` for a trial.

    The noise-scale estimator needs two batch sizes in each step. Under ``ddp`` its small batch is
    one micro-batch of one worker, so two micro-batches in all suffice. Under ``fsdp`` each
    micro-batch's gradient is reduce-scattered over the workers at once, so its small batch is one
    micro-batch of every worker (``micro x workers``): each worker needs two micro-batches, i.e.
    ``2 x workers`` in all. 1 without the estimator.
    """
    if not noise_scale:
        return 1
    return 2 * workers if parallelism == "fsdp" else 2


def plan_batch(
    global_batch_size_sequences: int,
    workers: int,
    micro_batch_size_sequences_max: int,
    min_micro_batches_total: int = 1,
) -> BatchPlan:
    """Choose micro-batch size and accumulation steps for a global batch.

    Picks the fewest accumulation steps ``k`` such that the per-worker batch ``B/W`` splits into
    ``k`` equal micro-batches of at most ``micro_batch_size_sequences_max`` sequences, and
    ``k * W >= min_micro_batches_total`` when the batch allows it (the gradient-noise-scale
    estimator needs at least two micro-batches per step).

    Raises:
        ValueError: ``B`` not divisible by ``W``, or non-positive sizes.
    """
    B, W = global_batch_size_sequences, workers
    if B <= 0 or W <= 0 or micro_batch_size_sequences_max <= 0:
        raise ValueError("batch size, workers and micro-batch size must be positive")
    if B % W:
        raise ValueError(f"global batch {B} is not divisible by {W} workers")
    per_worker = B // W
    k_min = max(1, -(-min_micro_batches_total // W))
    k_min = min(k_min, per_worker)
    for k in range(k_min, per_worker + 1):
        if per_worker % k == 0 and per_worker // k <= micro_batch_size_sequences_max:
            return BatchPlan(
                global_batch_size_sequences=B, micro_batch_size_sequences=per_worker // k, grad_accum_steps=k, workers=W
            )
    raise AssertionError("unreachable: k = per_worker always fits")  # pragma: no cover


def batch_schedule_steps(
    budget_tokens: int,
    context_length_tokens: int,
    final_batch_size_sequences: int,
    schedule: list[tuple[int, int]] | None,
) -> list[tuple[int, int]]:
    """Optimizer steps of a run with batch-size warmup, phase by phase.

    Args:
        budget_tokens: tokens to train.
        context_length_tokens: T.
        final_batch_size_sequences: the batch after the last increase.
        schedule: ``[(tokens_seen_threshold, multiplier), ...]`` starting at 0 with integer-factor
            increases; the batch is ``final * multiplier / last_multiplier``. None: constant batch.

    Returns:
        ``[(batch_size_sequences, steps), ...]`` in order; a phase's steps run until tokens seen
        reach the next threshold (or the budget), so the last step of a phase may cross it.

    Raises:
        ValueError: the final batch is not divisible by the warmup factor.
    """
    sched = schedule or [(0, 1)]
    last_mult = sched[-1][1]
    out: list[tuple[int, int]] = []
    tokens = 0
    for i, (_, mult) in enumerate(sched):
        if (final_batch_size_sequences * mult) % last_mult:
            raise ValueError(
                f"batch {final_batch_size_sequences} is not divisible by warmup factor {last_mult // mult}"
            )
        b = final_batch_size_sequences * mult // last_mult
        end = sched[i + 1][0] if i + 1 < len(sched) else budget_tokens
        end = min(end, budget_tokens)
        steps = 0
        while tokens < end:
            tokens += b * context_length_tokens
            steps += 1
        if steps:
            out.append((b, steps))
    return out
