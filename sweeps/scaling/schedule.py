"""A batch-size ramp that stays under the critical batch size as training proceeds, from a study's law and/or the
local critical batch size measured by branching, in the formats trainers read.

The critical batch size grows with the tokens a run has seen (Merrill et al. 2025, "Critical batch size revisited",
arXiv 2505.23971: the local CBS grows early in training and then levels off; Zhang et al. 2024 and Bergsma et al.
2025 in the budget). The ramp reads the study's law ``b_crit(D)`` (:mod:`sweeps.scaling.law`) at ``D`` = the tokens
seen so far, which is an approximation: the law was measured across runs of budget D, not along one run. Each
stage doubles the global batch and starts once the *lower* end of the law's prediction interval at the tokens
seen reaches the new batch size, so the ramp stays under the critical batch size with the interval's confidence,
not only under its point estimate. Doubling keeps every stage an integer multiple of the one before (OLMo-core's
scheduler requires it); where several doublings fall on the same step only the last is kept (x4, x8: still
integer multiples). :func:`bounded_ramp` reads the local CBS that ``critbatch branch`` measures along one run
(Merrill et al. 2025, section 3.1) instead of, or as well as, the law.

Steps are counted as tokens / (batch size x tokens per sequence) per stage. The fixed batch it is compared with is
the largest that stays under the critical batch size from the start (the ramp's first stage): the ramp trains the
same tokens in fewer steps. A fixed batch at the ramp's last stage would take fewer steps still, but spends its
early steps above the critical batch size, where a step buys less progress per token (McCandlish et al. 2018,
eq. 2.11: ``E = E_min (1 + B / b_crit)``); that cost is not counted here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from sweeps.errors import InvalidInput

__all__ = [
    "Stage",
    "batch_size_ramp",
    "bounded_ramp",
    "ceiling_sequences",
    "critbatch_block",
    "local_cbs_points",
    "local_ceiling_sequences",
    "ramp_formats",
    "schedule_files",
]


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


def _check_run(total_tokens: float, tokens_per_sequence: int, max_batch_size_sequences: int | None) -> None:
    """Refuse a run the ramp cannot be read for. Raises InvalidInput naming the option."""
    if not (math.isfinite(total_tokens) and total_tokens > 0 and tokens_per_sequence > 0):
        raise InvalidInput(
            f"--total-tokens and --tokens-per-sequence must be positive and finite, got {total_tokens:g} and "
            f"{tokens_per_sequence}"
        )
    if max_batch_size_sequences is not None and max_batch_size_sequences < 1:
        raise InvalidInput(f"--max-batch-sequences must be at least 1 sequence, got {max_batch_size_sequences}")


def _at_most(first: int, max_batch_size_sequences: int | None) -> int:
    """The first stage's batch, a power of two, no larger than the largest global batch the run allows."""
    if max_batch_size_sequences is None or first <= max_batch_size_sequences:
        return first
    return 2 ** math.floor(math.log2(max_batch_size_sequences))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_law(result: Any) -> None:
    """Refuse a ``scale.json`` whose law cannot be read: the fields :func:`ceiling_sequences` reads (``gamma``,
    ``b0``, ``tokens_ref``, ``tau2``, ``quantile``, ``cov_ln_b0_gamma``) finite numbers, ``members`` a non-empty
    list with positive token budgets. Raises InvalidInput naming the field."""
    if not isinstance(result, dict):
        raise InvalidInput("scale.json: not a study's result (a JSON object)")
    for key in ("gamma", "b0", "tokens_ref", "tau2", "quantile"):
        if not _is_number(result.get(key)):
            raise InvalidInput(f"scale.json: {key} must be a finite number, got {result.get(key)!r}: no law to read")
    if not (result["b0"] > 0 and result["tokens_ref"] > 0):
        raise InvalidInput("scale.json: b0 and tokens_ref must be positive")
    cov = result.get("cov_ln_b0_gamma")
    if not (
        isinstance(cov, list) and len(cov) == 2 and all(isinstance(r, list) and len(r) == 2 for r in cov)
    ) or not all(_is_number(v) for r in cov for v in r):
        raise InvalidInput(f"scale.json: cov_ln_b0_gamma must be a 2 x 2 matrix of finite numbers, got {cov!r}")
    members = result.get("members")
    if not (isinstance(members, list) and members) or not all(
        isinstance(m, dict) and _is_number(m.get("tokens")) and m["tokens"] > 0 for m in members
    ):
        raise InvalidInput("scale.json: members must be a non-empty list, each with a positive budget in tokens")


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


