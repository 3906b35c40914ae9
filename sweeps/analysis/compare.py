"""A comparison's arms side by side: each arm's critical batch size at the same target losses.

A comparison (a spec with ``arms``, :mod:`sweeps.run.compare`) runs every arm as a sweep of its own.
Each arm's own ``cbs.json`` picks its targets from its own curves, so two arms' headline numbers may
be at different losses. Here every arm is re-analysed at the *reference arm's* (the first arm's)
targets, so that at each target the fits compare the same thing: steps to reach that loss at each
global batch size (McCandlish et al. 2018, Eq. 2.11: ``S(B) = S_min + E_min/B``, ``b_crit = E_min/S_min``).

Synchronizations to target: a ``ddp`` arm synchronizes every optimizer step (one gradient
all-reduce); a ``local_sgd`` or ``diloco`` arm every ``H`` steps, so its synchronizations to target
are ``S(B)/H``. Dividing by a constant leaves the fit's shape (and ``b_crit``, and its interval)
unchanged and scales ``S_min`` by ``1/H``: ``syncs_min = S_min/H``.

Pure: reads nothing, imports neither Ray nor MLflow.
"""

from __future__ import annotations

import math
from typing import Any

from sweeps.spec.result import CbsResult, TargetFit

__all__ = ["ArmResult", "compare_arms", "overlap"]

#: what each arm row carries from its sweep (besides the fits)
ARM_FIELDS = (
    "sync",
    "sync_every_steps",
    "replicas",
    "optimizer",
    "optimizer_state_bytes_per_param",
    "comm_bytes_per_step",
    "comm_time_s",
    "tokens_per_s",
    "status",
    "sweep_id",
)

ArmResult = dict[str, Any]


def overlap(a: list[float | None] | None, b: list[float | None] | None) -> bool | None:
    """Whether two intervals ``[low, high]`` overlap (an open end, None, reaches to 0 or infinity).

    Returns None when either interval is missing.
    """
    if not a or not b:
        return None
    lo_a, hi_a = (a[0] if a[0] is not None else 0.0), (a[1] if a[1] is not None else math.inf)
    lo_b, hi_b = (b[0] if b[0] is not None else 0.0), (b[1] if b[1] is not None else math.inf)
    return lo_a <= hi_b and lo_b <= hi_a


def _scaled(ci: list[float | None] | None, factor: float) -> list[float | None] | None:
    """An interval ``[lo, hi]`` (``hi`` None: unbounded) times ``factor``."""
    return [x * factor if x is not None else None for x in ci] if ci else None


def _target_row(fit: TargetFit, every: int, tokens_per_sequence: float) -> dict[str, Any]:
    """One arm at one target: the fit, its points with synchronizations, and ``syncs_min``."""
    s_min, e_min = fit.s_min, fit.e_min
    points = []
    for p in fit.points or []:
        points.append(
            {
                "batch_size_sequences": p.batch_size_sequences,
                "seed": p.seed,
                "steps_to_target": p.steps_to_target,
                "tokens_to_target": p.tokens_to_target,
                "syncs_to_target": p.steps_to_target / every,
                "trial_id": p.trial_id,
            }
        )
    return {
        "target_loss": fit.target_loss,
        "b_crit": fit.b_crit,
        "b_crit_ci": fit.b_crit_ci,
        "b_crit_bound": fit.b_crit_bound,
        "b_crit_tokens": fit.b_crit * tokens_per_sequence if fit.b_crit is not None else None,
        "status": fit.status,
        "message": fit.message if "message" in fit.model_fields_set else "",
        "s_min": s_min,
        "s_min_ci": fit.s_min_ci,
        "e_min": e_min,
        "e_min_ci": fit.e_min_ci,
        "e_min_tokens": e_min * tokens_per_sequence if e_min is not None else None,
        "e_min_tokens_ci": _scaled(fit.e_min_ci, tokens_per_sequence),
        "syncs_min": s_min / every if s_min is not None else None,
        "syncs_min_ci": _scaled(fit.s_min_ci, 1.0 / every),
        "n_batch_sizes": fit.n_batch_sizes,
        "points": points,
    }


