"""A batch-size ramp that stays under the critical batch size as training proceeds, from a study's law, in the
formats trainers read.

The critical batch size grows with the tokens a run has seen (Merrill et al. 2025, "Critical batch size revisited",
arXiv 2505.23971: the local CBS grows early in training and then levels off; Zhang et al. 2024 and Bergsma et al.
2025 in the budget). The ramp reads the study's law ``b_crit(D)`` (:mod:`sweeps.scaling.law`) at ``D`` = the tokens
seen so far, which is an approximation: the law was measured across runs of budget D, not along one run. Each
stage doubles the global batch and starts once the *lower* end of the law's prediction interval at the tokens
seen reaches the new batch size, so the ramp stays under the critical batch size with the interval's confidence,
not only under its point estimate. Doubling keeps every stage an integer multiple of the one before (OLMo-core's
scheduler requires it).

Steps are counted as tokens / (batch size x tokens per sequence) per stage. The fixed batch it is compared with is
the largest that stays under the critical batch size from the start (the ramp's first stage): the ramp trains the
same tokens in fewer steps. A fixed batch at the ramp's last stage would take fewer steps still, but spends its
early steps above the critical batch size, where a step buys less progress per token (McCandlish et al. 2018,
eq. 2.11: ``E = E_min (1 + B / b_crit)``); that cost is not counted here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sweeps.errors import InvalidInput

__all__ = ["Stage", "batch_size_ramp", "ceiling_sequences", "critbatch_block", "ramp_formats"]


@dataclass(frozen=True)
class Stage:
    """One stage of the ramp: from ``start_tokens`` (tokens seen) on, a global batch of ``batch_size_sequences``;
    ``start_step`` is the optimizer step it starts at."""

    start_tokens: int
    batch_size_sequences: int
    start_step: int


def ceiling_sequences(result: dict[str, Any], tokens: float) -> float:
    """The lower end of the law's prediction interval (sequences) at ``tokens``, from ``scale.json``'s fields."""
    from sweeps.scaling.study import log_band

    mean, sd = log_band(result, tokens)
    return math.exp(float(mean) - result["quantile"] * float(sd))


def _first_tokens_at(result: dict[str, Any], batch: float, lo: float, hi: float) -> float | None:
    """The fewest tokens in ``[lo, hi]`` at which the ceiling reaches ``batch`` (bisection in log tokens on the
    first crossing of a fine grid), None when it never does."""
    n = 400
    grid = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / n) for i in range(n + 1)]
    prev = None
    for t in grid:
        if ceiling_sequences(result, t) >= batch:
            if prev is None:
                return t
            a, b = math.log(prev), math.log(t)
            for _ in range(60):
                m = (a + b) / 2
                a, b = (a, m) if ceiling_sequences(result, math.exp(m)) >= batch else (m, b)
            return math.exp(b)
        prev = t
    return None


def batch_size_ramp(
    result: dict[str, Any], total_tokens: float, tokens_per_sequence: int, max_batch_size_sequences: int | None = None
) -> dict[str, Any]:
    """The ramp for a run of ``total_tokens`` from a study's ``scale.json`` ``result``.

    The first stage is the largest power of two under the ceiling at the smallest budget the study measured (below
    it the law is not known); each next stage doubles it, up to ``max_batch_size_sequences`` (default: under the
    ceiling at ``total_tokens``).

    Returns:
        ``stages`` (:class:`Stage` as dicts), ``steps``, ``fixed_batch_size_sequences`` and ``fixed_steps`` (the
        first stage's batch for the whole run), ``steps_saved_fraction``, ``note`` (what the numbers assume) and
        ``warnings`` (a lower bound under one sequence at the smallest budget: the ramp then starts at 1).

    Raises:
        InvalidInput: a law that does not grow (``gamma <= 0``: no ramp to take home), or non-positive sizes.
    """
    if result["gamma"] <= 0:
        raise InvalidInput(
            f"the study's exponent is {result['gamma']:.3g}: b_crit does not grow with the budget, "
            "so a fixed batch is the schedule"
        )
    if not (total_tokens > 0 and tokens_per_sequence > 0):
        raise InvalidInput("--total-tokens and --tokens-per-sequence must be positive")
    smallest = min(m["tokens"] for m in result["members"])
    floor_at_start = ceiling_sequences(result, smallest)
    first = 2 ** math.floor(math.log2(floor_at_start)) if floor_at_start >= 1 else 1
    notes = (
        []
        if floor_at_start >= 1
        else [
            f"the law's lower bound at the smallest budget studied is {floor_at_start:.2g} sequences, under one: the ramp "
            "starts at 1 sequence, which the study cannot show to be under b_crit there"
        ]
    )
    top = max_batch_size_sequences or 2 ** math.floor(math.log2(max(ceiling_sequences(result, total_tokens), first)))
    stages = [(0.0, first)]
    batch = first * 2
    while batch <= top:
        t = _first_tokens_at(result, batch, max(stages[-1][0], smallest), total_tokens)
        if t is None:
            break
        stages.append((t, batch))
        batch *= 2
    out, steps, pos = [], 0, 0
    for i, (_, b) in enumerate(stages):  # each stage starts on a whole step of the one before it
        out.append(Stage(start_tokens=pos, batch_size_sequences=b, start_step=steps))
        end = stages[i + 1][0] if i + 1 < len(stages) else total_tokens
        n = math.ceil(max(end - pos, 0) / (b * tokens_per_sequence))
        steps, pos = steps + n, pos + n * b * tokens_per_sequence
    fixed_steps = math.ceil(total_tokens / (first * tokens_per_sequence))
    return {
        "stages": [s.__dict__ for s in out],
        "steps": steps,
        "total_tokens": total_tokens,
        "tokens_per_sequence": tokens_per_sequence,
        "fixed_batch_size_sequences": first,
        "fixed_steps": fixed_steps,
        "steps_saved_fraction": 1 - steps / fixed_steps,
        "note": "each stage starts where the lower end of the law's prediction interval, read at the tokens seen, "
        "reaches its batch size; the law was measured across budgets, not along one run",
        "warnings": notes,
    }


def critbatch_block(ramp: dict[str, Any]) -> dict[str, Any]:
    """The ramp as critbatch's own spec block: ``batch_warmup`` (:class:`sweeps.spec.sections.BatchWarmupSpec`).

    ``schedule`` is ``[[start_tokens, batch / first batch], ...]``: the loop trains ``B * multiplier / last
    multiplier`` sequences from each threshold on, so a spec with this block trains the ramp when its trial batch
    (``search.batch_sizes_sequences``) is the last stage's, ``final_batch_size_sequences``. A stage of no steps
    (the stage after it starts on the same token) is left out: thresholds must increase.

    Returns:
        ``{"batch_warmup": {"schedule": [[tokens, multiplier], ...]}, "final_batch_size_sequences": int}``.
    """
    stages = ramp["stages"]
    kept = [s for s, nxt in zip(stages, stages[1:]) if nxt["start_tokens"] > s["start_tokens"]] + [stages[-1]]
    first = kept[0]["batch_size_sequences"]
    return {
        "batch_warmup": {"schedule": [[int(s["start_tokens"]), s["batch_size_sequences"] // first] for s in kept]},
        "final_batch_size_sequences": kept[-1]["batch_size_sequences"],
    }


def ramp_formats(ramp: dict[str, Any]) -> dict[str, Any]:
    """The ramp as Megatron-LM's ``--step-batch-size-schedule`` (token thresholds : global batch in samples), an
    OLMo-core ``BatchSizeSchedulerCallback`` config (global batch sizes in tokens, ``Duration`` in tokens), a
    Levanter ``train_batch_size`` schedule (``ScheduleStep`` start steps and batch sizes), critbatch's own
    ``batch_warmup`` block (:func:`critbatch_block`) and plain JSON."""
    t = ramp["tokens_per_sequence"]
    stages = ramp["stages"]
    return {
        "critbatch": critbatch_block(ramp),
        "megatron": " ".join(f"{s['start_tokens']}:{s['batch_size_sequences']}" for s in stages),
        "olmo_core": {
            "batch_sizes": [s["batch_size_sequences"] * t for s in stages],
            "schedule": [{"value": s["start_tokens"], "unit": "tokens"} for s in stages],
        },
        "levanter": {
            "train_batch_size": [{"start": s["start_step"], "value": s["batch_size_sequences"]} for s in stages]
        },
        "json": ramp,
    }
