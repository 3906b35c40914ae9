"""Learning-rate scaling rules and Adam beta2 by token half-life: pure functions.

Sources: methodology note ``cbs-methodology.md`` sections 6.1, 7 and 11.2 (Goyal et al. 2017 linear
rule and gradual warmup; Malladi et al. 2022 square-root rule for Adam; Marek et al. 2025 token
half-life for beta2).
"""

from __future__ import annotations

import math

__all__ = [
    "LR_RULE_EXPONENTS",
    "beta2_from_half_life",
    "half_life_from_beta2",
    "scaled_lr",
    "warmup_factor",
    "warmup_length_tokens",
]

#: exponent alpha of ``lr(B) = lr0 * (B / B0) ** alpha`` for each named rule.
LR_RULE_EXPONENTS: dict[str, float] = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}


def scaled_lr(
    base_lr: float,
    base_batch_size_sequences: float,
    batch_size_sequences: float,
    rule: str,
    multiplier: float = 1.0,
) -> float:
    """Peak learning rate for a batch size under a scaling rule.

    ``lr = base_lr * (B / B0) ** alpha * multiplier`` with alpha = 1 (``linear``, Goyal et al.
    2017, section 2.1), 1/2 (``sqrt``, Malladi et al. 2022 SDE rule for Adam) or 0 (``none``).

    Args:
        base_lr: learning rate at the reference batch ``B0``.
        base_batch_size_sequences: ``B0`` in sequences (> 0).
        batch_size_sequences: ``B`` in sequences (> 0).
        rule: ``"linear"``, ``"sqrt"`` or ``"none"``.
        multiplier: local correction ``m`` (> 0) searched around the rule.

    Raises:
        ValueError: unknown rule or non-positive sizes.
    """
    if rule not in LR_RULE_EXPONENTS:
        raise ValueError(f"unknown LR scaling rule {rule!r}; expected one of {sorted(LR_RULE_EXPONENTS)}")
    if base_batch_size_sequences <= 0 or batch_size_sequences <= 0 or base_lr <= 0 or multiplier <= 0:
        raise ValueError("base_lr, batch sizes and multiplier must be positive")
    return base_lr * (batch_size_sequences / base_batch_size_sequences) ** LR_RULE_EXPONENTS[rule] * multiplier


def beta2_from_half_life(half_life_tokens: float, batch_size_sequences: float, context_length_tokens: int) -> float:
    """Adam beta2 that keeps the second-moment EMA's half-life fixed in tokens.

    ``beta2 = 0.5 ** (B * T / t_half)`` (Marek et al. 2025, section 6.1 of the methodology note),
    where ``B * T`` is tokens per optimizer step.

    Raises:
        ValueError: non-positive inputs.
    """
    if half_life_tokens <= 0 or batch_size_sequences <= 0 or context_length_tokens <= 0:
        raise ValueError("half-life, batch size and context length must be positive")
    return 0.5 ** (batch_size_sequences * context_length_tokens / half_life_tokens)


def half_life_from_beta2(beta2: float, batch_size_sequences: float, context_length_tokens: int) -> float:
    """Token half-life of an EMA with decay ``beta2`` at ``B*T`` tokens per step.

    ``t_half = B * T * ln(1/2) / ln(beta2)`` (Marek et al. 2025).

    Raises:
        ValueError: beta2 outside (0, 1).
    """
    if not 0.0 < beta2 < 1.0:
        raise ValueError(f"beta2 must lie in (0, 1), got {beta2}")
    return batch_size_sequences * context_length_tokens * math.log(0.5) / math.log(beta2)


def warmup_length_tokens(warmup_tokens: int, warmup_min_steps: int, tokens_per_step: int) -> int:
    """Tokens over which the learning rate ramps up: ``max(warmup_tokens, warmup_min_steps * B*T)``.

    The warmup is measured in tokens, the same for every batch size (methodology note section
    11.2), but never shorter than ``warmup_min_steps`` optimizer steps of ``tokens_per_step``
    (``B*T``): at a large batch a token warmup can be one or two steps, which is no ramp at all;
    Goyal et al. 2017 (section 2.2, gradual warmup) ramp large batches over several steps.
    """
    return max(int(warmup_tokens), int(warmup_min_steps) * int(tokens_per_step))


def warmup_factor(tokens_after_step: int, warmup_len_tokens: int) -> float:
    """Learning-rate factor of the step after which ``tokens_after_step`` tokens have been seen.

    ``min(1, tokens_after_step / warmup_len_tokens)`` (linear in tokens; 1 without warmup). Taken
    from the tokens seen *after* the step, so the first step already trains (``B*T / warmup``) and
    with a warmup of ``n`` steps the factors are ``1/n, 2/n, ..., 1``.
    """
    if warmup_len_tokens <= 0:
        return 1.0
    return min(1.0, tokens_after_step / warmup_len_tokens)
