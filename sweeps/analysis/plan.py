"""From a finished sweep's fit to a cluster plan: devices, communication and hours to a target loss.

With data parallelism the global batch is ``B = micro-batch x accumulation steps x N`` workers, so more
devices mean a larger batch, and past ``b_crit`` a larger batch buys few steps. For a fitted
``S(B) = S_min + E_min / B`` (McCandlish et al. 2018, arXiv 1812.06162, Eqs. 2.11-2.12; ``S`` in optimizer
steps, ``E_min`` in sequences) and a cluster, every (global batch ``B`` sequences, data-parallel degree
``N`` devices) pair gets, per optimizer step:

* compute ``t_c = C_tok * B * T / (N * P * MFU)`` seconds (``C_tok`` training FLOPs per token, ``T``
  tokens per sequence, ``P`` peak FLOP/s per device, ``MFU`` the model-FLOPs utilisation, assumed constant
  in ``N`` and ``B``);
* an all-reduce of the gradient (``G`` bytes = parameters x bytes per gradient element), ring model
  ``t_ar = 2 (N - 1) / N * G / bw + 2 (N - 1) * alpha`` seconds (``bw`` bytes/s per device, ``alpha`` s per
  message; zero for ``N = 1``): reduce-scatter then all-gather, each ``N - 1`` steps of ``G / N`` bytes
  (Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  J. Parallel Distrib. Comput. 69(2); Thakur, Rabenseifner and Gropp 2005, "Optimization of collective
  communication operations in MPICH", Int. J. High Perform. Comput. Appl. 19(1));
* with local SGD / DiLoCo (sync every ``H`` steps) one all-reduce per ``H`` steps: ``t_ar / H`` per step;
  the steps to target must then come from that mode's own sweep (its own ``cbs.json``);
* step time ``t_c + t_ar / H`` (no overlap of compute and communication, the default) or
  ``max(t_c, t_ar / H)`` (``overlap=True``, perfect overlap: a lower bound).

Then time to target ``S(B) * step time`` seconds and ``N * time / 3600`` device-hours. Not modelled:
pipeline or tensor parallelism, MFU changing with the per-device batch, stragglers, and any ``B`` far
outside the swept batch sizes (flagged in each row: the fit is an extrapolation there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sweeps.errors import InvalidInput
from sweeps.spec.result import TargetFit

__all__ = [
    "KNEE_THRESHOLD",
    "ClusterSpec",
    "default_batch_grid",
    "device_grid",
    "extrapolation",
    "knee_devices",
    "knee_label",
    "plan_rows",
    "plan_target",
    "ring_allreduce_s",
    "steps_to_target",
]

KNEE_THRESHOLD = 0.05
"""The knee: the smallest device count whose time to target is within 5 % of the minimum over device counts."""


class ClusterSpec(BaseModel):
    """A homogeneous data-parallel cluster (``--cluster cluster.yaml`` or the command-line options).

    Every size carries its unit; unknown fields are refused (a pydantic error names the field).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: int = Field(..., ge=1, description="the most devices (data-parallel workers) to plan for")
    peak_flops_per_s: float = Field(..., gt=0, description="peak FLOP/s per device at the training precision")
    mfu: float = Field(0.4, gt=0, le=1, description="model-FLOPs utilisation, assumed constant in N and B")
    bandwidth_bytes_per_s: float = Field(..., gt=0, description="all-reduce bandwidth per device, bytes/s")
    latency_s: float = Field(5e-6, ge=0, description="per-message latency of one ring step, seconds")
    device_hours_cap: float | None = Field(None, gt=0, description="the most device-hours a plan may use")
    micro_batch_size_sequences_max: int | None = Field(
        None, ge=1, description="the most sequences per device per forward/backward (sets accumulation steps)"
    )
    overlap: bool = Field(False, description="overlap the all-reduce with compute (step time = max, not sum)")


