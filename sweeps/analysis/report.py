"""The sweep report: PNG plots (matplotlib) and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sweeps.analysis.summary import (
    budget_text,
    censored_text,
    definitions_text,
    describe_status,
    headline,
    interval_ends_text,
    swept_range,
)
from sweeps.files import write_atomic
from sweeps.spec.result import BatchRecord, CbsResult, LocalCbsPoint, LrAtBatch, TargetFit

__all__ = ["PLOT_CAPTIONS", "make_plots", "write_report"]

#: how to read each plot of the report (its caption)
PLOT_CAPTIONS = {
    "loss_vs_flops": "Validation loss against training compute, one curve per batch size (at each milestone the lowest "
    "loss any of its trials reached); dotted: the target losses. A curve further left reaches a loss "
    "with less compute: past the critical batch size, larger batches need more FLOPs for the same loss.",
    "steps_to_target": "Optimizer steps to each target loss against batch size (points: one per batch size and seed; "
    "line: the fit S = S_min + E_min/B; dashed: b_crit). Where the points fall with slope -1, doubling "
    "the batch halves the steps (perfect scaling); where they flatten, a larger batch buys few "
    "steps. The knee between the two is b_crit, where a run takes twice the fewest steps.",
    "tokens_to_target": "Tokens to each target loss against batch size (E = B x S; line: the fit). Flat on the left: "
    "small batches need the fewest tokens (E_min); rising on the right: past b_crit (dashed) each "
    "doubling of the batch costs more tokens, and so more compute, for the same loss.",
    "b_crit_by_target": "b_crit for each target loss with its 95 % interval, the later targets (lower loss) to the "
    "right. Bars are clipped to the swept batch sizes: a triangle at a bar's end means the interval "
    "continues past the swept range (cbs.json holds the raw ends); a grey triangle alone: the knee "
    "lies above (or below) every swept batch. The critical batch size usually grows as the loss falls.",
    "b_simple": "The gradient noise scale B_simple = tr(Sigma)/|G|^2 during training, one line per batch size; dashed: "
    "the fitted b_crit. B_simple is a cheap proxy for the critical batch size (McCandlish et al. 2018); "
    "with Adam it can be far off, so the fitted b_crit is the answer.",
    "local_cbs": "The local critical batch size by branching (Merrill et al. 2025) at each branch point: the largest "
    "batch multiplier whose loss stayed within tolerance of the smaller one; it usually starts small "
    "and rises as training goes on.",
    "plan": "Time to target against data-parallel devices, one line per global batch (dotted: a batch outside the "
    "swept range, where the fit is an extrapolation); rings: each batch's knee; dashed: the overall knee. "
    "Where a line flattens, more devices buy little time.",
}


def _envelopes(records: list) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per batch size: (tokens, flops, lowest val loss over its trials at those tokens), by increasing tokens.

    The lower envelope over every trial of a batch size (completed, pruned or stopped, all seeds): the
    curve the selection rule reads steps to target from (``sweeps.analysis.targets.TARGET_RULE``). Points
    are matched by the tokens seen at each report, never by report index: two trials of one batch size
    report at different tokens when their steps differ in real tokens (fine-tuning rows of other seeds),
    and a loss is drawn only at tokens a trial reported it at."""
    by_b: dict[int, dict[float, list[float]]] = {}
    for r in records:
        pts = by_b.setdefault(r.batch_size_sequences, {})
        for i, (tok, loss) in enumerate(zip(r.tokens, r.val_loss)):
            flops = float(r.flops[i]) if i < len(r.flops) and r.flops[i] is not None else math.nan
            v = float(loss) if loss is not None else math.nan
            if tok in pts:
                pts[tok][1] = float(np.fmin(pts[tok][1], v))
            else:
                pts[tok] = [flops, v]
    out = {}
    for b, pts in by_b.items():
        if not pts:
            continue
        toks = sorted(pts)
        out[b] = (
            np.array(toks, dtype=float),
            np.array([pts[t][0] for t in toks], dtype=float),
            np.array([pts[t][1] for t in toks], dtype=float),
        )
    return out