def _ramp_fields(
    stages: list[dict[str, Any]], steps: int, first: int, total_tokens: float, tokens_per_sequence: int
) -> dict[str, Any]:
    """What every ramp reports: its ``stages`` and ``steps``, the run's size, and the fixed batch it is compared
    with (the first stage's, for the whole run: ``fixed_steps``, ``steps_saved_fraction``)."""
    fixed_steps = math.ceil(total_tokens / (first * tokens_per_sequence))
    return {
        "stages": stages,
        "steps": steps,
        "total_tokens": total_tokens,
        "tokens_per_sequence": tokens_per_sequence,
        "fixed_batch_size_sequences": first,
        "fixed_steps": fixed_steps,
        "steps_saved_fraction": 1 - steps / fixed_steps,
    }


def _on_whole_steps(
    stages: list[tuple[float, int]], total_tokens: float, tokens_per_sequence: int
) -> tuple[list[tuple[int, Stage]], int]:
    """``(start tokens, batch)`` pairs as :class:`Stage` s, each with its index in ``stages``, and the run's steps.

    Each stage starts on a whole step of the one before it (the first step boundary at or after its planned start).
    A stage that would get no step (the next starts at the same step boundary, or the run is over) is left out:
    Megatron-LM's and OLMo-core's schedule parsers refuse two stages at the same tokens, and the next stage is an
    integer multiple of the one before the stage left out.
    """
    out, steps, pos = [], 0, 0
    for i, (_, b) in enumerate(stages):
        end = stages[i + 1][0] if i + 1 < len(stages) else total_tokens
        n = math.ceil(max(end - pos, 0) / (b * tokens_per_sequence))
        if n == 0 and i > 0:
            continue
        out.append((i, Stage(start_tokens=pos, batch_size_sequences=b, start_step=steps)))
        steps, pos = steps + n, pos + n * b * tokens_per_sequence
    return out, steps


def batch_size_ramp(
    result: dict[str, Any], total_tokens: float, tokens_per_sequence: int, max_batch_size_sequences: int | None = None
) -> dict[str, Any]:
    """The ramp for a run of ``total_tokens`` from a study's ``scale.json`` ``result``.

    The first stage is the largest power of two under the ceiling at the smallest budget the study measured (below
    it the law is not known); each next stage doubles it, up to ``max_batch_size_sequences`` (default: under the
    ceiling at ``total_tokens``; the first stage is held to it too); doublings that fall on the same step are one
    stage.

    Returns:
        ``stages`` (:class:`Stage` as dicts), ``steps``, ``fixed_batch_size_sequences`` and ``fixed_steps`` (the
        first stage's batch for the whole run), ``steps_saved_fraction``, ``note`` (what the numbers assume) and
        ``warnings`` (a lower bound under one sequence at the smallest budget: the ramp then starts at 1).

    Raises:
        InvalidInput: a law that does not grow (``gamma <= 0``: no ramp to take home), a ``result`` without a
            readable law (a field missing or not finite), sizes that are not positive and finite, or
            ``max_batch_size_sequences`` under 1.
    """
    _check_run(total_tokens, tokens_per_sequence, max_batch_size_sequences)
    _check_law(result)
    if result["gamma"] <= 0:
        raise InvalidInput(
            f"the study's exponent is {result['gamma']:.3g}: b_crit does not grow with the budget, "
            "so a fixed batch is the schedule"
        )
    smallest = min(m["tokens"] for m in result["members"])
    floor_at_start = ceiling_sequences(result, smallest)
    first = _at_most(2 ** math.floor(math.log2(floor_at_start)) if floor_at_start >= 1 else 1, max_batch_size_sequences)
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
    out, steps = _on_whole_steps(stages, total_tokens, tokens_per_sequence)
    return {
        **_ramp_fields([s.__dict__ for _, s in out], steps, first, total_tokens, tokens_per_sequence),
        "note": "each stage starts where the lower end of the law's prediction interval, read at the tokens seen, "
        "reaches its batch size; the law was measured across budgets, not along one run",
        "warnings": notes + _law_warnings(result, total_tokens),
    }