def ring_allreduce_s(n_devices: int, gradient_bytes: float, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """Seconds for one ring all-reduce of ``gradient_bytes`` over ``n_devices``.

    ``2 (N - 1) / N * bytes / bandwidth + 2 (N - 1) * latency``; 0 for ``N = 1`` (Patarasuk and Yuan 2009,
    JPDC 69(2); Thakur, Rabenseifner and Gropp 2005, IJHPCA 19(1)).

    Raises:
        ValueError: ``n_devices < 1``.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    if n_devices == 1:
        return 0.0
    n = float(n_devices)
    return 2.0 * (n - 1.0) / n * gradient_bytes / bandwidth_bytes_per_s + 2.0 * (n - 1.0) * latency_s


def steps_to_target(batch_size_sequences: float, s_min: float, e_min: float) -> float:
    """``S(B) = S_min + E_min / B`` optimizer steps (McCandlish et al. 2018, Eqs. 2.11-2.12); ``B`` and
    ``E_min`` in sequences."""
    return s_min + e_min / batch_size_sequences


def extrapolation(batch_size_sequences: float, swept: tuple[float, float] | None) -> str | None:
    """``"inside"`` the swept batch sizes, ``"near"`` (within a factor 2 outside), ``"far"``, or None
    when the swept range is unknown."""
    if swept is None:
        return None
    lo, hi = swept
    if lo <= batch_size_sequences <= hi:
        return "inside"
    if lo / 2.0 <= batch_size_sequences <= 2.0 * hi:
        return "near"
    return "far"


def _pow2_floor(x: float) -> int:
    return 2 ** max(0, math.floor(math.log2(max(x, 1.0))))


def _pow2_ceil(x: float) -> int:
    return 2 ** max(0, math.ceil(math.log2(max(x, 1.0))))


def default_batch_grid(swept: tuple[float, float] | None, devices: int, b_crit: float | None = None) -> list[int]:
    """Powers of 2 from the one at or below the smallest swept batch to 8x the largest (and at least the
    device count and 4 b_crit), in sequences; without a swept range, 1 to 8x ``max(devices, b_crit)``."""
    lo, hi = swept if swept is not None else (1.0, float(max(devices, b_crit or 1.0)))
    top = _pow2_ceil(max(8.0 * hi, float(devices), 4.0 * (b_crit or 0.0)))
    b, out = _pow2_floor(lo), []
    while b <= top:
        out.append(b)
        b *= 2
    return out


def device_grid(devices: int) -> list[int]:
    """Powers of 2 up to ``devices``, and ``devices`` itself."""
    out, n = [], 1
    while n <= devices:
        out.append(n)
        n *= 2
    if out[-1] != devices:
        out.append(devices)
    return out


def plan_rows(
    *,
    s_min: float,
    e_min: float,
    tokens_per_sequence: float,
    flops_per_token: float,
    gradient_bytes: float,
    cluster: ClusterSpec,
    batch_sizes_sequences: Sequence[int],
    sync_every_steps: int = 1,
    swept: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per (global batch ``B`` sequences, data-parallel devices ``N``), ``N <= B``, ``N`` in
    :func:`device_grid`: steps to target, seconds per step (compute, all-reduce, total), time to target
    (s), device-hours, whether within the cap, the micro-batch and accumulation steps per device, and
    whether ``B`` extrapolates the fit (the formulas: this module's docstring).

    Raises:
        InvalidInput: non-positive ``s_min``/``e_min`` sums, sizes or ``sync_every_steps < 1`` (the user's
            files and flags).
    """
    if sync_every_steps < 1:
        raise InvalidInput(f"sync_every_steps must be >= 1, got {sync_every_steps}")
    if s_min < 0 or e_min < 0 or s_min + e_min <= 0:
        raise InvalidInput(f"the fit needs s_min >= 0, e_min >= 0, not both 0 (got {s_min}, {e_min})")
    if tokens_per_sequence <= 0 or flops_per_token <= 0 or gradient_bytes < 0:
        raise InvalidInput("tokens_per_sequence and flops_per_token must be positive, gradient_bytes >= 0")
    c = cluster
    rows = []
    for b in sorted(set(int(x) for x in batch_sizes_sequences)):
        steps = steps_to_target(b, s_min, e_min)
        for n in device_grid(c.devices):
            if n > b:
                continue
            per_device = b / n
            mb_max = c.micro_batch_size_sequences_max
            accum = math.ceil(per_device / mb_max) if mb_max else 1
            compute_s = flops_per_token * b * tokens_per_sequence / (n * c.peak_flops_per_s * c.mfu)
            allreduce_s = ring_allreduce_s(n, gradient_bytes, c.bandwidth_bytes_per_s, c.latency_s)
            comm_s = allreduce_s / sync_every_steps
            step_s = max(compute_s, comm_s) if c.overlap else compute_s + comm_s
            time_s = steps * step_s
            hours = n * time_s / 3600.0
            rows.append(
                {
                    "batch_size_sequences": b,
                    "batch_size_tokens": b * tokens_per_sequence,
                    "devices": n,
                    "sequences_per_device": per_device,
                    "grad_accum_steps": accum,
                    "steps_to_target": steps,
                    "compute_s_per_step": compute_s,
                    "allreduce_s": allreduce_s,
                    "comm_s_per_step": comm_s,
                    "step_s": step_s,
                    "time_to_target_s": time_s,
                    "device_hours": hours,
                    "within_cap": c.device_hours_cap is None or hours <= c.device_hours_cap,
                    "comm_fraction": comm_s / (compute_s + comm_s) if compute_s + comm_s > 0 else 0.0,
                    "extrapolation": extrapolation(b, swept),
                }
            )
    return rows


def knee_devices(times_by_devices: dict[int, float], threshold: float = KNEE_THRESHOLD) -> dict[str, Any] | None:
    """The smallest device count whose time is within ``threshold`` (a fraction) of the minimum over
    device counts: past it more devices buy less than ``threshold`` of the time. ``still_falling``: the
    minimum is at the largest device count given, so the knee may lie beyond it. None if empty."""
    if not times_by_devices:
        return None
    best = min(times_by_devices.values())
    n = min(k for k, t in times_by_devices.items() if t <= (1.0 + threshold) * best)
    n_best = min(k for k, t in times_by_devices.items() if t == best)
    return {
        "devices": n,
        "time_to_target_s": times_by_devices[n],
        "min_time_to_target_s": best,
        "devices_at_min": n_best,
        "threshold": threshold,
        "still_falling": n_best == max(times_by_devices),
    }


def knee_label(knee: dict[str, Any] | None) -> str:
    """The knee (:func:`knee_devices`) in words. A knee at the largest device count while time is still falling
    there is no knee: more devices would still help, so it reads "time still falling at the cap"."""
    if not knee:
        return "no knee: no device count fits the device-hours cap"
    n, thr = knee["devices"], 100 * knee["threshold"]
    if knee.get("still_falling") and n == knee.get("devices_at_min"):
        return f"no knee: time still falling at the cap ({n} devices)"
    if knee.get("still_falling"):
        return (
            f"knee: {n} devices (time still falls up to the cap of {knee['devices_at_min']} devices, by less than "
            f"{thr:g} %)"
        )
    return f"knee: {n} device{'s' if n != 1 else ''} (more buy less than {thr:g} % of the time)"


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in rows if r["within_cap"]]
    return min(ok, key=lambda r: (r["time_to_target_s"], r["device_hours"])) if ok else None