def make_plots(out_dir: Path, analysis: CbsResult, records: list, context_length_tokens: int) -> dict[str, Path]:
    """Write the report's plots as PNG files under ``out_dir``; returns name -> path (a plot with
    nothing to show is not written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = _envelopes(records)
    cmap = plt.get_cmap("viridis")
    bs = sorted(curves)
    colors = {b: cmap(i / max(len(bs) - 1, 1)) for i, b in enumerate(bs)}
    targets = analysis.targets or []
    figures = {
        "loss_vs_flops": _loss_vs_flops(curves, colors, targets),
        "steps_to_target": _to_target(targets, "steps", context_length_tokens),
        "tokens_to_target": _to_target(targets, "tokens", context_length_tokens),
        "b_crit_by_target": _b_crit_by_target(targets),
        "b_simple": _b_simple(analysis, colors),
        "local_cbs": _local_cbs(analysis.local_cbs or []),
    }
    paths: dict[str, Path] = {}
    for name, fig in figures.items():
        if fig is not None:
            fig.tight_layout()
            paths[name] = out_dir / f"{name}.png"
            write_atomic(paths[name], lambda f, fig=fig: fig.savefig(f, dpi=110, format="png"))
            plt.close(fig)
    return paths


def _loss_vs_flops(curves: dict, colors: dict, targets: list[TargetFit]):
    """Validation loss against training FLOPs (tokens if FLOPs are unknown), one curve per batch size."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bs = sorted(curves)
    for b in bs:
        tok, flops, loss = curves[b]
        x = flops if np.all(flops > 0) else tok
        ax.plot(x, loss, marker="o", ms=3, color=colors[b], label=f"B={b}")
    for t in targets:
        if t.target_loss is not None:
            ax.axhline(t.target_loss, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs" if bs and np.all(curves[bs[0]][1] > 0) else "tokens seen")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Validation loss against compute (lower envelope of each batch size's trials)")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _to_target(targets: list[TargetFit], kind: str, T: int):
    """Steps (``kind="steps"``) or tokens to each target against batch size, with the fitted hyperbola."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    tc = plt.get_cmap("plasma")
    for i, t in enumerate(targets):
        pts = t.points or []
        if not pts:
            continue
        c = tc(i / max(len(targets) - 1, 1))
        B = np.array([p.batch_size_sequences for p in pts], dtype=float)
        S = np.array([p.steps_to_target for p in pts], dtype=float)
        y = S if kind == "steps" else S * B * T
        ax.scatter(B, y, color=c, s=18, label=f"L*={t.target_loss:.3f}")
        if t.s_min is not None and t.e_min is not None:
            grid = np.geomspace(B.min() / 1.5, B.max() * 1.5, 100)
            fit_s = t.s_min + t.e_min / grid
            ax.plot(grid, fit_s if kind == "steps" else fit_s * grid * T, color=c, lw=1)
        if t.b_crit:
            ax.axvline(t.b_crit, color=c, lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global batch size (sequences)")
    ax.set_ylabel("optimizer steps to target" if kind == "steps" else "tokens to target")
    ax.set_title(("Steps" if kind == "steps" else "Tokens") + " to target: S = S_min + E_min/B (dashed: b_crit)")
    if targets:
        ax.legend(fontsize=7)
    return fig


def _b_crit_by_target(targets: list[TargetFit]):
    """``b_crit`` per target with its interval, the bars clipped to that target's swept batch sizes (a triangle
    marks an end that continues past them), and the knees outside the swept range as grey triangles at the
    range's end; None if no target has either."""
    with_b, outside = [], []
    for t in targets:
        sw = swept_range(t.to_json_dict())
        if t.b_crit and sw:
            with_b.append((t, sw))
        elif t.status in ("above_range", "below_range") and sw:
            outside.append((t, sw))
    if not with_b and not outside:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    if with_b:
        L = np.array([t.target_loss for t, _ in with_b])
        bc = np.array([t.b_crit for t, _ in with_b], dtype=float)
        ci = [t.b_crit_ci or [None, None] for t, _ in with_b]
        raw_lo = np.array([c[0] if c[0] is not None else b for c, b in zip(ci, bc)], dtype=float)
        raw_hi = np.array([c[1] if c[1] is not None else np.inf for c in ci], dtype=float)
        sw_lo = np.array([sw[0] for _, sw in with_b], dtype=float)
        sw_hi = np.array([sw[1] for _, sw in with_b], dtype=float)
        lo, hi = np.maximum(raw_lo, sw_lo), np.minimum(raw_hi, sw_hi)
        ax.errorbar(
            L,
            bc,
            yerr=[np.clip(bc - lo, 0, None), np.clip(hi - bc, 0, None)],
            fmt="o-",
            capsize=3,
            color="C0",
            label="b_crit, 95 % interval",
        )
        up, down = raw_hi > sw_hi, raw_lo < sw_lo
        if up.any():
            ax.plot(L[up], hi[up], "^", color="C0", ms=7)
        if down.any():
            ax.plot(L[down], lo[down], "v", color="C0", ms=7)
    for t, sw in outside:
        above = t.status == "above_range"
        ax.plot([t.target_loss], [sw[1] if above else sw[0]], "^" if above else "v", color="grey", ms=8)
    all_sw = [sw for _, sw in with_b + outside]
    ax.set_ylim(min(s[0] for s in all_sw) / 1.5, max(s[1] for s in all_sw) * 1.5)
    ax.set_yscale("log", base=2)
    ax.invert_xaxis()
    ax.set_xlabel("target validation loss (lower = later in training)")
    ax.set_ylabel("b_crit (sequences), 95% CI")
    ax.set_title("Critical batch size by target loss (bars clipped to the swept range)")
    return fig


