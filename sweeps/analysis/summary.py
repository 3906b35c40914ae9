"""The answer in plain words: one headline sentence from ``cbs.json`` (or an ``analyze --csv`` fit), what each
status means, interval ends shown against the swept range, and what the reported quantities are.

Used by the HTML report (:mod:`sweeps.analysis.report`), the command line and the MLflow parent run's
description (:mod:`sweeps.tracking.writer`). Pure: reads the dict, computes nothing new about the fit.

The quantities (methodology note sections 2.2 and 4.1): ``b_crit = E_min / S_min`` (McCandlish et al. 2018,
arXiv 1812.06162, Eq. 2.12) from the fit ``S(B) = S_min + E_min / B``; the compute to a target is
``C(B) = C_min (1 + B / b_crit)``, so ``0.2 b_crit`` is the largest batch within 20 % of the least compute;
Zhang et al. 2024's (arXiv 2410.21676) critical batch size ``cbs_20 = 0.2 b_crit + 1.2 B0`` is the batch
whose steps exceed linear scaling from the reference batch ``B0`` by 20 %.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "STATUS_TEXT",
    "SWEEP_STATUSES",
    "analyze_note",
    "budget_text",
    "caveats",
    "censored_text",
    "definitions_text",
    "describe_status",
    "fitted_batch_sizes",
    "headline",
    "interval_ends_text",
    "swept_range",
]

#: the statuses ``cbs.json`` can have besides a fit's (``sweeps.analysis.fit.STATUSES``): set by
#: :func:`sweeps.analysis.sweep.analyze_trials` (no completed trial, no target) and by the sweep's end when
#: the analysis raised
SWEEP_STATUSES = ("no_completed_trials", "no_targets", "analysis_failed")

#: what each status means, in words (every value of :data:`sweeps.analysis.fit.STATUSES` and
#: :data:`SWEEP_STATUSES`)
STATUS_TEXT = {
    "ok": "the knee (b_crit) and its whole 95 % interval lie inside the swept batch sizes, with at least 2 swept "
    "batch sizes on each side of the knee: b_crit is measured, to within its interval",
    "edge": "a knee was fitted inside the swept batch sizes, but it has fewer than 2 swept batch sizes on one side "
    "or its 95 % interval reaches past the swept range: b_crit is an estimate whose interval says how rough",
    "above_range": "the fitted knee lies above the largest swept batch size: steps to the target still fall almost in "
    "proportion to the batch there, so b_crit is only bounded from below (b_crit_bound) and reported "
    "as no number",
    "below_range": "the fitted knee lies below the smallest swept batch size: every swept batch is already past it, "
    "so b_crit is only bounded from above (b_crit_bound) and reported as no number",
    "misfit": "the points break the model S = S_min + E_min/B (tokens to the target rising towards small batch sizes, "
    "or a scatter far beyond the seed-to-seed noise): no knee is reported, since a fit through them would "
    "give one whatever the truth",
    "no_knee": "no knee is identified: fewer than 3 batch sizes reached the target, or the points bound b_crit on "
    "neither side",
    "no_completed_trials": "no trial completed, so there is nothing to fit",
    "no_targets": "no target loss could be chosen from the curves (too few batch sizes or milestones completed), so "
    "there is nothing to fit",
    "analysis_failed": "the analysis raised an error; the trials are kept in trials.json",
}


def describe_status(status: str | None) -> str:
    """What ``status`` (a value of ``cbs.json``'s ``status``) means, in words; an unknown value is named as such."""
    if status in STATUS_TEXT:
        return STATUS_TEXT[status]
    return f"status {status!r} is not one the analysis sets" if status else "no status recorded"


def _num(x: float) -> str:
    """A batch size for a sentence: whole numbers from 10 up (with thousands separators), else 2 significant digits."""
    if not math.isfinite(x):
        return "unbounded"
    if abs(x) >= 10:
        return f"{round(x):,}"
    return f"{x:.2g}"


def _primary_target(cbs: dict[str, Any]) -> dict[str, Any] | None:
    L = cbs.get("target_loss")
    return next((t for t in cbs.get("targets") or [] if L is not None and t.get("target_loss") == L), None)


def fitted_batch_sizes(fit: dict[str, Any]) -> list[float]:
    """The distinct batch sizes a fit used (sorted): its ``fitted_batch_sizes``, else the batch sizes of its
    ``points``, else (``cbs.json``) those of its primary target, else its ``per_batch`` rows; [] if none."""
    if fit.get("fitted_batch_sizes"):
        return sorted(float(b) for b in fit["fitted_batch_sizes"])
    pts = fit.get("points") or (_primary_target(fit) or {}).get("points") or []
    bs = {float(p["batch_size_sequences"]) for p in pts if isinstance(p, dict) and "batch_size_sequences" in p}
    if not bs:
        bs = {
            float(r["batch_size_sequences"])
            for r in fit.get("per_batch") or []
            if isinstance(r, dict) and "batch_size_sequences" in r
        }
    return sorted(bs)


def swept_range(fit: dict[str, Any]) -> tuple[float, float] | None:
    """``(smallest, largest)`` of :func:`fitted_batch_sizes`; None when the dict holds no batch sizes."""
    bs = fitted_batch_sizes(fit)
    return (bs[0], bs[-1]) if bs else None


def interval_ends_text(ci: list | None, swept: tuple[float, float] | None) -> tuple[str, str]:
    """The two ends of an interval ``[lo, hi]`` (``hi`` None: unbounded) as shown to a reader: an end past the
    swept range is ``"< LO"`` / ``"> HI"`` (the data say only that it lies beyond; the raw value stays in
    ``cbs.json``); ``("-", "-")`` without an interval; without a swept range the raw values (``unbounded``)."""
    if not ci:
        return "-", "-"
    lo, hi = ci[0], ci[1]
    if swept is None:
        return (_num(float(lo)) if lo is not None else "-"), (_num(float(hi)) if hi is not None else "unbounded")
    lo_sw, hi_sw = swept
    lo_t = f"< {lo_sw:g}" if lo is None or float(lo) < lo_sw else _num(float(lo))
    hi_t = f"> {hi_sw:g}" if hi is None or float(hi) > hi_sw else _num(float(hi))
    return lo_t, hi_t


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _sizes(values: list[float]) -> str:
    vals = [_num(v) for v in values]
    return vals[0] if len(vals) == 1 else ", ".join(vals[:-1]) + " and " + vals[-1]


def _below(lo_sw: float) -> list[float]:
    """Two batch sizes to add below the swept range (halvings, down to 1 sequence)."""
    return [b for b in (lo_sw / 2, lo_sw / 4) if b >= 1] or []


def headline(cbs: dict[str, Any], *, unit: str = "sequences") -> str:
    """One sentence a person can act on, from ``cbs.json``'s (or one ``analyze --csv`` fit's) ``status``,
    ``b_crit``, ``b_crit_ci``, ``target_loss`` and swept batch sizes (:func:`swept_range`).

    It says where the knee lies (ends past the swept range as "below 4" / "above 64"), how much closer this
    sweep can place it (the interval's width as a factor), and which batch sizes to add to narrow or find it;
    for a status without a fit, what went wrong and what to do. ``unit``: the unit of the batch sizes
    (``analyze --csv``: the CSV's ``batch_size`` unit).
    """
    text = _sentence(cbs, unit)
    return text[:1].upper() + text[1:]


def _sentence(cbs: dict[str, Any], unit: str) -> str:
    status = cbs.get("status")
    L = cbs.get("target_loss")
    at = f"At target loss {L:.4g}, " if isinstance(L, (int, float)) else ""
    swept = swept_range(cbs)
    b, ci = cbs.get("b_crit"), cbs.get("b_crit_ci")
    if status == "no_completed_trials":
        return (
            "No trial completed, so there is no critical batch size to report: read the failed trials' errors "
            "(each trial run's critbatch.error tag, or OUT/trials.json) and rerun."
        )
    if status == "no_targets":
        return (
            "No target loss could be chosen from the loss curves (too few batch sizes or milestones completed): "
            "give `targets` in the spec, or run more or longer trials."
        )
    if status == "analysis_failed":
        return (
            f"The analysis failed ({cbs.get('message') or 'no message'}); the trials are kept: "
            "`critbatch analyze --trials OUT/trials.json` runs it again."
        )
    sw_text = f"{_num(swept[0])}-{_num(swept[1])} {unit}" if swept is not None else ""
    if status in ("ok", "edge") and isinstance(b, (int, float)) and swept is not None:
        return _headline_fitted(at, status, float(b), ci, swept, cbs, unit)
    if status == "above_range" and swept is not None:
        lo = ci[0] if ci else None
        low = f" (95 % interval from {_num(float(lo))} up)" if lo is not None and _positive(lo) else ""
        late = [x for x in _excluded(cbs) if x > swept[1]]
        todo = _late_text(late) if late else f"add batch sizes {_sizes([swept[1] * 2, swept[1] * 4])}"
        gap = _gap(cbs)
        how = (
            "steps still fall almost in proportion to the batch, so a larger batch is still nearly free in compute"
            if gap is None or gap <= 1.2
            else f"steps still fall with the batch, though the largest needs {gap:.1f}x the steps perfect scaling from the "
            "smallest gives"
        )
        return (
            f"{at}the knee lies above the largest batch size that reached the target, {_num(swept[1])} {unit}{low}: "
            f"up to there {how}; to find the knee, {todo}."
        )
    if status == "below_range" and swept is not None:
        hi = ci[1] if ci else None
        up = f" (95 % interval up to {_num(float(hi))})" if hi is not None and _positive(hi) else ""
        add = _below(swept[0])
        what = (
            f"to find it, add batch sizes {_sizes(add)}"
            if add
            else "it lies below one sequence: use the smallest batch that keeps the devices busy"
        )
        return (
            f"{at}the knee lies below the smallest batch size that reached the target, {_num(swept[0])} "
            f"{unit}{up}: every such batch is already past it, so a larger batch buys few steps at more compute; {what}."
        )
    if status == "no_knee":
        n = cbs.get("n_batch_sizes", len(fitted_batch_sizes(cbs)))
        if isinstance(n, int) and n < 3:
            return (
                f"{at}no knee can be identified: only {n} batch size(s) reached the target and the fit needs at "
                "least 3; run more batch sizes to the target (more trials, or a longer budget)."
            )
        wider = f" (e.g. {_sizes(_below(swept[0]) + [swept[1] * 2, swept[1] * 4])})" if swept else ""
        return (
            f"{at}no knee can be identified: the points{' over ' + sw_text if sw_text else ''} bound b_crit on "
            f"neither side; widen the swept batch sizes on both sides{wider}."
        )
    if status == "misfit":
        return (
            f"{at}no critical batch size is reported: {cbs.get('message') or describe_status(status)}. Check the "
            "small batch sizes' learning rates (an LR probe) and that the schedule does not depend on the run's "
            "length."
        )
    msg = cbs.get("message")
    return f"{at}status {status}: {describe_status(status)}" + (f" ({msg})." if msg else ".")


def _gap(cbs: dict[str, Any]) -> float | None:
    """Steps at the largest fitted batch size over perfect scaling from the smallest, from the primary target's
    (or a fit's own) points; None without 2 batch sizes."""
    pts = cbs.get("points") or (_primary_target(cbs) or {}).get("points") or []
    rows = [
        (float(p["batch_size_sequences"]), float(p["steps_to_target"]))
        for p in pts
        if isinstance(p, dict) and p.get("steps_to_target") and not p.get("upper_bound")
    ]
    if len({b for b, _ in rows}) < 2:
        return None
    lo_b, hi_b = min(b for b, _ in rows), max(b for b, _ in rows)

    def mean(b):
        return math.exp(sum(math.log(s) for x, s in rows if x == b) / sum(1 for x, _ in rows if x == b))

    return mean(hi_b) * hi_b / (mean(lo_b) * lo_b)


def _headline_fitted(
    at: str, status: str, b: float, ci: list | None, swept: tuple[float, float], fit: dict[str, Any], unit: str
) -> str:
    """The headline of a fitted knee (``ok`` or ``edge``)."""
    lo_sw, hi_sw = swept
    lo = float(ci[0]) if ci and ci[0] is not None else 0.0
    hi = float(ci[1]) if ci and ci[1] is not None else math.inf
    lo_out, hi_out = lo < lo_sw, hi > hi_sw
    # the range the status speaks of: the batch sizes in the fit, not every swept one
    fitted = f"the fitted batch sizes ({_num(lo_sw)}-{_num(hi_sw)} {unit}, those that reached the target)"
    tokens = fit.get("b_crit_tokens")
    near = f"most likely near {_num(b)}" + (
        f" ({_num(float(tokens))} tokens)" if isinstance(tokens, (int, float)) else ""
    )
    if lo_out and hi_out:
        where = (
            f"could lie anywhere from below {_num(lo_sw)} to above {_num(hi_sw)} {unit} (its 95 % interval "
            f"reaches past both ends of {fitted}), {near}"
        )
    elif lo_out:
        where = f"lies below {_num(hi)} {unit} (95 % interval), possibly below the smallest of {fitted}, {near}"
    elif hi_out:
        where = f"lies above {_num(lo)} {unit} (95 % interval), possibly above the largest of {fitted}, {near}"
    else:
        where = f"lies between {_num(lo)} and {_num(hi)} {unit} (95 % interval), {near}"
    width = min(hi, hi_sw) / max(lo, lo_sw)
    w = f"{width:.0f}" if width >= 10 else f"{width:.2g}"
    sizes = fitted_batch_sizes(fit)
    few_below = sum(1 for x in sizes if x <= b) < 2
    few_above = sum(1 for x in sizes if x >= b) < 2
    below = _below(lo_sw) if lo_out or few_below else []
    above = [hi_sw * 2, hi_sw * 4] if hi_out or few_above else []
    late = [x for x in _excluded(fit) if (above and x > hi_sw) or (below and x < lo_sw)]
    if late:  # swept there already, but those batch sizes did not reach the target: they need tokens, not company
        above = [] if any(x > hi_sw for x in late) else above
        below = [] if any(x < lo_sw for x in late) else below
    if status == "ok":
        text = (
            f"{at}the critical batch size b_crit {where}: batches up to about {_num(0.2 * b)} {unit} "
            "(0.2 b_crit) cost at most 20 % more compute than the least, and batches well above "
            f"{_num(b)} buy few steps for their compute"
        )
        if width > 4:
            text += (
                f"; the interval spans a factor of {w}: more trials (learning-rate probes) at the batch sizes "
                f"near {_num(b)} narrow it"
            )
        return text + "."
    if lo_out or hi_out:
        why = (
            f"this sweep cannot pin it closer than a factor of {w} (the interval's width within the fitted "
            "batch sizes; it is wider beyond)"
        )
    else:
        side = "smaller" if few_below else "larger"
        why = (
            f"it rests on fewer than 2 fitted batch sizes on its {side} side (the interval spans a factor of {w}), "
            "so its place rests on the fitted curve more than on the data"
        )
    adds = [
        f"{_sizes(below)} (below {_num(lo_sw)})" if below else "",
        f"{_sizes(above)} (above {_num(hi_sw)})" if above else "",
    ]
    adds = [a for a in adds if a]
    todo = [f"add batch sizes {' and '.join(adds)}"] if adds else []
    if late:
        todo.append(_late_text(late))
    todo_text = (
        ("to narrow it, " + " and ".join(todo))
        if todo
        else f"to narrow it, add trials (learning-rate probes) at the batch sizes near {_num(b)}"
    )
    return f"{at}the knee (b_crit) {where}; {why}; {todo_text}."


def _excluded(fit: dict[str, Any]) -> list[float]:
    """The swept batch sizes that did not reach the fit's target within their budget (censored in the fit)."""
    ex = fit.get("excluded_batch_sizes")
    if ex is None:
        ex = (_primary_target(fit) or {}).get("excluded_batch_sizes")
    return sorted(float(x) for x in ex or [])


def budget_text(budget_tokens: int, per_batch: list[dict[str, Any]]) -> str:
    """The sentence on the token budget (report.html): the spec's ``budget_tokens`` per trial, equal for every batch
    size, unless ``per_batch``'s ``budget_tokens`` (the most tokens one of a batch size's trials trained) say
    otherwise (token reallocation re-runs some trials longer and ends later ones at a loss; pruning ends some
    early): then what each batch size's trials trained, at most per trial and in all (``tokens_trained``)."""
    spent = [(p["batch_size_sequences"], p.get("budget_tokens"), p.get("tokens_trained")) for p in per_batch]
    if all(most is None or round(most) == budget_tokens for _, most, _ in spent):
        return f"Budget {budget_tokens:,} tokens per trial (equal for every batch size)"
    each = "; ".join(
        f"B = {b}: {'-' if most is None else f'{round(most):,}'} tokens"
        + ("" if total is None else f" ({round(total):,} in all)")
        for b, most, total in spent
    )
    return (
        f"Budget {budget_tokens:,} tokens per trial in the spec; the batch sizes' trials trained different "
        f"amounts, at most per trial: {each}"
    )


def censored_text(target: dict[str, Any]) -> str:
    """A target's batch sizes short of it: each censored point (in the fit as a lower bound) with the steps it needs
    more than and the fit's steps there, marked when the fit still gives it fewer (``cbs.json``'s ``censored_points``;
    older ones: the sizes)."""
    cens = target.get("censored_points")
    if cens is None:
        return ", ".join(str(x) for x in target.get("excluded_batch_sizes") or [])

    def one(c: dict[str, Any]) -> str:
        bound = c.get("steps_lower_bound")
        text = (
            f"{c['batch_size_sequences']} (> {bound:.3g} steps"
            if bound is not None
            else f"{c['batch_size_sequences']} (diverged"
        )
        if c.get("fit_steps") is not None:
            text += f"; fit {c['fit_steps']:.3g}" + (", contradicts" if c.get("fit_consistent") is False else "")
        return text + ")"

    return ", ".join(one(c) for c in cens)


def _late_text(late: list[float]) -> str:
    one = len(late) == 1
    return (
        f"raise budget_tokens so that batch size{'' if one else 's'} {_sizes(late)}, swept but short of this "
        f"target within {'its' if one else 'their'} budget (in the fit only as a lower bound), reach{'es' if one else ''} it"
    )


def definitions_text(
    *, tokens_per_sequence: float | None = None, reference_batch: float | None = None, unit: str = "sequences"
) -> str:
    """What ``b_crit``, ``cbs_20``, ``b_compute_overhead_20``, ``s_min`` and ``e_min`` are, with their units: the
    note printed beside ``critbatch analyze`` results and shown in the report. ``unit``: the batch sizes' unit
    (``analyze --csv``: the CSV's ``batch_size`` column, normally sequences)."""
    tok = (
        f"; x {tokens_per_sequence:g} tokens per sequence for tokens (b_crit_tokens)"
        if tokens_per_sequence
        else "; times the tokens per sequence for tokens"
    )
    b0 = f"B0 = {reference_batch:g} {unit}" if reference_batch else f"B0 the reference batch ({unit})"
    return "\n".join(
        [
            "Two definitions of the critical batch size, not comparable numbers:",
            f"  b_crit: McCandlish et al. 2018 (arXiv 1812.06162, Eq. 2.12), B_crit = E_min / S_min from the fit "
            f"S(B) = S_min + E_min / B, in {unit}{tok}. At B = b_crit a run needs twice the fewest steps and twice "
            "the fewest data (and FLOPs) to reach the target.",
            f"  cbs_20: Zhang et al. 2024 (arXiv 2410.21676), the batch whose steps to target exceed perfect linear "
            f"scaling from {b0} by 20 %; under the same fit cbs_20 = 0.2 b_crit + 1.2 B0, in {unit}.",
            f"  b_compute_overhead_20: 0.2 b_crit, in {unit}: the largest batch whose compute (tokens, FLOPs) to the "
            "target is at most 20 % above the least, since C(B)/C_min - 1 = B/b_crit.",
            "  cbs_20_ci, b_compute_overhead_20_ci: b_crit_ci's ends mapped through those two formulas (the same "
            "fit, the same level).",
            f"  s_min: the fewest optimizer steps to the target (B -> infinity); e_min: the fewest {unit} (B -> 0).",
        ]
    )


def analyze_note(result: dict[str, Any]) -> str:
    """What ``critbatch analyze`` prints beside its JSON (on stderr): the headline of each fit (one per line,
    ``group: headline`` for a CSV with groups) and :func:`definitions_text`; "" for a comparison (its
    arms' reports say it) or a result without a fit."""
    if not isinstance(result, dict) or result.get("kind") == "comparison":
        return ""
    if "status" in result:
        fits = [(None, result)]
    elif result and all(isinstance(v, dict) for v in result.values()):
        fits = [(str(k), v) for k, v in result.items()]
    else:
        return ""
    lines = [(f"{name}: " if name is not None else "") + headline(fit) for name, fit in fits]
    first = fits[0][1]
    return "\n".join(
        lines
        + [
            "",
            definitions_text(
                tokens_per_sequence=first.get("tokens_per_sequence"), reference_batch=first.get("reference_batch")
            ),
        ]
    )


def caveats(cbs: dict[str, Any]) -> list[str]:
    """What the headline interval does not cover, in words, each with the one action that would narrow it
    (``cbs.json``'s ``caveats``; the report, the CLI and the MLflow parent run's description show them)."""
    out = []
    entry = _primary_target(cbs) or {}
    seeds = {p.get("seed") for p in entry.get("points") or [] if isinstance(p, dict)}
    if len(seeds) <= 1 and cbs.get("b_crit") is not None:
        out.append(
            "One training seed: the interval carries this seed's scatter around the fit, not the spread "
            "between seeds (on the main job's model one seed moves every large batch size's steps together by "
            "12-17 %); run a second seed (seeds: [0, 1]) to have it in the interval."
        )
    opened = cbs.get("lr_brackets_open") or []
    if opened:
        which = ", ".join(f"B={e['batch_size_sequences']} ({e['side']})" for e in opened)
        out.append(
            f"Open LR brackets at {which}: the fastest trial ran at an end of the LRs tried, so those points "
            "may overstate the tuned steps and the interval does not cover that; search.precision probes an "
            "octave beyond before it stops (raise its max_trials if it stopped first)."
        )
    bounds = list(entry.get("censored_in_fit") or []) + list(entry.get("upper_bounded_in_fit") or [])
    if bounds:
        out.append(
            f"Batch sizes {', '.join(f'{b:g}' for b in sorted(bounds))} enter the fit as bounds (short of the "
            "target within their budget, or already past it at their first milestone), not as points."
        )
    if cbs.get("status") == "edge":
        out.append(
            "The interval reaches past the fitted batch sizes: its end there is an extrapolation of the "
            "hyperbola; sweep a batch size beyond that end."
        )
    if cbs.get("status") == "misfit":
        out.append("The points break the hyperbola: no interval is given; probe the small batch sizes' LRs.")
    if cbs.get("b_crit") is not None:
        out.append(
            "This b_crit is for this model, data, budget and target loss: it grows as the target loss falls "
            "and with the training tokens, so a production run's critical batch size needs a study across "
            "budgets, not this number."
        )
    return out
