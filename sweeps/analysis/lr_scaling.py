"""The learning-rate scaling rule as a measured answer: each batch size's best learning rate and the
exponent ``alpha`` of ``lr*(B) ~ B^alpha`` fitted over them, with intervals.

The methodology (section 7.4) asks whether the per-batch-size optimum LR follows the linear
(``alpha = 1``, Goyal et al. 2017), the square-root (``alpha = 0.5``, Malladi et al. 2022, the Adam SDE)
or no scaling. The best LR of a batch size is read from the trials that reached the headline target:

- where three or more distinct LRs reached it, the vertex of a quadratic in log LR fitted to log tokens
  to target (the local optimum of a smooth response), when convex with its vertex inside the tried LRs;
- otherwise the LR of the trial that reached it first.

Its uncertainty is given as a bracket, not an interval: the tried LRs on either side of the fastest one.
For a unimodal response measured with less noise than the differences between tried LRs, the optimum
lies inside it. A delta-method interval of the vertex was tried and rejected: it covers a symmetric
response (0.95 in simulation) but the response here is asymmetric in log LR (the cached grid of
``benchmarks/search_efficiency.py``), and on a piecewise quadratic with curvatures 1.18 below and 0.39
above the optimum its vertex sits a third of an octave high and the interval covered 0.2-1.4 % of draws
(``tests/sweeps/analysis/test_lr_scaling.py`` keeps that simulation).

``alpha`` is the least-squares slope of log best LR on log B, with a Student-t interval on ``n - 2``
degrees of freedom (ordinary regression; the per-batch-size LR errors are treated as independent and of
equal spread, which a search that draws only two LRs per batch size does not guarantee; an offset shared
by every batch size, such as the quadratic's bias on an asymmetric response, cancels in the slope). Beside it,
:func:`lr_exponent_by_chance` gives the slope that random picks of one trial per batch size give: a
search space centred on one rule returns that rule's exponent on average whatever the data say.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from sweeps.analysis.targets import TrialRecord, tokens_to_target_by_trial

__all__ = [
    "LR_RULE_EXPONENTS",
    "MAX_OPEN_BRACKET_GAIN",
    "best_lr_per_batch",
    "lr_exponent_by_chance",
    "lr_exponent_fit",
    "lr_optimum_beyond_tried",
    "lr_scaling",
    "open_bracket_gains",
    "open_lr_brackets",
]

#: the most an open bracket's optimum may gain in log tokens over its fastest trial (a neighbour that never reached
#: the target gives no slope to extrapolate): a factor of 1.2
MAX_OPEN_BRACKET_GAIN = 0.2

#: the exponent of each LR scaling rule critbatch searches over (``lr = base_lr * (B / B_base)^alpha``)
LR_RULE_EXPONENTS = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}


def best_lr_per_batch(trials: list[TrialRecord], target: float) -> list[dict[str, Any]]:
    """Each batch size's best learning rate at ``target`` (see the module docstring for the rule).

    Returns:
        one entry per batch size with a trial that reached ``target`` (sorted by batch size):
        ``{batch_size_sequences, n_trials_to_target, n_trials, best_lr, method ("quadratic" or
        "first_to_target"), best_lr_bracket}``: ``[lo, hi]``, the tried LRs on either side of the one that
        reached the target first, counting the trials that did not reach it as slower (None on a side with
        none: the optimum may lie beyond), or None with one distinct LR.
    """
    tried: dict[int, list[tuple[float, float]]] = {}  # (lr, tokens to target; inf: not reached)
    tokens = tokens_to_target_by_trial(trials, target)
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if t.trial_id in tokens and lr:
            tok = tokens[t.trial_id]
            tried.setdefault(t.batch_size_sequences, []).append((float(lr), math.inf if tok is None else float(tok)))
    out = []
    for b in sorted(tried):
        rows = sorted(tried[b])
        reached = [(lr, tok) for lr, tok in rows if math.isfinite(tok)]
        if not reached:
            continue
        entry: dict[str, Any] = {"batch_size_sequences": b, "n_trials_to_target": len(reached), "n_trials": len(rows)}
        vertex = _quadratic_optimum([math.log(lr) for lr, _ in reached], [math.log(tok) for _, tok in reached])
        if vertex is not None:
            entry |= {"best_lr": math.exp(vertex), "method": "quadratic"}
        else:
            entry |= {"best_lr": min(reached, key=lambda r: (r[1], r[0]))[0], "method": "first_to_target"}
        entry["best_lr_bracket"] = _bracket(rows)
        out.append(entry)
    return out


def _quadratic_optimum(x: list[float], y: list[float]) -> float | None:
    """The minimum of ``y = a + b x + c x^2`` fitted by least squares, if the fit is convex and its vertex
    lies inside the sampled ``x`` (an extrapolated optimum is not a measurement); else None (also with
    fewer than 3 distinct ``x``)."""
    if len(set(x)) < 3:
        return None
    X = np.column_stack([np.ones(len(x)), x, np.square(x)])
    (_, b, c), *_ = np.linalg.lstsq(X, np.asarray(y), rcond=None)
    if c <= 0:
        return None
    vertex = -b / (2 * c)
    return float(vertex) if min(x) <= vertex <= max(x) else None


def _bracket(rows: list[tuple[float, float]]) -> list[float | None] | None:
    """``[the tried LR just below the fastest one, the tried LR just above]`` of ``(lr, tokens)`` rows
    (None on a side with no tried LR); None with one distinct LR."""
    lrs = sorted({lr for lr, _ in rows})
    if len(lrs) < 2:
        return None
    best = min(rows, key=lambda r: (r[1], r[0]))[0]
    i = lrs.index(best)
    return [lrs[i - 1] if i > 0 else None, lrs[i + 1] if i + 1 < len(lrs) else None]


def lr_exponent_fit(batch_sizes: list[float], lrs: list[float], level: float = 0.95) -> dict[str, Any] | None:
    """The exponent ``alpha`` of ``lr = c B^alpha``: least squares on logs, with a Student-t interval.

    Args:
        batch_sizes: one batch size per point (sequences).
        lrs: the best learning rate of each.

    Returns:
        ``{alpha, alpha_ci, n_batch_sizes, rules_in_interval}`` (``rules_in_interval``: the names of
        :data:`LR_RULE_EXPONENTS` whose exponent the interval holds), or None with fewer than 3 distinct
        batch sizes. With exactly 3 the interval has 1 degree of freedom and is wide; that is the data.
    """
    if len(set(batch_sizes)) < 3 or len(batch_sizes) != len(lrs):
        return None
    x, y = np.log(np.asarray(batch_sizes, dtype=float)), np.log(np.asarray(lrs, dtype=float))
    res: Any = stats.linregress(x, y)
    dof = len(x) - 2
    half = stats.t.ppf(0.5 + level / 2, dof) * res.stderr if dof > 0 else math.inf
    lo, hi = float(res.slope - half), float(res.slope + half)
    return {
        "alpha": float(res.slope),
        "alpha_ci": [lo, hi],
        "n_batch_sizes": len(set(batch_sizes)),
        "rules_in_interval": [name for name, a in LR_RULE_EXPONENTS.items() if lo - 1e-9 <= a <= hi + 1e-9],
    }


def lr_exponent_by_chance(
    trials: list[TrialRecord], batch_sizes: set[int], draws: int = 2000, seed: int = 0
) -> dict[str, float] | None:
    """The fitted LR exponent when one trial per batch size (of ``batch_sizes``, those of the fit) is
    picked at random: the null to beat.

    A search space whose LR rules and multipliers are spread evenly around a rule gives that rule's
    exponent on average whatever the data say; a fitted exponent is evidence only where it differs
    from this distribution.

    Returns:
        ``{mean, sd, draws}``, or None with fewer than 3 batch sizes.
    """
    by_b: dict[int, list[float]] = {}
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if lr and t.tokens and t.batch_size_sequences in batch_sizes:
            by_b.setdefault(t.batch_size_sequences, []).append(float(lr))
    if len(by_b) < 3:
        return None
    for lrs in by_b.values():
        lrs.sort()  # the draws must not depend on the order of the records (Tune's trial ids are random)
    rng = np.random.default_rng(seed)
    x = np.log(np.array(sorted(by_b), dtype=float))
    picks = np.stack([np.log(np.asarray(by_b[b]))[rng.integers(0, len(by_b[b]), draws)] for b in sorted(by_b)], axis=1)
    xc = x - x.mean()
    slopes = (picks - picks.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
    return {"mean": float(slopes.mean()), "sd": float(slopes.std(ddof=1)), "draws": draws}


def lr_optimum_beyond_tried(per_batch: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The batch sizes whose fastest trial ran at the highest (``above``) or lowest (``below``) LR they tried,
    from :func:`best_lr_per_batch`'s brackets (one tried LR: neither): there the optimum may lie beyond, and
    the batch size's steps to target are an upper bound on the tuned ones."""
    above = [
        p["batch_size_sequences"] for p in per_batch if p.get("best_lr_bracket") and p["best_lr_bracket"][1] is None
    ]
    below = [
        p["batch_size_sequences"] for p in per_batch if p.get("best_lr_bracket") and p["best_lr_bracket"][0] is None
    ]
    return {"above": above, "below": below}


