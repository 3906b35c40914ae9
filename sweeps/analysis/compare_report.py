"""A comparison's ``report.html``: the arms side by side (table, steps-to-target plot, b_crit plot).

Loads matplotlib (Agg); imported on its own, like :mod:`sweeps.analysis.report`.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sweeps.files import write_atomic
from sweeps.spec.result import ArmTargetFit, ComparisonResult

__all__ = ["write_comparison_report"]


def _primary_row(arm_targets: list[ArmTargetFit], i: int) -> ArmTargetFit:
    """An arm's fit at the primary target (index ``i``), or an empty one for an arm without targets."""
    return arm_targets[i] if arm_targets else ArmTargetFit()


def _steps_plot(comparison: ComparisonResult, path: Path) -> None:
    """Steps to the primary target against global batch size, each arm's points and fitted S(B) = S_min + E_min/B."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    i = comparison.primary_index()
    for arm in comparison.arms:
        row = _primary_row(arm.targets, i)
        pts = row.points or []
        if not pts:
            continue
        b = np.array([p.batch_size_sequences for p in pts], float)
        s = np.array([p.steps_to_target for p in pts], float)
        line = ax.loglog(b, s, "o", label=f"{arm.name} ({arm.sync}, {arm.optimizer})")[0]
        if row.s_min is not None and row.e_min is not None:
            grid = np.geomspace(b.min(), b.max(), 50)
            ax.loglog(grid, row.s_min + row.e_min / grid, "-", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("global batch size (sequences)")
    ax.set_ylabel("optimizer steps to target")
    ax.set_title(
        f"steps to loss {comparison.target_loss:.4g} (points: measured; lines: fit)"
        if comparison.target_loss is not None
        else "steps to target"
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    plt.close(fig)


def _b_crit_plot(comparison: ComparisonResult, path: Path) -> None:
    """b_crit with its 95 % interval per arm, one group per target loss (open interval ends drawn to the frame)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    n = len(comparison.arms)
    for j, arm in enumerate(comparison.arms):
        xs, ys, lo, hi = [], [], [], []
        for i, row in enumerate(arm.targets):
            b_crit = row.b_crit
            if b_crit is None:
                continue
            ci = row.b_crit_ci or [None, None]
            xs.append(i + (j - (n - 1) / 2) * 0.12)
            ys.append(b_crit)
            lo.append(b_crit - (ci[0] if ci[0] is not None else b_crit * 0.01))
            hi.append((ci[1] if ci[1] is not None else b_crit * 100) - b_crit)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=arm.name)
    ax.set_yscale("log")
    ax.set_xticks(range(len(comparison.targets)), [f"{t:.4g}" for t in comparison.targets])
    ax.set_xlabel("target validation loss")
    ax.set_ylabel("b_crit (sequences), 95 % interval")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no arm resolves b_crit at these targets", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    plt.close(fig)


def _cell(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}g}"
    if isinstance(v, list):
        return "[" + ", ".join("open" if x is None else f"{x:.{nd}g}" for x in v) + "]"
    return html.escape(str(v))


def write_comparison_report(output: Path, comparison: ComparisonResult) -> Path:
    """Write ``OUT/report.html`` (and ``OUT/plots/compare_*.png``) for a comparison; returns the HTML path."""
    plots = output / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    _steps_plot(comparison, plots / "compare_steps_to_target.png")
    _b_crit_plot(comparison, plots / "compare_b_crit.png")
    head = (
        "<tr><th>arm</th><th>sync</th><th>H</th><th>replicas</th><th>optimizer</th><th>b_crit (seq)</th>"
        "<th>95 % interval</th><th>status</th><th>S_min [95 %]</th><th>syncs_min [95 %]</th><th>E_min, tokens [95 %]</th>"
        "<th>optimizer state (bytes/param)</th><th>comm bytes/step</th><th>sweep</th></tr>"
    )
    i = comparison.primary_index()
    rows = []
    for arm in comparison.arms:
        r = _primary_row(arm.targets, i)
        rows.append(
            f"<tr><td>{_cell(arm.name)}</td><td>{_cell(arm.sync)}</td><td>{_cell(arm.sync_every_steps)}</td>"
            f"<td>{_cell(arm.replicas)}</td><td>{_cell(arm.optimizer)}</td><td>{_cell(r.b_crit)}</td>"
            f"<td>{_cell(r.b_crit_ci)}</td><td>{_cell(r.status)}</td>"
            f"<td>{_cell(r.s_min)} {_cell(r.s_min_ci)}</td>"
            f"<td>{_cell(r.syncs_min)} {_cell(r.syncs_min_ci)}</td>"
            f"<td>{_cell(r.e_min_tokens)} {_cell(r.e_min_tokens_ci)}</td>"
            f"<td>{_cell(arm.optimizer_state_bytes_per_param)}</td><td>{_cell(arm.comm_bytes_per_step)}</td>"
            f"<td><a href='arms/{html.escape(arm.name)}/report.html'>{_cell(arm.sweep_id)}</a></td></tr>"
        )
    summary = "".join(f"<li>{html.escape(s)}</li>" for s in comparison.summary)
    loss = comparison.target_loss
    text = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(str(comparison.name))}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{padding:2px 8px;border-bottom:1px solid #ddd}}</style>
</head><body><h1>Comparison {html.escape(comparison.comparison_id or "")}</h1>
<p>Every arm is analysed at the reference arm ({html.escape(comparison.reference_arm)})'s target losses
{html.escape(", ".join(f"{t:.4g}" for t in comparison.targets))}; the table is at {_cell(loss, 4)}.
Synchronizations to target are steps / H (ddp: one all-reduce per step). Where the 95 % intervals overlap, this
sweep does not tell the arms apart.</p>
<ul>{summary}</ul>
<table>{head}{"".join(rows)}</table>
<p><img src="plots/compare_steps_to_target.png"> <img src="plots/compare_b_crit.png"></p>
</body></html>"""
    path = output / "report.html"
    write_atomic(path, text)
    return path