def local_cbs_points(local_cbs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """``(tokens_seen, local_cbs_sequences)`` pairs, sorted by tokens, from ``critbatch branch``'s ``local_cbs``
    list (its ``branch.json`` or a sweep's ``cbs.json``); points with no local CBS (no branch ended with a finite
    loss) are left out.

    Raises:
        InvalidInput: not a list of such points, or none left with a local CBS.
    """
    try:
        points = sorted(
            (float(p["tokens_seen"]), float(p["local_cbs_sequences"]))
            for p in local_cbs
            if p["local_cbs_sequences"] is not None
        )
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"local_cbs: not critbatch branch's list of points ({exc!r})") from None
    if not points:
        raise InvalidInput("local_cbs: no point has a local CBS (no branch ended with a finite loss)")
    if any(not (0 <= t < math.inf and 0 < b < math.inf) for t, b in points) or len({t for t, _ in points}) != len(
        points
    ):
        raise InvalidInput(
            f"local_cbs: tokens_seen must be distinct, finite and >= 0, sizes positive and finite, got {points}"
        )
    return points


def local_ceiling_sequences(points: list[tuple[float, float]], tokens: float) -> float:
    """The measured local CBS (sequences) at ``tokens`` seen, from :func:`local_cbs_points`.

    Between measured points it is interpolated linearly in log tokens and log batch size; from a point at 0 tokens
    to the next it is the lower of the two (a log scale has no 0); before the first point it is the first value and
    beyond the last point the last value, held, not extrapolated.
    """
    if tokens <= points[0][0]:
        return points[0][1]
    for (t0, b0), (t1, b1) in zip(points, points[1:]):
        if tokens == t1:
            return b1
        if tokens < t1:
            if t0 <= 0:
                return min(b0, b1)
            w = math.log(tokens / t0) / math.log(t1 / t0)
            return math.exp(math.log(b0) + w * math.log(b1 / b0))
    return points[-1][1]


def _bounds_at(
    result: dict[str, Any] | None, points: list[tuple[float, float]] | None, tokens: float
) -> tuple[float, str]:
    """The lower of the bounds given at ``tokens`` (sequences) and which it is: ``law`` (the lower end of the law's
    prediction interval, read at the smallest budget studied below it) or ``local_cbs``."""
    found = []
    if result is not None:
        smallest = min(m["tokens"] for m in result["members"])
        found.append((ceiling_sequences(result, max(tokens, smallest)), "law"))
    if points is not None:
        found.append((local_ceiling_sequences(points, tokens), "local_cbs"))
    return min(found)