def open_lr_brackets(trials: list[TrialRecord], targets: list[float]) -> list[dict[str, Any]]:
    """The batch sizes whose fastest trial at some target ran at an end of the LRs they tried: there the optimum
    may lie beyond, and the batch size's point at that target overstates its tuned steps (the fit's points are
    the fastest trial at each target, :data:`sweeps.analysis.targets.TARGET_RULE`). At each target only batch
    sizes with a trial that reached it count; trials that did not reach it (or diverged) count as slower, so a
    probe beyond that diverged closes the bracket. One tried LR is open on both sides.

    Returns:
        one entry per (batch size, side), sorted: ``{batch_size_sequences, side ("above" | "below"),
        fastest_lr (at the lowest such target), targets (the target losses where it is open, decreasing)}``.
    """
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for target in sorted(targets, reverse=True):
        for p in best_lr_per_batch(trials, target):
            bracket = p.get("best_lr_bracket")
            sides = (
                ["below", "above"]
                if bracket is None
                else ((["below"] if bracket[0] is None else []) + (["above"] if bracket[1] is None else []))
            )
            if not sides:
                continue
            fastest = _fastest_lr(trials, p["batch_size_sequences"], target)
            for side in sides:
                e = out.setdefault(
                    (p["batch_size_sequences"], side),
                    {"batch_size_sequences": p["batch_size_sequences"], "side": side, "targets": []},
                )
                e["targets"].append(float(target))
                e["fastest_lr"] = fastest
    return [out[k] for k in sorted(out)]


