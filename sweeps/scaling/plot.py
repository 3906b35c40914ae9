"""The study's picture: each member's critical batch size (and B_opt) with its interval against its token budget,
on log axes, with the fitted law, its band, and the prediction at the production budget."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_study"]


def _prediction_label(extrapolation_factor: float) -> str:
    """The prediction's legend entry: how far beyond the largest budget it lies, or at what fraction of it."""
    if extrapolation_factor > 1:
        return f"prediction, {extrapolation_factor:.3g}x beyond the largest budget"
    return f"prediction, at {extrapolation_factor:.3g}x the largest budget"


def plot_study(result: dict[str, Any], path: Path) -> Path:
    """Draw ``scale.json``'s ``result`` (:func:`sweeps.scaling.study.scale_result`) into ``path`` (PNG): b_crit
    against D on the left, B_opt (its ``b_opt`` section) on the right, each on log axes with the members'
    intervals, the fitted law with its band and the prediction point; a B_opt member without an interval
    (``edge``) is drawn as its one-sided bound, and a panel without a law says why.

    The band is the law's prediction interval at each budget (its own uncertainty plus, with three or more
    members, the scatter of one budget around the law), at the result's level.

    Raises:
        WriteFailed: the file could not be written (``sweeps.files``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sweeps.files import write_atomic

    b_opt = result.get("b_opt")
    fig, axes = plt.subplots(1, 2 if b_opt else 1, figsize=(12.0 if b_opt else 6.4, 4.6), squeeze=False)
    _draw_law(axes[0][0], result)
    if b_opt:
        _draw_law(axes[0][1], b_opt)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path


def _draw_law(ax: Any, result: dict[str, Any]) -> None:
    """One quantity's members, law, band and prediction on ``ax`` (``result``: ``scale.json`` or its ``b_opt``)."""
    from sweeps.scaling.study import log_band

    quantity = result["quantity"]
    members = [m for m in result["members"] if m["batch_size_ci_sequences"]]
    bounds = [(m, _bound_sequences(m)) for m in result["members"] if m.get("bound")]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training tokens D")
    ax.set_ylabel(f"{quantity} (sequences)")
    ax.set_title(f"{quantity}: status {result['status']}", fontsize=10)
    d_all = [m["tokens"] for m in result["members"]]
    pred = result.get("prediction")
    if members:
        d = np.array([m["tokens"] for m in members])
        b = np.array([m["batch_size_sequences"] for m in members])
        lo = np.array([m["batch_size_ci_sequences"][0] for m in members])
        hi = np.array([m["batch_size_ci_sequences"][1] for m in members])
        ax.errorbar(d, b, yerr=[b - lo, hi - b], fmt="o", color="k", capsize=3, label="members (their intervals)")
    for i, (m, value) in enumerate(bounds):
        ax.plot(
            [m["tokens"]],
            [value],
            marker="v" if m["bound"]["side"] == "below" else "^",
            color="C1",
            linestyle="none",
            label=f"{m['status']}: B_opt {m['bound']['side']} this (its bound, else the end of the range)"
            if i == 0
            else None,
        )
    if result.get("gamma") is not None:
        d_max = max(max(d_all), pred["tokens"]) if pred else max(d_all)
        grid = np.exp(np.linspace(math.log(min(d_all) / 1.5), math.log(d_max * 1.5), 200))
        q = result["quantile"]
        mean, sd = log_band(result, grid)
        ax.fill_between(
            grid,
            np.exp(mean - q * sd),
            np.exp(mean + q * sd),
            alpha=0.2,
            color="C0",
            label=f"law, {100 * result['level']:g} % prediction band",
        )
        ax.plot(
            grid,
            np.exp(mean),
            color="C0",
            label=f"{quantity} ~ D^{result['gamma']:.2f} [{result['gamma_ci'][0]:.2f}, {result['gamma_ci'][1]:.2f}]",
        )
    if pred:
        p_lo, p_hi = pred["interval"]
        p_b = pred[quantity]
        ax.errorbar(
            [pred["tokens"]],
            [p_b],
            yerr=[[p_b - p_lo], [p_hi - p_b]],
            fmt="D",
            color="C3",
            capsize=3,
            label=_prediction_label(pred["extrapolation_factor"]),
        )
    if result.get("absent"):
        ax.text(0.02, 0.98, _wrap(result["answer"], 70), transform=ax.transAxes, fontsize=7, va="top")
        ax.margins(y=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right" if result.get("absent") else "upper left")


def _bound_sequences(member: dict[str, Any]) -> float:
    """Where an ``edge`` B_opt member is drawn: its one-sided bound, else the swept batch size it lies beyond."""
    if member["bound"].get("sequences"):
        return float(member["bound"]["sequences"])
    sizes = [float(b) for b in member["losses_at_budget"]]
    return min(sizes) if member["bound"]["side"] == "below" else max(sizes)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)[:6])
