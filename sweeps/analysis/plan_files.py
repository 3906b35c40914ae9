"""``critbatch plan``'s files: its inputs (a sweep folder, its ``cbs.json``, or an ``analyze --csv``
result), ``OUT/plan.json`` and the plot ``OUT/plots/plan.png`` (the cost model: :mod:`sweeps.analysis.plan`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sweeps.analysis.plan import KNEE_THRESHOLD, ClusterSpec, knee_label, plan_target
from sweeps.errors import InvalidInput
from sweeps.files import write_atomic
from sweeps.spec.result import CbsResult, TargetFit

__all__ = [
    "MODEL_TEXT",
    "load_plan_inputs",
    "make_plan",
    "plan_summary",
    "plot_plan",
    "spec_sync_every_steps",
    "write_plan",
]

MODEL_TEXT = (
    "time to target = S(B) x step time, S(B) = s_min + e_min/B (McCandlish et al. 2018, Eqs. 2.11-2.12); "
    "step time = compute + all-reduce/H (max of the two with overlap); compute = flops_per_token x B x T / "
    "(N x peak x MFU); ring all-reduce = 2(N-1)/N x gradient_bytes/bandwidth + 2(N-1) x latency, 0 for N=1 "
    "(Patarasuk and Yuan 2009; Thakur, Rabenseifner and Gropp 2005); device-hours = N x time / 3600. "
    "MFU constant in N and B; data parallelism only (no pipeline or tensor parallelism)."
)
_PARAMS_FROM_FLOPS = (
    "flops_per_token / 6 (Kaplan et al. 2020, C ~ 6N: approximate, it counts the attention-score "
    "and logit FLOPs and misses an untied input embedding; give --params for the exact count)"
)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"plan: file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"plan: cannot read {path} as JSON: {exc}") from None


def spec_sync_every_steps(spec_path: Path) -> int | None:
    """``resources.sync.every_steps`` of a sweep's ``spec.yaml`` (local SGD / DiLoCo), read defensively:
    None when the file, the field or a positive integer value is absent."""
    try:
        data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    sync = ((data or {}).get("resources") or {}).get("sync") if isinstance(data, dict) else None
    if not isinstance(sync, dict):
        return None
    h = sync.get("every_steps")
    return int(h) if isinstance(h, int) and not isinstance(h, bool) and h >= 1 else None


def _swept_of(target: dict[str, Any], fallback: tuple[float, float] | None) -> tuple[float, float] | None:
    bs = [float(p["batch_size_sequences"]) for p in target.get("points") or [] if "batch_size_sequences" in p]
    return (min(bs), max(bs)) if bs else fallback


def load_plan_inputs(
    path: str | Path,
    *,
    flops_per_token: float | None = None,
    params: float | None = None,
    tokens_per_sequence: float | None = None,
    swept: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Read what the plan needs from ``path``: a sweep folder (its ``cbs.json`` and ``spec.yaml``), a
    ``cbs.json``, or the JSON ``critbatch analyze --csv`` prints (one fit, or one per group).

    Returns ``fits`` (list of dicts with ``s_min``, ``e_min``, ``target_loss``, ``status``, ``b_crit``,
    ``swept``: the batch sizes of the fit's points, or ``swept``), ``headline_target_loss``,
    ``tokens_per_sequence``, ``flops_per_token`` (training FLOPs per token), ``n_params`` and
    ``n_params_source``, ``spec_sync_every_steps`` (of the ``spec.yaml`` beside a ``cbs.json``),
    ``out_dir`` (the sweep folder when ``path`` is one, else None).
    The keyword arguments override the file's values (``params``: parameters whose gradients are
    all-reduced; without it, ``cbs.json``'s ``n_params`` or ``flops_per_token / 6``).

    Raises:
        InvalidInput: missing or unreadable files, no usable fit, a comparison's ``cbs.json`` (its arms are
            planned one by one, from ``OUT/arms/NAME``), or an ``analyze --csv`` result
            without ``--flops-per-token``, ``--params`` and ``--tokens-per-sequence`` (each missing one named).
    """
    p = Path(path)
    out_dir = None
    spec_h = None
    if p.is_dir():
        if not (p / "cbs.json").is_file():
            raise InvalidInput(f"plan: {p} is a folder without cbs.json (not a finished sweep's output)")
        out_dir, spec_h = p, spec_sync_every_steps(p / "spec.yaml")
        p = p / "cbs.json"
    elif p.name == "cbs.json":
        spec_h = spec_sync_every_steps(p.parent / "spec.yaml")
    data = _read_json(p)
    if not isinstance(data, dict):
        raise InvalidInput(f"plan: {p} is not a JSON object (expected cbs.json or an analyze --csv result)")
    if data.get("kind") == "comparison":
        arms = [str(a.get("name")) for a in data.get("arms") or [] if isinstance(a, dict)]
        where = p.parent / "arms"
        raise InvalidInput(
            f"plan: {p} is a comparison of arms {arms}: plan one arm's sweep, each with its own fit "
            f"and sync period, e.g. critbatch plan {where / (arms[0] if arms else 'NAME')}"
        )
    is_cbs = "targets" in data or "per_batch" in data
    if is_cbs:
        try:
            cbs = CbsResult.model_validate(data)
        except ValidationError as exc:
            raise InvalidInput(f"plan: {p} is not a cbs.json this version reads: {exc}") from None
        per_batch = [float(r.batch_size_sequences) for r in cbs.per_batch or []]
        fallback = swept or ((min(per_batch), max(per_batch)) if per_batch else None)
        raw = [t.to_json_dict() for t in cbs.targets or []] or [data]
        fits = [dict(t, swept=swept or _swept_of(t, fallback)) for t in raw]
        headline = cbs.target_loss
        tps = tokens_per_sequence or cbs.tokens_per_sequence or cbs.context_length_tokens
        fpt = flops_per_token or cbs.flops_per_token
        n_params, n_src = (
            (params, "--params") if params else ((cbs.n_params, "cbs.json n_params") if cbs.n_params else (None, None))
        )
    else:
        if "s_min" in data or "status" in data:
            fits = [dict(data, swept=swept)]
        elif data and all(isinstance(v, dict) for v in data.values()):
            fits = [dict(v, swept=swept, group=k) for k, v in data.items()]
        else:
            raise InvalidInput(f"plan: {p} is neither a cbs.json nor a critbatch analyze result")
        headline = None
        missing = [
            name
            for name, v in (
                ("--flops-per-token", flops_per_token),
                ("--params", params),
                ("--tokens-per-sequence", tokens_per_sequence),
            )
            if not v
        ]
        if missing:
            raise InvalidInput(f"plan: {p} is an analyze --csv result, which holds no model: give {', '.join(missing)}")
        tps, fpt, n_params, n_src = tokens_per_sequence, flops_per_token, params, "--params"
    if not fpt or not tps:
        raise InvalidInput(
            f"plan: {p} has no flops_per_token or tokens_per_sequence: give --flops-per-token and --tokens-per-sequence"
        )
    if n_params is None:
        n_params, n_src = float(fpt) / 6.0, _PARAMS_FROM_FLOPS
    for name, v in (("flops per token", fpt), ("tokens per sequence", tps), ("parameters", n_params)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise InvalidInput(f"plan: {name} must be a positive number, got {v!r}")
    usable = [f for f in fits if f.get("s_min") is not None and f.get("e_min") is not None]
    if not usable:
        raise InvalidInput(
            f"plan: {p} holds no fitted target (status: "
            f"{', '.join(str(f.get('status')) for f in fits)}); nothing to plan"
        )
    return {
        "source": str(p),
        "fits": fits,
        "headline_target_loss": headline,
        "tokens_per_sequence": float(tps),
        "flops_per_token": float(fpt),
        "n_params": float(n_params),
        "n_params_source": n_src,
        "spec_sync_every_steps": spec_h,
        "out_dir": out_dir,
    }


def make_plan(
    inputs: dict[str, Any],
    cluster: ClusterSpec,
    *,
    grad_bytes_per_param: float = 4.0,
    sync_every_steps: int | None = None,
    batch_sizes_sequences: Sequence[int] | None = None,
    threshold: float = KNEE_THRESHOLD,
) -> dict[str, Any]:
    """The plan (what ``plan.json`` holds) for every fitted target of ``inputs`` (:func:`load_plan_inputs`).

    ``sync_every_steps``: local SGD / DiLoCo sync period ``H`` (default: the sweep spec's
    ``resources.sync.every_steps``, else 1, fully synchronous). Targets without a fit are listed
    under ``skipped`` with their status.
    """
    spec_h = inputs.get("spec_sync_every_steps")
    h = sync_every_steps or spec_h or 1
    h_src = "--sync-every-steps" if sync_every_steps else ("spec resources.sync.every_steps" if spec_h else "default")
    notes = []
    if h > 1 and not spec_h:
        notes.append(
            f"H={h} but the fit comes from a fully synchronous sweep: local SGD's own steps to target "
            "(a sweep with resources.sync.every_steps) are usually more; this plan uses the synchronous fit"
        )
    elif spec_h and h != spec_h:
        notes.append(f"the fit comes from a sweep synchronised every {spec_h} steps; this plan uses H={h}")
    if spec_h:
        notes.append(
            "the fit comes from a local SGD / DiLoCo sweep at its own replica count "
            "(resources.workers_per_trial), which the plan does not model: it applies that fit at every "
            "device count; a synchronisation all-reduces the parameters (local SGD) or their deltas "
            "(DiLoCo), counted at --grad-bytes-per-param (4: float32)"
        )
    if inputs["n_params_source"] not in ("--params", "cbs.json n_params"):
        notes.append(f"parameter count from {inputs['n_params_source']}")
    gradient_bytes = inputs["n_params"] * grad_bytes_per_param
    targets, skipped = [], []
    for f in inputs["fits"]:
        if f.get("s_min") is None or f.get("e_min") is None:
            skipped.append(
                {"target_loss": f.get("target_loss"), "status": f.get("status"), "message": f.get("message")}
            )
            continue
        t = plan_target(
            TargetFit.model_validate(f),
            tokens_per_sequence=inputs["tokens_per_sequence"],
            flops_per_token=inputs["flops_per_token"],
            gradient_bytes=gradient_bytes,
            cluster=cluster,
            batch_sizes_sequences=batch_sizes_sequences,
            sync_every_steps=h,
            swept=f.get("swept"),
            threshold=threshold,
        )
        if "group" in f:
            t["group"] = f["group"]
        t["headline"] = (
            inputs.get("headline_target_loss") is not None and f.get("target_loss") == inputs["headline_target_loss"]
        )
        targets.append(t)
    if targets and not any(t["headline"] for t in targets):
        targets[0]["headline"] = True
    return {
        "source": inputs["source"],
        "model": MODEL_TEXT,
        "knee_threshold": threshold,
        "inputs": {
            "tokens_per_sequence": inputs["tokens_per_sequence"],
            "flops_per_token": inputs["flops_per_token"],
            "n_params": inputs["n_params"],
            "n_params_source": inputs["n_params_source"],
            "grad_bytes_per_param": grad_bytes_per_param,
            "gradient_bytes": gradient_bytes,
            "sync_every_steps": h,
            "sync_every_steps_source": h_src,
        },
        "cluster": cluster.model_dump(),
        "targets": targets,
        "skipped": skipped,
        "notes": notes,
    }


def plot_plan(plan: dict[str, Any], path: Path) -> Path | None:
    """Time to target against device count for the headline target, one line per batch size, each
    line's knee marked (a ring) and the overall knee a dashed line; None if there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = next((x for x in plan["targets"] if x.get("headline")), None)
    if t is None or not t["rows"]:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    bs = sorted({r["batch_size_sequences"] for r in t["rows"]})
    scale, unit = (3600.0, "hours") if max(r["time_to_target_s"] for r in t["rows"]) >= 3600 else (1.0, "seconds")
    cmap = plt.get_cmap("viridis")
    for i, b in enumerate(bs):
        rows = [r for r in t["rows"] if r["batch_size_sequences"] == b]
        c = cmap(i / max(len(bs) - 1, 1))
        ls = "-" if rows[0]["extrapolation"] in ("inside", None) else ":"
        ax.plot(
            [r["devices"] for r in rows],
            [r["time_to_target_s"] / scale for r in rows],
            ls,
            marker=".",
            color=c,
            label=f"B={b}",
        )
        k = t["knee_by_batch"].get(str(b))
        if k:
            ax.plot([k["devices"]], [k["time_to_target_s"] / scale], "o", mfc="none", mec=c, ms=9)
    if t.get("knee"):
        ax.axvline(t["knee"]["devices"], color="k", ls="--", lw=1, label=knee_label(t["knee"]))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("data-parallel devices N")
    ax.set_ylabel(f"time to target ({unit})")
    tl = t.get("target_loss")
    ax.set_title(
        f"Time to target{f' L*={tl:.3f}' if tl is not None else ''} vs devices (dotted: B outside the swept range)",
        fontsize=9,
    )
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    plt.close(fig)
    return path


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def _row_text(r: dict[str, Any]) -> str:
    where = {
        "inside": "inside the swept range",
        "near": "just outside the swept range (within a factor 2)",
        "far": "far outside the swept range: an extrapolation of the fit",
    }.get(r.get("extrapolation") or "")
    n = r["devices"]
    return (
        f"B={r['batch_size_sequences']} sequences on {n} device{'s' if n != 1 else ''}, "
        f"{_duration(r['time_to_target_s'])} to target ({r['device_hours']:.3g} device-hours, {100 * r['comm_fraction']:.0f} % communication"
        + (f", B {where}" if where else "")
        + ")"
    )


def plan_summary(plan: dict[str, Any]) -> str:
    """The plan (what :func:`make_plan` returns) in one line: for the headline target, the fastest (batch,
    devices) within the caps, the fastest with the batch inside the swept range when that differs, and the
    knee over devices (:func:`~sweeps.analysis.plan.knee_label`)."""
    t = next((x for x in plan.get("targets") or [] if x.get("headline")), None)
    if t is None:
        return (
            "plan: no fitted target to plan for ("
            + ", ".join(f"{s.get('target_loss')}: {s.get('status')}" for s in plan.get("skipped") or [])
            + ")"
        )
    c = plan.get("cluster") or {}
    tl = t.get("target_loss")
    head = f"plan for target loss {tl:.4g}" if isinstance(tl, (int, float)) else "plan"
    head += f" on up to {c.get('devices')} devices" if c.get("devices") else ""
    best, inside = t.get("best"), t.get("best_inside_range")
    if best is None:
        return f"{head}: no (batch, devices) pair fits the device-hours cap of {c.get('device_hours_cap')}"
    text = f"{head}: fastest {_row_text(best)}"
    if inside is not None and inside is not best and inside != best:
        text += f"; with B inside the swept range: {_row_text(inside)}"
    return f"{text}; {knee_label(t.get('knee'))}"


def write_plan(out_dir: Path, plan: dict[str, Any]) -> dict[str, Path | None]:
    """Write ``out_dir/plan.json`` and ``out_dir/plots/plan.png``; returns their paths (the plot None if
    nothing to plot)."""
    from sweeps.analysis.result import finite_json

    p = out_dir / "plan.json"
    write_atomic(p, json.dumps(finite_json(plan), indent=2))
    return {"plan": p, "plot": plot_plan(plan, out_dir / "plots" / "plan.png")}