def _b_simple(analysis: CbsResult, colors: dict):
    """The gradient noise scale over training, one series per batch size; None without estimates."""
    series = [s for s in analysis.b_simple or [] if any(v is not None for v in s.b_simple or [])]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in series:
        tok = np.array(s.tokens, dtype=float)
        v = np.array([np.nan if x is None else x for x in s.b_simple or []], dtype=float)
        ax.plot(tok, v, marker=".", color=colors.get(s.batch_size_sequences), label=f"B={s.batch_size_sequences}")
    if analysis.b_crit:
        ax.axhline(analysis.b_crit, color="k", ls="--", lw=1, label=f"fitted b_crit={analysis.b_crit:.0f}")
    ax.set_yscale("log")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("B_simple (sequences)")
    ax.set_title("Gradient noise scale B_simple = tr(Sigma)/|G|^2 during training")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _local_cbs(local: list[LocalCbsPoint]):
    """The local critical batch size by branching (Merrill et al. 2025); None without branch points."""
    if not local:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = np.array([p.local_cbs_sequences for p in local], dtype=float)  # a point without k* is NaN: not drawn
    ax.plot([p.tokens_seen for p in local], sizes, "o-")
    ax.set_xlabel("tokens seen at the branch point")
    ax.set_ylabel("local CBS (sequences)")
    ax.set_title("Local critical batch size by branching (Merrill et al. 2025)")
    return fig


def _fmt_ci(ci: list | None) -> str:
    """``[lo, hi]`` of an interval (``hi`` None: unbounded, shown as ``open``); ``-`` without one."""
    if not ci:
        return "[-]"
    return "[" + ", ".join("open" if x is None else _fmt(float(x)) for x in ci) + "]"


def _extrapolated(v: Any, swept: tuple[float, float] | None) -> str:
    """A note when a batch size read off the fit (``v``, sequences) lies outside the fitted batch sizes."""
    if v is None or swept is None or swept[0] <= v <= swept[1]:
        return ""
    side = (
        f"below the smallest fitted batch size, {swept[0]:g}"
        if v < swept[0]
        else f"above the largest fitted batch size, {swept[1]:g}"
    )
    return f" ({side}: an extrapolation of the fit)"