def compare_arms(arms: list[tuple[str, dict[str, Any], CbsResult | None]]) -> dict[str, Any]:
    """Set the arms' critical batch sizes side by side at the reference arm's targets.

    Args:
        arms: ``(arm name, info, analysis)`` in the spec's order; the first is the reference. ``info``
            holds :data:`ARM_FIELDS` (``sync``, ``sync_every_steps`` H (1 for ddp), ``replicas``,
            ``optimizer``, measured medians over the arm's trials, ``status``, ``sweep_id``);
            ``analysis`` is :func:`sweeps.analysis.analyze_trials` of the arm's trials at the common
            targets (``targets`` with ``s_min``, ``e_min``, ``b_crit``, ``b_crit_ci``, ``points``), or None
            when the arm has no trials to analyse.

    Returns:
        ``{"reference_arm", "targets" (losses), "target_loss" (the reference's primary),
        "arms": [{name, info..., "targets": [row per target: b_crit with b_crit_ci; s_min, e_min (also in
        tokens) and syncs_min = s_min/H, each with its ``*_ci`` (profile likelihood,
        :func:`sweeps.analysis.fit.interval_s_min_e_min`); points with steps, tokens and syncs to target]}], "by_target": [{target_loss,
        "arms": {name: {b_crit, b_crit_ci, status}}, "intervals_overlap_reference": {name: bool|None},
        "b_crit_ratio_to_reference": {name: float|None}}], "summary": [one sentence per arm]}``.

    Raises:
        ValueError: fewer than 2 arms.
    """
    if len(arms) < 2:
        raise ValueError(f"a comparison needs at least 2 arms, got {len(arms)}")
    ref_name, _, ref_analysis = arms[0]
    targets = [t.target_loss for t in ref_analysis.targets or []] if ref_analysis is not None else []
    primary = ref_analysis.target_loss if ref_analysis is not None else None
    rows = []
    for name, info, analysis in arms:
        every = int(info.get("sync_every_steps") or 1)
        tps = (
            float(analysis.tokens_per_sequence or analysis.context_length_tokens or 1) if analysis is not None else 1.0
        )
        fits = {t.target_loss: t for t in analysis.targets or []} if analysis is not None else {}
        rows.append(
            {
                "name": name,
                **{k: info.get(k) for k in ARM_FIELDS},
                "targets": [
                    _target_row(fits[t], every, tps)
                    if t in fits
                    else {
                        "target_loss": t,
                        "b_crit": None,
                        "b_crit_ci": None,
                        "status": "not_analysed",
                        "message": "the arm has no trials to analyse",
                    }
                    for t in targets
                ],
            }
        )
    by_target = []
    for i, t in enumerate(targets):
        ref_row = rows[0]["targets"][i]
        entry = {
            "target_loss": t,
            "primary": t == primary,
            "arms": {},
            "intervals_overlap_reference": {},
            "b_crit_ratio_to_reference": {},
        }
        for r in rows:
            row = r["targets"][i]
            entry["arms"][r["name"]] = {k: row.get(k) for k in ("b_crit", "b_crit_ci", "b_crit_bound", "status")}
            if r["name"] == ref_name:
                continue
            entry["intervals_overlap_reference"][r["name"]] = overlap(row.get("b_crit_ci"), ref_row.get("b_crit_ci"))
            both = row.get("b_crit") is not None and ref_row.get("b_crit") is not None
            entry["b_crit_ratio_to_reference"][r["name"]] = row["b_crit"] / ref_row["b_crit"] if both else None
        by_target.append(entry)
    return {
        "kind": "comparison",
        "reference_arm": ref_name,
        "targets": targets,
        "target_loss": primary,
        "arms": rows,
        "by_target": by_target,
        "summary": _summary(rows, by_target, ref_name),
    }


def _fmt_ci(ci: list[float | None] | None) -> str:
    if not ci:
        return "[-]"
    return "[" + ", ".join("open" if x is None else f"{x:.3g}" for x in ci) + "]"


def _summary(rows: list[dict[str, Any]], by_target: list[dict[str, Any]], ref_name: str) -> list[str]:
    """One sentence per non-reference arm at the primary target: moved or not, and whether the intervals overlap."""
    prim = next((e for e in by_target if e["primary"]), by_target[0] if by_target else None)
    if prim is None:
        return ["the reference arm has no target to compare at"]
    ref = prim["arms"][ref_name]
    out = []
    for r in rows[1:]:
        a = prim["arms"][r["name"]]
        head = (
            f"{r['name']}: b_crit {a['b_crit']:.3g} {_fmt_ci(a['b_crit_ci'])}"
            if a["b_crit"] is not None
            else f"{r['name']}: b_crit not resolved ({a['status']}{', ' + a['b_crit_bound'] if a.get('b_crit_bound') else ''})"
        )
        ref_txt = (
            f"{ref['b_crit']:.3g} {_fmt_ci(ref['b_crit_ci'])}"
            if ref["b_crit"] is not None
            else f"not resolved ({ref['status']})"
        )
        ov = prim["intervals_overlap_reference"].get(r["name"])
        ratio = prim["b_crit_ratio_to_reference"].get(r["name"])
        if a["b_crit"] is None and ref["b_crit"] is None:
            verdict = "neither arm resolves b_crit inside the swept batch sizes: this sweep cannot compare them"
        elif ov:
            verdict = "the 95 % intervals overlap: this sweep does not show that it moves b_crit"
        else:
            verdict = "the 95 % intervals do not overlap" if ov is False else "no interval to compare"
        out.append(
            f"{head} vs {ref_name} {ref_txt} at loss {prim['target_loss']:.4g}"
            f"{f' (ratio {ratio:.2f})' if ratio is not None else ''}; {verdict}"
        )
    return out