def bounded_ramp(
    total_tokens: float,
    tokens_per_sequence: int,
    *,
    result: dict[str, Any] | None = None,
    local_cbs: list[tuple[float, float]] | None = None,
    max_batch_size_sequences: int | None = None,
) -> dict[str, Any]:
    """A doubling ramp that stays under the measured local CBS (Merrill et al. 2025, section 3.1: ``critbatch
    branch``) as tokens seen grow, and under the lower end of a study's law too where ``result`` (``scale.json``)
    is given: under the lower of the two, at every token from its start to ``total_tokens``.

    A stage of batch B starts at the first token count from which the bound stays at or above B for the rest of
    the run (the bound's minimum over what is left, so a measured local CBS that falls again, or a law's lower end
    that falls where its interval widens, holds a stage back). Starts are read on a grid of 2,000 log-spaced token
    counts plus the measured points, so a stage starts up to 1 % of its tokens late, never early; then on a whole
    step of the stage before it. Each stage's ``bound`` says which bound held it (``law`` or ``local_cbs``).
    Batch sizes are in the sequences the bound was measured in.

    Args:
        local_cbs: :func:`local_cbs_points`; None for the law alone (read on the grid, not by bisection as
            :func:`batch_size_ramp` does).

    Returns:
        :func:`batch_size_ramp`'s fields, with ``bound`` in each stage and ``bounds`` (which were given).

    Raises:
        InvalidInput: neither bound given, a ``result`` without a readable law, sizes that are not positive and
            finite, or ``max_batch_size_sequences`` under 1.
    """
    if result is None and local_cbs is None:
        raise InvalidInput("give a study's scale.json, a branch run's local CBS (--local-cbs), or both")
    _check_run(total_tokens, tokens_per_sequence, max_batch_size_sequences)
    if result is not None:
        _check_law(result)
    knots = [t for t, _ in local_cbs or []]
    if result is not None:
        knots.append(min(m["tokens"] for m in result["members"]))
    lo = min([t for t in knots if 0 < t < total_tokens] or [total_tokens])
    grid = sorted(
        {0.0, total_tokens, *(t for t in knots if t < total_tokens)}
        | {math.exp(math.log(lo) + math.log(total_tokens / lo) * i / 2000) for i in range(2001)}
    )
    held = [_bounds_at(result, local_cbs, t) for t in grid]
    for i in range(len(held) - 2, -1, -1):  # the bound's minimum over the rest of the run
        held[i] = min(held[i], held[i + 1])
    first_bound = held[0][0]  # the 1e-9s below: a bound equal to a power of two at a measured point stays equal
    first = _at_most(
        2 ** math.floor(math.log2(first_bound * (1 + 1e-9))) if first_bound >= 1 else 1, max_batch_size_sequences
    )
    top = max_batch_size_sequences or 2 ** math.floor(math.log2(max(held[-1][0] * (1 + 1e-9), first)))
    stages, sources, i = [(0.0, first)], [held[0][1]], 0
    while stages[-1][1] * 2 <= top:
        i = next((j for j in range(i, len(grid)) if held[j][0] >= stages[-1][1] * 2 * (1 - 1e-9)), -1)
        if i < 0:
            break
        stages.append((grid[i], stages[-1][1] * 2))
        sources.append(held[i][1])
    out, steps = _on_whole_steps(stages, total_tokens, tokens_per_sequence)
    return {
        **_ramp_fields(
            [{**s.__dict__, "bound": sources[i]} for i, s in out], steps, first, total_tokens, tokens_per_sequence
        ),
        "bounds": [name for name, given in (("law", result), ("local_cbs", local_cbs)) if given is not None],
        "note": _BOUNDED_NOTE,
        "warnings": _bounded_warnings(first_bound, local_cbs, total_tokens) + _law_warnings(result, total_tokens),
    }


_BOUNDED_NOTE = (
    "each stage starts where the lower of the bounds given stays at or above its batch size for the rest of the run: "
    "the local CBS measured by branching (interpolated in log-log between its points, its last value held beyond "
    "the last point, not extrapolated) and the lower end of the law's prediction interval (measured across "
    "budgets, not along one run)"
)


def _law_warnings(result: dict[str, Any] | None, total_tokens: float) -> list[str]:
    """What the law cannot show for this run: a law of another quantity than b_crit (Zhang et al.'s 20 % CBS,
    ``0.2 b_crit + 1.2 B0``, lies above b_crit where b_crit is under 1.5 B0), and a run shorter than the smallest
    budget the study measured (the law is read there, at more tokens than the run has, and b_crit grows with the
    budget, so the ramp may sit above it)."""
    if result is None:
        return []
    notes = []
    quantity = result.get("quantity", "b_crit")
    if quantity != "b_crit":
        notes.append(
            f"the study's law is of {quantity}, not b_crit: the ramp stays under it, and cbs_20 (Zhang et al.'s "
            "20 % CBS, 0.2 b_crit + 1.2 B0) lies above b_crit wherever b_crit is under 1.5 B0"
        )
    smallest = min(m["tokens"] for m in result["members"])
    if total_tokens < smallest:
        notes.append(
            f"the run's {total_tokens:.3g} tokens are fewer than the smallest budget the study measured "
            f"({smallest:.3g}): the law is not known there and is read at that budget, where b_crit is larger, so "
            "the ramp may sit above the run's critical batch size"
        )
    return notes


