"""The critical-batch-size analysis: steps and tokens to a target loss, the hyperbola fit, error bars.

For a target loss ``L*``, each batch size ``B`` (with its best tuned hyperparameters) needs ``S(B)``
optimizer steps and ``E(B) = B * S(B)`` sequences to first reach ``L*``. McCandlish et al. 2018
(arXiv 1812.06162, Eq. 2.11) model the trade-off as ``(S/S_min - 1)(E/E_min - 1) = 1``, i.e.

    S(B) = S_min + E_min / B,          E(B) = E_min + S_min * B,

and define the critical batch size ``b_crit = E_min / S_min`` (Eq. 2.12): at ``B = b_crit`` a run
needs twice the minimum steps and twice the minimum data. The compute overhead over the minimum
is ``B / b_crit``, so the batch with 20 % overhead is ``0.2 * b_crit``; Zhang et al. 2024
(arXiv 2410.21676) define the CBS as the batch whose steps exceed linear scaling from a reference
batch ``B0`` by 20 %, which under this model is ``0.2 * b_crit + 1.2 * B0`` (methodology note
section 4.1). The fit minimises squared residuals in ``log S`` with ``S_min, E_min >= 0``
(methodology section 2.4), and a residual bootstrap gives the confidence interval.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from scipy.optimize import minimize_scalar

from sweeps.errors import InvalidInput

__all__ = [
    "HyperbolaFit",
    "fit_hyperbola",
    "cbs_20",
    "tokens_to_target",
    "bootstrap_b_crit",
    "choose_targets",
    "analyze_trials",
    "analyze_points",
    "analyze_csv",
    "TrialRecord",
]


@dataclass(frozen=True)
class HyperbolaFit:
    """``S(B) = s_min + e_min / B`` fitted in log space.

    Attributes:
        s_min: minimum optimizer steps (B -> infinity).
        e_min: minimum sequences (B -> 0), in the unit of B.
        b_crit: ``e_min / s_min`` in the unit of B (``inf`` if ``s_min == 0``).
        rms_log_residual: root-mean-square residual of ``log S``.
    """

    s_min: float
    e_min: float
    b_crit: float
    rms_log_residual: float

    def steps(self, b: np.ndarray | float) -> np.ndarray | float:
        return self.s_min + self.e_min / np.asarray(b, dtype=float)


def fit_hyperbola(batch_sizes: Sequence[float], steps: Sequence[float]) -> HyperbolaFit:
    """Fit ``S = S_min + E_min/B`` (McCandlish et al. 2018, Eq. 2.11) by least squares in ``log S``.

    Minimises ``sum_i (log S_i - log(S_min + E_min/B_i))^2`` over ``S_min, E_min >= 0``. Writing
    ``E_min = b_crit * S_min``, the optimal ``log S_min`` for a given ``b_crit`` is the mean of
    ``log S_i - log(1 + b_crit/B_i)``, so the fit is a one-dimensional search over ``log b_crit``
    (a grid, then Brent's bounded method), with the limits ``b_crit -> 0`` (``E_min = 0``) and
    ``b_crit -> inf`` (``S_min = 0``) compared explicitly.

    Args:
        batch_sizes: ``B`` per point (> 0), any unit (sequences or tokens).
        steps: steps to target per point (> 0).

    Raises:
        ValueError: fewer than 2 distinct batch sizes, or non-positive values.
    """
    B = np.asarray(batch_sizes, dtype=float)
    S = np.asarray(steps, dtype=float)
    if B.shape != S.shape or B.ndim != 1:
        raise ValueError("batch_sizes and steps must be 1-D and of equal length")
    if len(np.unique(B)) < 2:
        raise ValueError("need at least 2 distinct batch sizes to fit S = S_min + E_min/B")
    if np.any(B <= 0) or np.any(S <= 0) or not (np.all(np.isfinite(S)) and np.all(np.isfinite(B))):
        raise ValueError("batch sizes and steps must be positive and finite")
    y = np.log(S)

    def profile(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = y[None, :] - np.log1p(np.exp(u)[:, None] / B[None, :])
        m = z.mean(axis=1)
        return ((z - m[:, None]) ** 2).sum(axis=1), m

    lo_u, hi_u = math.log(B.min()) - 9.0, math.log(B.max()) + 9.0
    grid = np.linspace(lo_u, hi_u, 361)
    obj, _ = profile(grid)
    i = int(np.argmin(obj))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    r = minimize_scalar(lambda u: float(profile(np.array([u]))[0][0]), bounds=(a, b), method="bounded",
                        options={"xatol": 1e-10})
    u_best = float(r.x)
    obj_best, m_best = profile(np.array([u_best]))
    candidates = [(float(obj_best[0]), float(np.exp(m_best[0])), float(np.exp(m_best[0] + u_best)))]
    # limits: E_min = 0 (b_crit -> 0) and S_min = 0 (b_crit -> inf)
    candidates.append((float(((y - y.mean()) ** 2).sum()), float(np.exp(y.mean())), 0.0))
    w = y + np.log(B)
    candidates.append((float(((w - w.mean()) ** 2).sum()), 0.0, float(np.exp(w.mean()))))
    cost, s_min, e_min = min(candidates, key=lambda c: c[0])
    b_crit = e_min / s_min if s_min > 0 else math.inf
    rms = math.sqrt(cost / len(B))
    return HyperbolaFit(s_min=s_min, e_min=e_min, b_crit=b_crit, rms_log_residual=rms)


def cbs_20(b_crit: float, reference_batch: float) -> float:
    """Zhang et al. (2024) critical batch size: steps 20 % above linear scaling from ``B0``.

    Under ``S = S_min + E_min/B``: ``B* = 0.2 * b_crit + 1.2 * B0`` (methodology note section 4.1).
    """
    return 0.2 * b_crit + 1.2 * reference_batch


def tokens_to_target(tokens: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """Tokens at which a loss curve first reaches ``target``.

    Interpolates linearly in ``log(tokens)`` between the last milestone above the target and the
    first one at or below it (methodology section 11.2). A curve already at or below the target at
    its first milestone returns that milestone's tokens (an upper bound). None if never reached.
    """
    prev_t, prev_l = None, None
    for t, l in zip(tokens, losses):
        if l is None or not math.isfinite(l):
            return None
        if l <= target:
            if prev_t is None or prev_l is None or prev_l == l:
                return float(t)
            w = (prev_l - target) / (prev_l - l)
            return float(math.exp(math.log(prev_t) + w * (math.log(t) - math.log(prev_t))))
        prev_t, prev_l = t, l
    return None


def _b_crit_many(B: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Vectorised profile fit of ``b_crit`` for many resampled ``log S`` rows ``Y [m, n]``.

    The same objective as :func:`fit_hyperbola`, minimised over ``log b_crit`` by a coarse grid and
    four rounds of local refinement (resolution ~1e-5 in ``log b_crit``).
    """
    lo_u, hi_u = math.log(B.min()) - 9.0, math.log(B.max()) + 9.0

    def prof(U: np.ndarray) -> np.ndarray:
        z = Y[:, None, :] - np.log1p(np.exp(U)[:, :, None] / B[None, None, :])
        return ((z - z.mean(axis=2, keepdims=True)) ** 2).sum(axis=2)

    U = np.broadcast_to(np.linspace(lo_u, hi_u, 181), (Y.shape[0], 181))
    step = (hi_u - lo_u) / 180
    rows = np.arange(Y.shape[0])
    for _ in range(4):
        centre = U[rows, np.argmin(prof(U), axis=1)]
        U = centre[:, None] + np.linspace(-step, step, 41)[None, :]
        step /= 20
    obj = prof(U)
    i = np.argmin(obj, axis=1)
    u, o = U[rows, i], obj[rows, i]
    o_zero = ((Y - Y.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    W = Y + np.log(B)[None, :]
    o_inf = ((W - W.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    bc = np.exp(u)
    bc = np.where(o_zero <= o, 0.0, bc)
    return np.where((o_inf <= o) & (o_inf < o_zero), np.inf, bc)


def bootstrap_b_crit(
    batch_sizes: Sequence[float], steps: Sequence[float], n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Confidence interval of ``b_crit`` by a residual bootstrap of the log-space fit.

    Residuals of ``log S`` are leverage-adjusted (``r_i / sqrt(1 - h_ii)`` from the fit's Jacobian,
    then centred; Davison and Hinkley 1997, section 6.3) and resampled with replacement over all
    points (every seed of every batch size); each resample is refitted. Returns the percentile
    interval at ``level``; an upper bound of ``inf`` means the data do not bound ``b_crit``.

    Raises:
        ValueError: as :func:`fit_hyperbola`.
    """
    B = np.asarray(batch_sizes, dtype=float)
    S = np.asarray(steps, dtype=float)
    fit = fit_hyperbola(B, S)
    fitted_s = np.maximum(fit.steps(B), 1e-300)
    fitted = np.log(fitted_s)
    J = np.stack([1.0 / fitted_s, (1.0 / B) / fitted_s], axis=1)
    H = J @ np.linalg.pinv(J.T @ J) @ J.T
    h = np.clip(np.diag(H), 0.0, 0.99)
    r = (np.log(S) - fitted) / np.sqrt(1.0 - h)
    r = r - r.mean()
    rng = np.random.default_rng(seed)
    out = _b_crit_many(B, fitted[None, :] + rng.choice(r, size=(n_boot, len(B)), replace=True))
    lo, hi = np.percentile(out, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


# ---- trials -> points -------------------------------------------------------------------------------


@dataclass
class TrialRecord:
    """One trial as the analysis sees it: config, status and its milestone curve."""

    trial_id: str
    batch_size_sequences: int
    seed: int
    group_id: str
    status: str  # COMPLETED | DIVERGED | FAILED | PRUNED | STOPPED
    hyperparameters: dict[str, Any]
    tokens: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    b_simple: list[float | None] = field(default_factory=list)
    #: the equal-compute scheduler's annotation of its last report (``sweeps.scheduler.RESULT_KEYS``:
    #: ``rung_decisions``, and ``pruned``, ``pruned_rung``, ``pruned_at_flops`` if it was pruned); empty without pruning
    pruning: dict[str, Any] = field(default_factory=dict)

    @property
    def final_loss(self) -> float | None:
        if self.status != "COMPLETED" or not self.val_loss:
            return None
        v = self.val_loss[-1]
        return v if v is not None and math.isfinite(v) else None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _best_groups(trials: list[TrialRecord]) -> dict[int, list[TrialRecord]]:
    """Per batch size, the trials (all seeds) of the configuration with the lowest mean final loss."""
    by_group: dict[tuple[int, str], list[TrialRecord]] = {}
    for t in trials:
        by_group.setdefault((t.batch_size_sequences, t.group_id), []).append(t)
    best: dict[int, tuple[float, list[TrialRecord]]] = {}
    for (b, _), ts in by_group.items():
        finals = [t.final_loss for t in ts if t.final_loss is not None]
        if not finals:
            continue
        m = float(np.mean(finals))
        if b not in best or m < best[b][0]:
            best[b] = (m, [t for t in ts if t.final_loss is not None])
    return {b: v[1] for b, v in sorted(best.items())}


def choose_targets(best: dict[int, list[TrialRecord]], n_targets: int = 4) -> list[float]:
    """Target losses reached by most batch sizes, above every curve's first milestone.

    The lowest target is the loss reached by at least ``max(3, ceil(0.7 n))`` batch sizes (their best
    curve, mean over seeds); the others are spaced evenly up to halfway to the highest loss any
    best curve shows at its first milestone. Returned in decreasing order.
    """
    if not best:
        return []
    mins, firsts = [], []
    for ts in best.values():
        curve = np.nanmean(np.array([t.val_loss for t in ts], dtype=float), axis=0)
        mins.append(float(np.nanmin(curve)))
        firsts.append(float(curve[0]))
    n_min = min(len(mins), max(3, math.ceil(0.7 * len(mins))))
    lo = sorted(mins)[n_min - 1] + 1e-4
    hi = min(firsts) - 1e-4
    if hi <= lo:
        return [lo]
    top = lo + 0.5 * (hi - lo)
    return [float(x) for x in np.linspace(top, lo, n_targets)]


def analyze_points(
    batch_sizes: Sequence[float], steps: Sequence[float], reference_batch: float, *, n_boot: int = 0, seed: int = 0
) -> dict[str, Any]:
    """Fit one set of (batch size, steps to target) points and describe the knee.

    Returns a dict with ``s_min``, ``e_min``, ``b_crit``, ``cbs_20``, ``b_compute_overhead_20``,
    ``status`` (``ok``; ``edge``: fewer than 2 batch sizes on one side of the knee;
    ``below_range``/``above_range``: the knee lies outside the swept batch sizes;
    ``too_few_points``), ``message``, ``n_points``, ``rms_log_residual`` and, with ``n_boot``,
    ``b_crit_ci``. ``b_crit`` is None when the knee is outside the range.
    """
    B = [float(b) for b in batch_sizes]
    distinct = sorted(set(B))
    out: dict[str, Any] = {"n_points": len(B), "reference_batch": reference_batch}
    if len(distinct) < 3:
        out.update(status="too_few_points", b_crit=None, s_min=None, e_min=None, cbs_20=None,
                   b_compute_overhead_20=None, b_crit_ci=None,
                   message=f"only {len(distinct)} batch size(s) reached the target: the fit needs at least 3")
        return out
    fit = fit_hyperbola(B, steps)
    out.update(s_min=fit.s_min, e_min=fit.e_min, rms_log_residual=fit.rms_log_residual)
    lo_b, hi_b = distinct[0], distinct[-1]
    if fit.b_crit < lo_b:
        out.update(status="below_range", b_crit=None, b_crit_bound=f"< {lo_b:g}", cbs_20=None, b_compute_overhead_20=None,
                   message=f"the knee lies below the smallest batch size ({lo_b:g}): every swept batch is past the critical batch size")
    elif fit.b_crit > hi_b:
        out.update(status="above_range", b_crit=None, b_crit_bound=f"> {hi_b:g}", cbs_20=None, b_compute_overhead_20=None,
                   message=f"the knee lies above the largest batch size ({hi_b:g}): steps still scale almost perfectly there")
    else:
        below = sum(1 for b in distinct if b <= fit.b_crit)
        above = sum(1 for b in distinct if b >= fit.b_crit)
        status = "ok" if below >= 2 and above >= 2 else "edge"
        out.update(status=status, b_crit=fit.b_crit, cbs_20=cbs_20(fit.b_crit, reference_batch),
                   b_compute_overhead_20=0.2 * fit.b_crit,
                   message="" if status == "ok" else "the knee is near the edge of the swept range (fewer than 2 batch sizes on one side)")
    if n_boot:
        lo, hi = bootstrap_b_crit(B, steps, n_boot=n_boot, seed=seed)
        out["b_crit_ci"] = [lo, hi if math.isfinite(hi) else None]
    return out


def analyze_trials(
    trials: list[TrialRecord],
    *,
    context_length_tokens: int,
    reference_batch: float,
    flops_per_token: float | None = None,
    targets: list[float] | None = None,
    n_boot: int = 1000,
    tokens_per_sequence: float | None = None,
) -> dict[str, Any]:
    """The sweep's critical batch size from its trials (the content of ``cbs.json``).

    ``tokens_per_sequence`` is the number of real (counted) tokens one sequence of the batch holds:
    the context length for packed pretraining (the default), the mean non-padding tokens per row for
    padded fine-tuning. Steps to target = tokens to target / (B * tokens_per_sequence), and
    ``b_crit_tokens`` = ``b_crit`` * tokens_per_sequence.

    For each target loss, the best configuration of each batch size (lowest mean final validation
    loss over seeds) gives one point per seed: steps to target = tokens to target / (B * T).

    Returns a dict with the primary (lowest) target's ``b_crit`` (sequences), ``b_crit_tokens``,
    ``b_crit_ci``, ``cbs_20``, ``b_compute_overhead_20``, ``s_min``, ``e_min``, ``target_loss``,
    ``status``, ``message``; ``targets`` (one entry per target); ``per_batch`` (each batch size's best
    configuration, loss at the budget, tokens and steps to the primary target); and
    ``b_simple`` (each batch size's noise-scale series).
    """
    T = float(tokens_per_sequence) if tokens_per_sequence else context_length_tokens
    best = _best_groups(trials)
    counts = {s: sum(1 for t in trials if t.status == s) for s in ("COMPLETED", "DIVERGED", "FAILED", "PRUNED", "STOPPED")}
    result: dict[str, Any] = {"trials": counts, "reference_batch": reference_batch,
                              "context_length_tokens": context_length_tokens, "tokens_per_sequence": T}
    if not best:
        result.update(status="no_completed_trials", b_crit=None, b_crit_tokens=None, cbs_20=None, s_min=None, e_min=None,
                      target_loss=None, targets=[], per_batch=[], b_simple=[],
                      message="no trial completed: there is nothing to analyse")
        return result
    tlist = sorted(targets, reverse=True) if targets else choose_targets(best)
    per_target = []
    for target in tlist:
        bs, ss = [], []
        for b, ts in best.items():
            for t in ts:
                tok = tokens_to_target(t.tokens, t.val_loss, target)
                if tok is not None:
                    bs.append(b)
                    ss.append(tok / (b * T))
        entry = {"target_loss": target, **analyze_points(bs, ss, reference_batch, n_boot=n_boot)}
        entry["points"] = [{"batch_size_sequences": b, "steps_to_target": s} for b, s in zip(bs, ss)]
        per_target.append(entry)
    # the headline: the lowest target whose knee is identified, else the lowest target
    primary = next((e for e in reversed(per_target) if e["status"] == "ok"),
                   next((e for e in reversed(per_target) if e["status"] == "edge"), per_target[-1]))
    result["targets"] = [
        {k: e.get(k) for k in ("target_loss", "b_crit", "b_crit_ci", "cbs_20", "s_min", "e_min", "status", "n_points", "message")}
        | {"points": e["points"]}
        for e in per_target
    ]
    b_crit = primary.get("b_crit")
    result.update(
        target_loss=primary["target_loss"],
        b_crit=b_crit,
        b_crit_tokens=b_crit * T if b_crit is not None else None,
        b_crit_ci=primary.get("b_crit_ci"),
        b_crit_bound=primary.get("b_crit_bound"),
        cbs_20=primary.get("cbs_20"),
        b_compute_overhead_20=primary.get("b_compute_overhead_20"),
        s_min=primary.get("s_min"),
        e_min=primary.get("e_min"),
        e_min_tokens=primary["e_min"] * T if primary.get("e_min") is not None else None,
        status=primary["status"],
        message=primary.get("message", ""),
    )
    per_batch = []
    for b, ts in best.items():
        toks = [tokens_to_target(t.tokens, t.val_loss, primary["target_loss"]) for t in ts]
        reached = [x for x in toks if x is not None]
        tok = float(np.mean(reached)) if len(reached) == len(toks) else None
        per_batch.append({
            "batch_size_sequences": b,
            "batch_size_tokens": b * T,
            "best_config": ts[0].hyperparameters,
            "seeds": [t.seed for t in ts],
            "trial_ids": [t.trial_id for t in ts],
            "loss_at_budget": float(np.mean([t.final_loss for t in ts])),
            "tokens_to_target": tok,
            "steps_to_target": tok / (b * T) if tok is not None else None,
            "flops_to_target": tok * flops_per_token if (tok is not None and flops_per_token) else None,
        })
    result["per_batch"] = per_batch
    result["b_simple"] = [
        {"batch_size_sequences": b, "tokens": ts[0].tokens, "b_simple": ts[0].b_simple} for b, ts in best.items()
    ]
    # fitted LR scaling exponent over the best configurations (methodology section 7.4)
    lrs = [(b, ts[0].hyperparameters.get("lr")) for b, ts in best.items() if ts[0].hyperparameters.get("lr")]
    if len(lrs) >= 3:
        slope, _ = np.polyfit(np.log([x[0] for x in lrs]), np.log([x[1] for x in lrs]), 1)
        result["lr_scaling_exponent_fit"] = float(slope)
    return result


def analyze_csv(path: str | Path, reference_batch: float) -> dict[str, Any]:
    """``critbatch analyze``: fit points from a CSV of ``batch_size,steps_to_target[,group]``.

    Returns ``{s_min, e_min, b_crit, cbs_20}`` or, with a ``group`` column, that dict per group.

    Raises:
        InvalidInput: missing file or columns, non-numeric or non-positive values, too few points.
    """
    p = Path(path)
    if reference_batch <= 0:
        raise InvalidInput("--reference-batch must be positive")
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise InvalidInput(f"CSV file not found: {p}") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"cannot read CSV {p}: {exc}") from None
    if not rows:
        raise InvalidInput(f"{p}: no data rows")
    cols = set(rows[0].keys())
    missing = {"batch_size", "steps_to_target"} - cols
    if missing:
        raise InvalidInput(f"{p}: missing column(s) {sorted(missing)}; expected batch_size,steps_to_target[,group]")
    groups: dict[str | None, tuple[list[float], list[float]]] = {}
    for i, row in enumerate(rows, start=2):
        try:
            b, s = float(row["batch_size"]), float(row["steps_to_target"])
        except (TypeError, ValueError):
            raise InvalidInput(f"{p}, line {i}: batch_size and steps_to_target must be numbers") from None
        if not (b > 0 and s > 0 and math.isfinite(b) and math.isfinite(s)):
            raise InvalidInput(f"{p}, line {i}: batch_size and steps_to_target must be positive and finite")
        g = row.get("group") if "group" in cols else None
        groups.setdefault(g, ([], []))
        groups[g][0].append(b)
        groups[g][1].append(s)

    def one(name: str | None, bs: list[float], ss: list[float]) -> dict[str, Any]:
        try:
            fit = fit_hyperbola(bs, ss)
        except ValueError as exc:
            label = f"group {name!r}" if name is not None else str(p)
            raise InvalidInput(f"{label}: {exc}") from None
        return {
            "s_min": fit.s_min,
            "e_min": fit.e_min,
            "b_crit": fit.b_crit if math.isfinite(fit.b_crit) else None,
            "cbs_20": cbs_20(fit.b_crit, reference_batch) if math.isfinite(fit.b_crit) else None,
            "n_points": len(bs),
            "rms_log_residual": fit.rms_log_residual,
        }

    if list(groups) == [None]:
        return one(None, *groups[None])
    return {str(g): one(g, *v) for g, v in groups.items()}