def open_bracket_gains(trials: list[TrialRecord], target: float) -> dict[int, float]:
    """How much faster (in log tokens to ``target``) each batch size with an open bracket there could be with its
    optimum LR up to an octave beyond its fastest tried one: a third of the log-tokens slope per octave ``s`` between
    its fastest trial and the next tried LR inward. (On a quadratic response ``k (x - x*)^2`` in octaves, an
    optimum ``d`` octaves beyond the fastest tried LR gives ``s = k (2 d + 1)`` and a gain ``k d^2 = s d^2 / (2 d +
    1)``, at most ``s / 3`` for ``d <= 1``.) Capped at :data:`MAX_OPEN_BRACKET_GAIN`, the cap also where that
    neighbour never reached the target, or with one tried LR.

    Returns:
        ``{batch size: gain >= 0}`` for the batch sizes that reached ``target`` with an open bracket.
    """
    tokens = tokens_to_target_by_trial(trials, target)
    rows: dict[int, dict[float, float]] = {}
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if lr and t.trial_id in tokens:
            tok = tokens[t.trial_id]
            d = rows.setdefault(t.batch_size_sequences, {})
            d[float(lr)] = min(d.get(float(lr), math.inf), math.inf if tok is None else float(tok))
    out = {}
    for b, speed in rows.items():
        lrs = sorted(speed)
        best = min(lrs, key=lambda lr: (speed[lr], lr))
        if not math.isfinite(speed[best]) or 0 < lrs.index(best) < len(lrs) - 1:
            continue
        if len(lrs) == 1:
            out[b] = MAX_OPEN_BRACKET_GAIN
            continue
        inner = lrs[1] if best == lrs[0] else lrs[-2]
        slope = (math.log(speed[inner]) - math.log(speed[best])) / abs(math.log2(inner / best))
        out[b] = min(max(slope / 3, 0.0), MAX_OPEN_BRACKET_GAIN) if math.isfinite(slope) else MAX_OPEN_BRACKET_GAIN
    return out


def _fastest_lr(trials: list[TrialRecord], batch_size: int, target: float) -> float | None:
    """The LR of ``batch_size``'s trial first to ``target`` (ties: the lower LR)."""
    tokens = tokens_to_target_by_trial([t for t in trials if t.batch_size_sequences == batch_size], target)
    rows = [
        (tok, float(t.hyperparameters["lr"]))
        for t in trials
        if t.batch_size_sequences == batch_size and t.hyperparameters.get("lr") and tokens.get(t.trial_id) is not None
        for tok in [tokens[t.trial_id]]
    ]
    return min(rows)[1] if rows else None


def lr_scaling(trials: list[TrialRecord], target: float, level: float = 0.95) -> dict[str, Any]:
    """``cbs.json``'s LR-scaling keys at the headline ``target``.

    Returns:
        ``{lr_per_batch: best_lr_per_batch(...), lr_optimum_beyond_tried}`` (:func:`lr_optimum_beyond_tried`)
        and, with 3 or more batch sizes,
        ``lr_scaling_exponent_fit`` (alpha), ``lr_scaling_exponent_ci``, ``lr_scaling_rules_in_interval``
        and ``lr_scaling_exponent_by_chance``.
    """
    per_batch = best_lr_per_batch(trials, target)
    beyond = lr_optimum_beyond_tried(per_batch)
    out: dict[str, Any] = {"lr_per_batch": per_batch, "lr_optimum_beyond_tried": beyond}
    fit = lr_exponent_fit([p["batch_size_sequences"] for p in per_batch], [p["best_lr"] for p in per_batch], level)
    if fit is not None:
        out |= {
            "lr_scaling_exponent_fit": fit["alpha"],
            "lr_scaling_exponent_ci": fit["alpha_ci"],
            "lr_scaling_rules_in_interval": fit["rules_in_interval"],
            "lr_scaling_exponent_by_chance": lr_exponent_by_chance(
                trials, {p["batch_size_sequences"] for p in per_batch}
            ),
        }
    return out