def plan_target(
    fit: TargetFit,
    *,
    tokens_per_sequence: float,
    flops_per_token: float,
    gradient_bytes: float,
    cluster: ClusterSpec,
    batch_sizes_sequences: Sequence[int] | None = None,
    sync_every_steps: int = 1,
    swept: tuple[float, float] | None = None,
    threshold: float = KNEE_THRESHOLD,
) -> dict[str, Any]:
    """The plan for one fitted target (``fit``: a ``cbs.json`` target or an ``analyze --csv`` result, with
    ``s_min``, ``e_min`` and optionally ``target_loss``, ``b_crit``, ``status``).

    Returns ``rows`` (:func:`plan_rows`), ``best`` (the row with the least time to target within the
    device-hours cap; None if no row fits), ``best_inside_range`` (the same over batch sizes inside the
    swept range), ``knee`` (:func:`knee_devices` over the least time at each device count, any batch
    within the cap) and ``knee_by_batch`` (per batch size, its own knee over device counts).

    Raises:
        InvalidInput: a fit without ``s_min``/``e_min`` (its ``status`` says why), or bad sizes.
    """
    if fit.s_min is None or fit.e_min is None:
        raise InvalidInput(f"no fit for target {fit.target_loss} (status {fit.status})")
    s_min, e_min = float(fit.s_min), float(fit.e_min)
    grid = (
        list(batch_sizes_sequences) if batch_sizes_sequences else default_batch_grid(swept, cluster.devices, fit.b_crit)
    )
    rows = plan_rows(
        s_min=s_min,
        e_min=e_min,
        tokens_per_sequence=tokens_per_sequence,
        flops_per_token=flops_per_token,
        gradient_bytes=gradient_bytes,
        cluster=cluster,
        batch_sizes_sequences=grid,
        sync_every_steps=sync_every_steps,
        swept=swept,
    )
    by_n: dict[int, float] = {}
    for r in rows:
        if r["within_cap"]:
            by_n[r["devices"]] = min(by_n.get(r["devices"], math.inf), r["time_to_target_s"])
    knee_by_batch = {}
    for b in sorted({r["batch_size_sequences"] for r in rows}):
        k = knee_devices(
            {r["devices"]: r["time_to_target_s"] for r in rows if r["batch_size_sequences"] == b}, threshold
        )
        if k is not None:
            knee_by_batch[str(b)] = k
    inside = [r for r in rows if r["extrapolation"] in ("inside", None)]
    return {
        "target_loss": fit.target_loss,
        "status": fit.status,
        "s_min": s_min,
        "e_min": e_min,
        "b_crit": fit.b_crit,
        "b_crit_bound": fit.b_crit_bound,
        "swept_batch_sizes": list(swept) if swept else None,
        "best": _best(rows),
        "best_inside_range": _best(inside) if swept else None,
        "knee": knee_devices(by_n, threshold),
        "knee_by_batch": knee_by_batch,
        "rows": rows,
    }