def _bounded_warnings(
    first_bound: float, local_cbs: list[tuple[float, float]] | None, total_tokens: float
) -> list[str]:
    """What :func:`bounded_ramp`'s numbers cannot show: a start under one sequence, tokens before the first measured
    point (the local CBS grows early in training, Merrill et al. 2025, so the first value held back may lie above
    it), a run past the last point."""
    notes = []
    if local_cbs is not None and local_cbs[0][0] > 0:
        notes.append(
            f"the local CBS was first measured at {local_cbs[0][0]:.3g} tokens seen; before that the ramp holds that "
            f"value ({local_cbs[0][1]:.3g} sequences), which the measurement cannot show to be under the critical "
            "batch size there (it grows early in training)"
        )
    if first_bound < 1:
        notes.append(
            f"the bound at the start is {first_bound:.2g} sequences, under one: the ramp starts at 1 sequence, "
            "which the measurements cannot show to be under the critical batch size there"
        )
    if local_cbs is not None and local_cbs[-1][0] < total_tokens:
        notes.append(
            f"the local CBS was measured up to {local_cbs[-1][0]:.3g} tokens seen; from there to {total_tokens:.3g} "
            f"the ramp holds its last value ({local_cbs[-1][1]:.3g} sequences) rather than extrapolate"
        )
    return notes


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
    ``batch_warmup`` block (:func:`critbatch_block`) and plain JSON.

    The OLMo-core config carries the ``_CLASS_`` fields its own config loader needs to build the callback and its
    ``Duration`` s (``TrainerConfig.from_dict`` with it under ``callbacks``), as its ``as_config_dict`` writes them.
    OLMo-core raises the batch k-fold only after a multiple of k batches at the old size, so where a stage starts
    after another count it switches up to k - 1 steps later (never earlier) than the JSON ramp says."""
    t = ramp["tokens_per_sequence"]
    stages = ramp["stages"]
    return {
        "critbatch": critbatch_block(ramp),
        "megatron": " ".join(f"{s['start_tokens']}:{s['batch_size_sequences']}" for s in stages),
        "olmo_core": {
            "_CLASS_": "olmo_core.train.callbacks.batch_size_scheduler.BatchSizeSchedulerCallback",
            "batch_sizes": [s["batch_size_sequences"] * t for s in stages],
            "schedule": [
                {"value": s["start_tokens"], "unit": "tokens", "_CLASS_": "olmo_core.train.common.Duration"}
                for s in stages
            ],
        },
        "levanter": {
            "train_batch_size": [{"start": s["start_step"], "value": s["batch_size_sequences"]} for s in stages]
        },
        "json": ramp,
    }


def schedule_files(formats: dict[str, Any]) -> dict[str, str]:
    """The files ``critbatch schedule`` writes, name -> text, from :func:`ramp_formats`: ``schedule.json``,
    ``megatron.txt`` (the argument as a command line carries it), ``olmo_core.json`` and ``levanter.yaml`` (under
    ``trainer:``, where Levanter's ``TrainerConfig`` reads ``train_batch_size``) and ``critbatch.yaml`` (a
    ``batch_warmup`` spec block, :func:`critbatch_block`)."""
    import yaml

    block = formats["critbatch"]
    return {
        "schedule.json": json.dumps(formats["json"], indent=2),
        "megatron.txt": f'--step-batch-size-schedule "{formats["megatron"]}"\n',
        "olmo_core.json": json.dumps(formats["olmo_core"], indent=2),
        "levanter.yaml": yaml.safe_dump({"trainer": formats["levanter"]}, sort_keys=False),
        "critbatch.yaml": (
            "# a critbatch spec block: trains this ramp with search.batch_sizes_sequences: "
            f"[{block['final_batch_size_sequences']}] (the last stage)\n"
            + yaml.safe_dump({"batch_warmup": block["batch_warmup"]}, sort_keys=False, default_flow_style=None)
        ),
    }
