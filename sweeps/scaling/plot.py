"""The study's picture: each member's critical batch size with its interval against its token budget, on log
axes, with the fitted law, its band, and the prediction at the production budget."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_study"]


def plot_study(result: dict[str, Any], path: Path) -> Path:
    """Draw ``scale.json``'s ``result`` (:func:`sweeps.scaling.study.scale_result`) into ``path`` (PNG).

    The band is the law's prediction interval at each budget (its own uncertainty plus, with three or more
    members, the scatter of one budget around the law), at the result's level.

    Raises:
        WriteFailed: the file could not be written (``sweeps.files``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sweeps.files import write_atomic

    members = result["members"]
    d = np.array([m["tokens"] for m in members])
    b = np.array([m["batch_size_sequences"] for m in members])
    lo = np.array([m["batch_size_ci_sequences"][0] for m in members])
    hi = np.array([m["batch_size_ci_sequences"][1] for m in members])
    pred = result.get("prediction")
    d_max = max(d.max(), pred["tokens"]) if pred else d.max()
    grid = np.exp(np.linspace(math.log(d.min() / 1.5), math.log(d_max * 1.5), 200))
    from sweeps.scaling.study import log_band

    q = result["quantile"]
    mean, sd = log_band(result, grid)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
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
        label=f"{result['quantity']} ~ D^{result['gamma']:.2f} [{result['gamma_ci'][0]:.2f}, {result['gamma_ci'][1]:.2f}]",
    )
    ax.errorbar(d, b, yerr=[b - lo, hi - b], fmt="o", color="k", capsize=3, label="members (their intervals)")
    if pred:
        p_lo, p_hi = pred["interval"]
        p_b = pred[result["quantity"]]
        ax.errorbar(
            [pred["tokens"]],
            [p_b],
            yerr=[[p_b - p_lo], [p_hi - p_b]],
            fmt="D",
            color="C3",
            capsize=3,
            label=f"prediction, {pred['extrapolation_factor']:.3g}x beyond the largest budget",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training tokens D")
    ax.set_ylabel(f"{result['quantity']} (sequences)")
    ax.set_title(f"status {result['status']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path