def _with_ci(v: Any, ci: list | None) -> str:
    """A value with its interval (``21.8 [19.3, 34.3]``); ``-`` without the value."""
    return "-" if v is None else f"{_fmt(v)} {_fmt_ci(ci)}"


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.{nd}g}"
    return html.escape(str(v))


def _plan_section(output: Path) -> str:
    """The report's cluster-plan section when ``critbatch plan OUT`` has written ``OUT/plan.json``
    (and ``OUT/plots/plan.png``); empty otherwise."""
    import json

    path = output / "plan.json"
    if not path.is_file():
        return ""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        t = next(x for x in plan["targets"] if x.get("headline"))
        c, inp = plan["cluster"], plan["inputs"]
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return ""

    def row(r: dict | None, what: str) -> str:
        if not r:
            return f"<tr><td>{what}</td><td colspan=6>none within the device-hours cap</td></tr>"
        return (
            f"<tr><td>{what}</td>"
            + "".join(
                f"<td>{_fmt(x)}</td>"
                for x in (
                    r["batch_size_sequences"],
                    r["devices"],
                    r["steps_to_target"],
                    r["time_to_target_s"],
                    r["device_hours"],
                    r["comm_fraction"],
                )
            )
            + f"<td>{html.escape(str(r.get('extrapolation')))}</td></tr>"
        )

    from sweeps.analysis.plan import knee_label
    from sweeps.analysis.plan_files import plan_summary

    png = output / "plots" / "plan.png"
    img = (
        (
            f'<figure><img src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}" alt="plan">'
            f"<figcaption>{html.escape(PLOT_CAPTIONS['plan'])}</figcaption></figure>"
        )
        if png.is_file()
        else ""
    )
    return f"""<h2>Cluster plan (critbatch plan)</h2>
<p>Target loss {_fmt(t.get("target_loss"))}; up to {_fmt(c.get("devices"))} devices of {_fmt(c.get("peak_flops_per_s"))} FLOP/s
at MFU {_fmt(c.get("mfu"))}, {_fmt(c.get("bandwidth_bytes_per_s"))} bytes/s and {_fmt(c.get("latency_s"))} s latency per device,
gradient {_fmt(inp.get("gradient_bytes"))} bytes, all-reduce every {_fmt(inp.get("sync_every_steps"))} step(s),
device-hours cap {_fmt(c.get("device_hours_cap"))}. {html.escape(_capital(knee_label(t.get("knee"))))} (the knee: the fewest
devices within {_fmt(100 * (plan.get("knee_threshold") or 0))} % of the least time to target). {html.escape(plan.get("model") or "")}</p>
<p>{html.escape(_capital(plan_summary(plan)))}.</p>
<table><tr><th></th><th>B (seq)</th><th>devices</th><th>steps</th><th>time to target (s)</th><th>device-hours</th><th>comm fraction</th><th>B vs swept range</th></tr>
{row(t.get("best"), "fastest within the cap")}{row(t.get("best_inside_range"), "fastest, B inside the swept range")}</table>{img}"""


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _answer(analysis: CbsResult, T: float) -> str:
    """The report's lead: the headline sentence, the status in words, ``cbs.json``'s message, and b_crit with
    its interval ends clipped to the swept range (``< LO`` / ``> HI``)."""
    status, data = analysis.status, analysis.to_json_dict()
    swept = swept_range(data)
    lo_t, hi_t = interval_ends_text(analysis.b_crit_ci, swept)
    b = analysis.b_crit
    if b is not None:
        tokens = analysis.b_crit_tokens or b * T
        value = (
            f"b_crit = {b:.1f} sequences ({tokens:.0f} tokens), 95 % interval [{html.escape(lo_t)}, "
            f"{html.escape(hi_t)}] sequences"
        )
    elif analysis.b_crit_bound:
        value = f"b_crit {html.escape(str(analysis.b_crit_bound))} sequences (no number: the knee lies outside the swept range)"
    else:
        value = "no b_crit"
    target = f" at target loss {_fmt(analysis.target_loss)}" if analysis.target_loss is not None else ""
    primary = analysis.target(analysis.target_loss) if analysis.target_loss is not None else None
    late = (primary.excluded_batch_sizes if primary is not None else None) or []
    sw = (
        (
            f"; batch sizes {swept[0]:g} to {swept[1]:g} sequences reached the target (the range the status refers to)"
            + (
                f"; {', '.join(str(x) for x in late)} did not reach it within its budget and enter the fit only as censored "
                "points (needing more steps than their budget's)"
                if late
                else ""
            )
        )
        if swept
        else ""
    )
    message = analysis.message
    return (
        f'<p class="headline" style="font-size:1.15em"><b>{html.escape(headline(data))}</b></p>\n'
        f"<p>{value}{target}{sw}.</p>\n"
        f"<p>Status <code>{html.escape(str(status))}</code>: {html.escape(describe_status(status))}."
        + (f" Analysis message: {html.escape(_capital(message))}." if message else "")
        + "</p>"
    )


def _lr_scaling_text(analysis: CbsResult) -> str:
    """The measured LR scaling rule in one paragraph (:mod:`sweeps.analysis.lr_scaling`); empty without a fit."""
    fit, ci = analysis.lr_scaling_exponent_fit, analysis.lr_scaling_exponent_ci
    if fit is None:
        return ""
    text = f"Learning-rate scaling, measured: best LR ~ B^alpha with alpha = {fit:.2f}"
    if ci:
        rules = analysis.lr_scaling_rules_in_interval or []
        named = {"linear": "linear (1)", "sqrt": "square root (0.5)", "none": "none (0)"}
        inside = ", ".join(named.get(r, r) for r in rules) or "none of linear, square root or none"
        text += f" [{ci[0]:.2f}, {ci[1]:.2f}] (95 %); rules inside the interval: {inside}."
    null = analysis.lr_scaling_exponent_by_chance
    if null:
        text += (
            f" One trial per batch size picked at random gives {_fmt(null['mean'])} &plusmn; {_fmt(null['sd'])}: "
            "the fit is evidence for a rule only where it lies outside that spread."
        )
    return text


def _precision_text(analysis: CbsResult) -> str:
    """``search.precision`` and the off-centre LR warning, one paragraph each (empty when neither applies)."""
    out = ""
    which = ", ".join(
        f"B={e['batch_size_sequences']} {e['side']} its tried LRs" for e in analysis.lr_brackets_open or []
    )
    out += (
        (
            f"<p><b>Open LR brackets:</b> {which}: at those batch sizes the fastest trial at some target ran at an end of "
            "the LRs tried, so the optimum may lie beyond and their steps to target are overstated.</p>"
        )
        if which
        else ""
    )
    notes = "".join(f"<li>{html.escape(c)}</li>" for c in analysis.caveats or [])
    out += f"<p><b>What the interval does not cover</b></p><ul>{notes}</ul>" if notes else ""
    p = analysis.precision
    if isinstance(p, dict):

        def added(w: dict) -> str:
            adds = [
                f"B={a['batch_size_sequences']}"
                + (f" at LR {_fmt(a['lr'])}" if a.get("lr") else " (new)")
                + (f" with {a['budget_multiple']}x the tokens" if (a.get("budget_multiple") or 1) > 1 else "")
                for a in w.get("added") or []
            ]
            return f", added {', '.join(adds)}" if adds else ""

        waves = "; ".join(
            f"after {w.get('trials')} trials {_fmt(w.get('b_crit'))} {_fmt_ci(w.get('b_crit_ci'))} "
            f"at {_fmt(w.get('target_loss'))}{added(w)}"
            for w in p.get("waves") or []
        )
        out += (
            f"<p>Sweep until precise (search.precision): asked for an interval within "
            f"{_fmt(p.get('b_crit_ratio_requested'))}x, at most {p.get('max_trials')} "
            + ("full trials' worth of tokens" if p.get("reallocate_tokens") else "trials")
            + f"; stopped because <code>{html.escape(str(p.get('stopped_because')))}</code>. Waves: {html.escape(waves)}.</p>"
            + (
                f"<p>Token reallocation: after the first wave every trial ended at its first milestone at or below "
                f"the lowest target ({_fmt(p.get('stop_at_loss'))}), and batch sizes censored there ran again with "
                f"more tokens; the trials trained {_fmt(p.get('budgets_spent'))} budgets in all.</p>"
                if p.get("stop_at_loss") is not None
                else ""
            )
        )
    return out


def _best_lr_text(row: LrAtBatch | None) -> str:
    """A batch size's best LR with its bracket (the tried LRs either side; "?" where none was tried)."""
    if not row:
        return ""
    bracket = row.best_lr_bracket
    ends = "" if not bracket else " [" + ", ".join("?" if x is None else _fmt(x) for x in bracket) + "]"
    return f"{_fmt(row.best_lr)}{' (quadratic)' if row.method == 'quadratic' else ''}{ends}"


def _batch_row(p: BatchRecord, best_lr: LrAtBatch | None) -> str:
    """One row of the report's per-batch-size table."""
    to_target, at_budget = p.config_to_target or {}, p.best_config_at_budget or {}
    return (
        "<tr>"
        + "".join(
            f"<td>{_fmt(x)}</td>"
            for x in (
                p.batch_size_sequences,
                p.tokens_to_target,
                p.steps_to_target,
                p.flops_to_target,
                ", ".join(p.trial_ids_to_target or []),
                to_target.get("lr"),
                to_target.get("beta2_half_life_tokens"),
                _best_lr_text(best_lr),
                at_budget.get("lr_rule"),
                at_budget.get("lr"),
                p.loss_at_budget,
                len(p.seeds or []),
                p.trials,
                p.budget_tokens,
                p.tokens_trained,
            )
        )
        + "</tr>"
    )


def write_report(output: Path, analysis: CbsResult | dict[str, Any], records: list, spec) -> Path:
    """Write ``OUT/plots/*.png`` and a self-contained ``OUT/report.html`` (plots embedded; a cluster-plan
    section when ``OUT/plan.json`` exists) for ``analysis``, ``cbs.json``'s record (or its parsed JSON)."""
    T = spec.model.context_length_tokens
    analysis = analysis if isinstance(analysis, CbsResult) else CbsResult.model_validate(analysis)
    plots = make_plots(output / "plots", analysis, records, T)
    imgs = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}" alt="{n}">'
        f"<figcaption><b>{n.replace('_', ' ')}</b>: {html.escape(PLOT_CAPTIONS.get(n, ''))}</figcaption></figure>"
        for n, p in plots.items()
    )
    answer = _answer(analysis, T)
    lr_text = _lr_scaling_text(analysis)
    best_lr = {r.batch_size_sequences: r for r in analysis.lr_per_batch or []}
    rows = "".join(_batch_row(p, best_lr.get(p.batch_size_sequences)) for p in analysis.per_batch or [])
    trows = "".join(
        "<tr>"
        + "".join(
            f"<td>{_fmt(x)}</td>"
            for x in (
                t.target_loss,
                t.b_crit if t.b_crit is not None else t.b_crit_bound,
                *interval_ends_text(t.b_crit_ci, swept_range(t.to_json_dict())),
                _with_ci(t.cbs_20, t.cbs_20_ci),
                t.status,
                t.n_batch_sizes,
                censored_text(t.to_json_dict()),
            )
        )
        + "</tr>"
        for t in analysis.targets or []
    )
    counts = analysis.trials.to_json_dict() if analysis.trials is not None else {}
    ml = analysis.mlflow.to_json_dict() if analysis.mlflow is not None else {}
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>critbatch report: {
        html.escape(spec.name)
    }</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
figure{{display:inline-block;margin:0.5em;max-width:480px;vertical-align:top}}img{{max-width:480px}}
pre.definitions{{white-space:pre-wrap}}div.table-scroll{{overflow-x:auto;max-width:100%}}</style></head><body>
<h1>critbatch report: {html.escape(spec.name)}</h1>
{answer}
<p>Sweep <code>{html.escape(str(analysis.sweep_id))}</code>.
<strong>Size data parallelism with b_crit</strong> (above): a global batch of b_crit takes twice the fewest steps and tokens; past it, doubling the batch saves at most a quarter of the steps.
From the same fit: the batch with 20% compute overhead (0.2 b_crit), for the fewest tokens: {
        _with_ci(analysis.b_compute_overhead_20, analysis.b_compute_overhead_20_ci)
    } sequences{_extrapolated(analysis.b_compute_overhead_20, swept_range(analysis.to_json_dict()))};
another definition, Zhang et al. 2024's 20% CBS (reference batch {_fmt(analysis.reference_batch)}): {
        _with_ci(analysis.cbs_20, analysis.cbs_20_ci)
    } sequences
(95 % intervals: b_crit's mapped through each, so the 20% CBS's looks narrower only by its constant 1.2 B0);
S_min = {_fmt(analysis.s_min)} steps {_fmt_ci(analysis.s_min_ci)}, E_min = {_fmt(analysis.e_min)} sequences {
        _fmt_ci(analysis.e_min_ci)
    } (95 % intervals).
{lr_text}</p>
{_precision_text(analysis)}
<p>How the points are made: {html.escape(str(analysis.target_rule or ""))}. Interval: {
        html.escape(str(analysis.interval_method or ""))
    }.</p>
<p>Trials: {", ".join(f"{k.lower()} {v}" for k, v in counts.items())} (planned {analysis.trials_planned}).
{budget_text(spec.budget_tokens, [p.to_json_dict() for p in analysis.per_batch or []])}; FLOPs per token {
        _fmt(analysis.flops_per_token)
    }.</p>
<h2>What the numbers are</h2><pre class="definitions">{
        html.escape(
            definitions_text(tokens_per_sequence=analysis.tokens_per_sequence, reference_batch=analysis.reference_batch)
        )
    }</pre>
<h2>Per target loss</h2><p>Interval ends past a target's swept batch sizes are shown as &lt; smallest / &gt; largest
(cbs.json keeps the raw values).</p><div class="table-scroll"><table><tr><th>target loss</th><th>b_crit</th><th>CI low</th><th>CI high</th><th>20% CBS [95 %]</th><th>status</th><th>batch sizes that reached it</th><th>batch sizes short of it within their budget (in the fit as needing more than N steps; the fit's steps there)</th></tr>{
        trows
    }</table></div>
<h2>Per batch size</h2><p>Steps to the headline target: the minimum over the batch size's trials; the best configuration at the budget is shown separately.</p>
<div class="table-scroll"><table><tr><th>B (seq)</th><th>tokens to target</th><th>steps to target</th><th>FLOPs to target</th><th>trial(s) to target</th><th>its LR</th><th>its beta2 half-life (tok)</th><th>best LR [the tried LRs either side; ? where none was tried]</th>
<th>best at budget: LR rule</th><th>LR</th><th>loss at budget</th><th>seeds</th><th>trials</th><th>token budget</th><th>tokens trained</th></tr>{
        rows
    }</table></div>
<h2>Plots</h2>{imgs}{_plan_section(output)}
<p>MLflow: tracking URI <code>{html.escape(str(ml.get("tracking_uri")))}</code>, experiment {
        html.escape(str(ml.get("experiment_id")))
    },
parent run <code>{html.escape(str(ml.get("parent_run_id")))}</code>. Open with <code>mlflow ui --backend-store-uri {
        html.escape(str(ml.get("tracking_uri")))
    }</code>.</p>
</body></html>"""
    path = output / "report.html"
    write_atomic(path, page)
    return path
