"""The critical-batch-size analysis: steps and tokens to a target loss, the hyperbola fit, error bars.

For a target loss ``L*``, each batch size ``B`` needs ``S(B)`` optimizer steps and ``E(B) = B * S(B)``
sequences to first reach ``L*`` *with hyperparameters tuned for that batch size*. Following Zhang et
al. 2024 (arXiv 2410.21676, section 2: "the minimum number of optimization steps to reach the target
over all runs") and the methodology note (section 11.3), ``S(B)`` is the minimum over every trial of
that batch size, read from each trial's curve, including the curve a pruned or stopped trial
reported before it ended. McCandlish et al. 2018 (arXiv 1812.06162, Eq. 2.11) model the trade-off as
``(S/S_min - 1)(E/E_min - 1) = 1``, i.e.

    S(B) = S_min + E_min / B,          E(B) = E_min + S_min * B,

and define the critical batch size ``b_crit = E_min / S_min`` (Eq. 2.12): at ``B = b_crit`` a run
needs twice the minimum steps and twice the minimum data. The compute overhead over the minimum
is ``B / b_crit``, so the batch with 20 % overhead is ``0.2 * b_crit``; Zhang et al. 2024 define the
CBS as the batch whose steps exceed linear scaling from a reference batch ``B0`` by 20 %, which under
this model is ``0.2 * b_crit + 1.2 * B0`` (methodology note section 4.1). The fit minimises squared
residuals in ``log S`` with ``S_min, E_min >= 0`` (methodology section 2.4).

The interval (:func:`interval_b_crit`) is a profile-likelihood interval on one point per batch size
(the mean of ``log S`` over its seeds): the seeds of a batch size share its tuned configuration and
the search that chose it, so they are not independent replicates; the scatter of the per-batch points
around the fit carries both the shared error and the search's own variability. docs/results.md and
``benchmarks/ci_coverage.py`` give its measured coverage.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import f as f_dist

from sweeps.errors import InvalidInput

__all__ = [
    "HyperbolaFit",
    "fit_hyperbola",
    "interval_b_crit",
    "cbs_20",
    "tokens_to_target",
    "choose_targets",
    "steps_to_target_points",
    "analyze_trials",
    "analyze_points",
    "analyze_csv",
    "analyze_trials_file",
    "TrialRecord",
    "TARGET_RULE",
    "INTERVAL_METHOD",
    "STATUSES",
    "finite_json",
]

#: how a batch size enters the fit at a target; stated in ``cbs.json``
TARGET_RULE = (
    "steps to target at a batch size = the minimum over all its trials (completed, pruned or stopped: "
    "the curve each reported) of the first crossing, interpolated in log tokens; a batch size enters the "
    "fit at a target only if a trial crosses it at a milestone before that batch size's last one (the "
    "budget); automatic targets are chosen among the losses that at least max(3, 70 %) of the batch sizes "
    "reach that way"
)
#: how ``b_crit_ci`` is computed; stated in ``cbs.json``
INTERVAL_METHOD = (
    "profile-likelihood interval of log b_crit on one point per batch size (mean log steps over its seeds), "
    "F(1, n-2) calibrated (Bates and Watts 1988, section 6.1; Seber and Wild 1989, Eq. 5.35)"
)
#: every status a fit can have
STATUSES = ("ok", "edge", "above_range", "below_range", "no_knee")


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


def _check_points(B: np.ndarray, S: np.ndarray) -> None:
    if B.shape != S.shape or B.ndim != 1:
        raise ValueError("batch_sizes and steps must be 1-D and of equal length")
    if len(np.unique(B)) < 2:
        raise ValueError("need at least 2 distinct batch sizes to fit S = S_min + E_min/B")
    if np.any(B <= 0) or np.any(S <= 0) or not (np.all(np.isfinite(S)) and np.all(np.isfinite(B))):
        raise ValueError("batch sizes and steps must be positive and finite")


def _profile_sse(B: np.ndarray, y: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Residual sum of squares of ``log S`` and the optimal ``log S_min`` for each ``u = log b_crit``.

    With ``E_min = b_crit * S_min``, ``log S = log S_min + log(1 + b_crit/B)``, so for a fixed
    ``b_crit`` the best ``log S_min`` is the mean of ``y - log(1 + b_crit/B)``.
    """
    z = y[None, :] - np.log1p(np.exp(u)[:, None] / B[None, :])
    m = z.mean(axis=1)
    return ((z - m[:, None]) ** 2).sum(axis=1), m


def _limit_sse(B: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The SSE at the two limits: ``b_crit -> 0`` (``E_min = 0``) and ``b_crit -> inf`` (``S_min = 0``)."""
    w = y + np.log(B)
    return float(((y - y.mean()) ** 2).sum()), float(((w - w.mean()) ** 2).sum())


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
    _check_points(B, S)
    y = np.log(S)
    lo_u, hi_u = math.log(B.min()) - 9.0, math.log(B.max()) + 9.0
    grid = np.linspace(lo_u, hi_u, 361)
    obj, _ = _profile_sse(B, y, grid)
    i = int(np.argmin(obj))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    r = minimize_scalar(lambda u: float(_profile_sse(B, y, np.array([u]))[0][0]), bounds=(a, b), method="bounded",
                        options={"xatol": 1e-10})
    u_best = float(r.x)
    obj_best, m_best = _profile_sse(B, y, np.array([u_best]))
    o_zero, o_inf = _limit_sse(B, y)
    candidates = [(float(obj_best[0]), float(np.exp(m_best[0])), float(np.exp(m_best[0] + u_best))),
                  (o_zero, float(np.exp(y.mean())), 0.0),
                  (o_inf, 0.0, float(np.exp((y + np.log(B)).mean())))]
    cost, s_min, e_min = min(candidates, key=lambda c: c[0])
    b_crit = e_min / s_min if s_min > 0 else math.inf
    rms = math.sqrt(cost / len(B))
    return HyperbolaFit(s_min=s_min, e_min=e_min, b_crit=b_crit, rms_log_residual=rms)


def _per_batch_means(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """One point per distinct batch size: ``(B, exp(mean log S))`` (the geometric mean over its seeds)."""
    B = np.asarray(batch_sizes, dtype=float)
    S = np.asarray(steps, dtype=float)
    _check_points(B, S)
    ub = np.unique(B)
    return ub, np.exp(np.array([np.log(S[B == b]).mean() for b in ub]))


def interval_b_crit(batch_sizes: Sequence[float], steps: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Confidence interval of ``b_crit`` from the profile of the log-space fit.

    Points are first reduced to one per batch size (mean ``log S`` over seeds): points that share a
    batch size share its tuned configuration, so their errors are correlated and counting them as
    independent makes intervals too narrow. On the ``n`` per-batch points the interval is

        { b : SSE(b) <= SSE_min * (1 + F_{1, n-2}(level) / (n - 2)) },

    with ``SSE(b)`` the profile residual sum of squares of ``log S`` at ``b_crit = b`` (``S_min``
    re-optimised), the likelihood-ratio region of nonlinear least squares calibrated by the F
    distribution (Bates and Watts 1988, "Nonlinear Regression Analysis", section 6.1; Seber and Wild
    1989, "Nonlinear Regression", Eq. 5.35). It needs no resampling, and its coverage on simulated
    sweeps with a known answer is measured by ``benchmarks/ci_coverage.py``.

    Returns:
        ``(lo, hi)`` in the unit of B; ``lo = 0`` or ``hi = inf`` when the data do not bound ``b_crit``
        on that side (always so with fewer than 3 batch sizes).

    Raises:
        ValueError: as :func:`fit_hyperbola`; ``level`` outside (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    B, S = _per_batch_means(batch_sizes, steps)
    n = len(B)
    if n < 3:
        return 0.0, math.inf
    y = np.log(S)
    fit = fit_hyperbola(B, S)
    sse_min = fit.rms_log_residual ** 2 * n
    if sse_min <= 1e-24:  # points exactly on a hyperbola: the interval is the point
        return fit.b_crit, fit.b_crit
    threshold = sse_min * (1.0 + f_dist.ppf(level, 1, n - 2) / (n - 2))
    o_zero, o_inf = _limit_sse(B, y)
    if fit.b_crit <= 0.0:
        u0 = math.log(B.min()) - 9.0
    elif not math.isfinite(fit.b_crit):
        u0 = math.log(B.max()) + 9.0
    else:
        u0 = math.log(fit.b_crit)
    sse = lambda u: float(_profile_sse(B, y, np.array([u]))[0][0]) - threshold  # noqa: E731

    def end(direction: float, limit_sse: float) -> float:
        """Walk from the optimum in steps of 0.05 in log b_crit to the first point outside the region."""
        inside = u0
        for k in range(1, 400):
            u = u0 + direction * 0.05 * k
            if sse(u) > 0:
                return math.exp(brentq(sse, min(inside, u), max(inside, u), xtol=1e-10))
            inside = u
        return math.inf if direction > 0 and limit_sse <= threshold * (1 + 1e-9) else (
            0.0 if direction < 0 and limit_sse <= threshold * (1 + 1e-9) else math.exp(inside))

    return end(-1.0, o_zero), end(1.0, o_inf)


def finite_json(o: Any) -> Any:
    """Replace non-finite floats by None, recursively (JSON has no NaN or Infinity)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_json(v) for v in o]
    return o


def cbs_20(b_crit: float, reference_batch: float) -> float:
    """Zhang et al. (2024) critical batch size: steps 20 % above linear scaling from ``B0``.

    Under ``S = S_min + E_min/B``: ``B* = 0.2 * b_crit + 1.2 * B0`` (methodology note section 4.1).
    """
    return 0.2 * b_crit + 1.2 * reference_batch


def _first_crossing(tokens: Sequence[float], losses: Sequence[float], target: float) -> tuple[float, int] | None:
    """``(tokens at the crossing, index of the first milestone at or below target)``, or None."""
    prev_t, prev_l = None, None
    for i, (t, l) in enumerate(zip(tokens, losses)):
        if l is None or not math.isfinite(l):
            return None
        if l <= target:
            if prev_t is None or prev_l is None or prev_l == l:
                return float(t), i
            w = (prev_l - target) / (prev_l - l)
            return float(math.exp(math.log(prev_t) + w * (math.log(t) - math.log(prev_t)))), i
        prev_t, prev_l = t, l
    return None


def tokens_to_target(tokens: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """Tokens at which a loss curve first reaches ``target``.

    Interpolates linearly in ``log(tokens)`` between the last milestone above the target and the
    first one at or below it (methodology section 11.2). A curve already at or below the target at
    its first milestone returns that milestone's tokens (an upper bound). None if never reached, or
    if the curve turns non-finite (diverges) before reaching it.
    """
    hit = _first_crossing(tokens, losses, target)
    return hit[0] if hit is not None else None


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
    #: the equal-compute scheduler's annotation of its last report (``sweeps.pruning.scheduler.RESULT_KEYS``:
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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialRecord":
        """A record as ``trials.json`` holds it (``None`` losses, written for non-finite ones, become NaN).

        Raises:
            InvalidInput: a required field is missing or of the wrong type.
        """
        try:
            return cls(
                trial_id=str(d["trial_id"]), batch_size_sequences=int(d["batch_size_sequences"]), seed=int(d["seed"]),
                group_id=str(d.get("group_id", d["trial_id"])), status=str(d["status"]),
                hyperparameters=dict(d.get("hyperparameters") or {}),
                tokens=[float(x) for x in d.get("tokens") or []],
                val_loss=[float(x) if x is not None else math.nan for x in d.get("val_loss") or []],
                flops=[float(x) if x is not None else math.nan for x in d.get("flops") or []],
                b_simple=list(d.get("b_simple") or []), pruning=dict(d.get("pruning") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"a trial record lacks or mistypes a field ({exc!r})") from None


def _last_tokens_by_batch(trials: list[TrialRecord]) -> dict[int, float]:
    """Per batch size, its last milestone: the most tokens any of its trials reported (the budget)."""
    out: dict[int, float] = {}
    for t in trials:
        if t.tokens:
            out[t.batch_size_sequences] = max(out.get(t.batch_size_sequences, 0.0), max(t.tokens))
    return out


def _crossing_before_last(t: TrialRecord, target: float, last_tokens: float) -> float | None:
    """Tokens to target of one trial, if it crosses at a milestone before its batch size's last one."""
    hit = _first_crossing(t.tokens, t.val_loss, target)
    if hit is None or t.tokens[hit[1]] >= last_tokens:
        return None
    return hit[0]


def steps_to_target_points(trials: list[TrialRecord], target: float, tokens_per_sequence: float
                           ) -> tuple[list[dict[str, Any]], list[int]]:
    """The methodology's points at one target: per (batch size, seed), the minimum over its trials.

    For each trial the tokens to target are its first crossing (:func:`tokens_to_target`); a crossing
    at the batch size's last milestone does not count (see :data:`TARGET_RULE`). Steps to target =
    tokens / (B * tokens_per_sequence).

    Returns:
        ``(points, excluded)``: points sorted by batch size then seed, each ``{batch_size_sequences,
        seed, tokens_to_target, steps_to_target, trial_id, group_id}``; ``excluded``: batch sizes with
        a trial but no counted crossing.
    """
    last = _last_tokens_by_batch(trials)
    best: dict[tuple[int, int], tuple[float, TrialRecord]] = {}
    for t in trials:
        if not t.tokens:
            continue
        tok = _crossing_before_last(t, target, last[t.batch_size_sequences])
        key = (t.batch_size_sequences, t.seed)
        if tok is not None and (key not in best or tok < best[key][0]):
            best[key] = (tok, t)
    points = [{"batch_size_sequences": b, "seed": s, "tokens_to_target": tok,
               "steps_to_target": tok / (b * tokens_per_sequence), "trial_id": t.trial_id, "group_id": t.group_id}
              for (b, s), (tok, t) in sorted(best.items())]
    reached = {p["batch_size_sequences"] for p in points}
    return points, sorted(set(last) - reached)


def _best_at_budget(trials: list[TrialRecord]) -> dict[int, list[TrialRecord]]:
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


def choose_targets(trials: list[TrialRecord], n_targets: int = 4) -> list[float]:
    """Target losses that most batch sizes reach before their last milestone.

    Per batch size, ``reach`` is the lowest loss any of its trials shows at a milestone before the
    batch size's last one, and ``first`` the lowest loss at a first milestone. The lowest target lies
    just above the ``max(3, ceil(0.7 n))``-th smallest ``reach``, so that many batch sizes cross it
    strictly before their last milestone (:data:`TARGET_RULE`); the others are spaced evenly up to
    halfway to the lowest ``first``. Returned in decreasing order; empty if no trial has a curve.
    """
    last = _last_tokens_by_batch(trials)
    reach: dict[int, float] = {}
    firsts: dict[int, float] = {}
    for t in trials:
        b = t.batch_size_sequences
        for tok, loss in zip(t.tokens, t.val_loss):
            if loss is None or not math.isfinite(loss):
                break
            if tok < last[b]:
                reach[b] = min(reach.get(b, math.inf), loss)
        if t.val_loss and t.val_loss[0] is not None and math.isfinite(t.val_loss[0]):
            firsts[b] = min(firsts.get(b, math.inf), t.val_loss[0])
    if not reach:
        return []
    mins = sorted(reach.values())
    n_min = min(len(mins), max(3, math.ceil(0.7 * len(last))))
    lo = mins[n_min - 1] + 1e-4
    hi = min(firsts.values()) - 1e-4
    if hi <= lo:
        return [lo]
    top = lo + 0.5 * (hi - lo)
    return [float(x) for x in np.linspace(top, lo, n_targets)]


def analyze_points(
    batch_sizes: Sequence[float], steps: Sequence[float], reference_batch: float, *, level: float = 0.95
) -> dict[str, Any]:
    """Fit one set of (batch size, steps to target) points and describe the knee.

    Several points may share a batch size (seeds); the fit and the interval use one point per batch
    size (mean ``log S``), see :func:`interval_b_crit`.

    Returns a dict with ``status`` (one of :data:`STATUSES`: ``ok``: the knee and its whole interval
    lie inside the swept batch sizes, with at least 2 on each side of the knee; ``edge``: fewer than
    2 batch sizes on one side of the knee, or an interval reaching past the swept range;
    ``below_range``/``above_range``: the knee lies outside the swept batch sizes; ``no_knee``: fewer
    than 3 batch sizes, or an interval unbounded on both sides), ``message``, ``b_crit`` (None unless
    ``ok`` or ``edge``: a knee outside the range is never a bare number), ``b_crit_bound`` (for the
    out-of-range cases), ``b_crit_ci`` (``[lo, hi]``, ``hi`` None when unbounded; None with fewer than
    3 batch sizes), ``s_min``, ``e_min``, ``cbs_20``, ``b_compute_overhead_20``, ``n_points``,
    ``n_batch_sizes``, ``rms_log_residual``, ``reference_batch``.
    """
    B = [float(b) for b in batch_sizes]
    distinct = sorted(set(B))
    out: dict[str, Any] = {"n_points": len(B), "n_batch_sizes": len(distinct), "reference_batch": reference_batch,
                           "b_crit_bound": None}
    if len(distinct) < 3:
        out.update(status="no_knee", b_crit=None, s_min=None, e_min=None, cbs_20=None, b_compute_overhead_20=None,
                   b_crit_ci=None, rms_log_residual=None,
                   message=f"only {len(distinct)} batch size(s) reached the target: the fit needs at least 3")
        return out
    ub, us = _per_batch_means(B, steps)
    fit = fit_hyperbola(ub, us)
    lo, hi = interval_b_crit(B, steps, level=level)
    out.update(s_min=fit.s_min, e_min=fit.e_min, rms_log_residual=fit.rms_log_residual,
               b_crit_ci=[lo, hi if math.isfinite(hi) else None], b_crit_ci_level=level)
    lo_b, hi_b = distinct[0], distinct[-1]
    none = dict(b_crit=None, cbs_20=None, b_compute_overhead_20=None)
    if lo <= 0.0 and not math.isfinite(hi):
        out.update(status="no_knee", **none,
                   message="the points do not bound b_crit on either side: no knee is identified")
    elif fit.b_crit < lo_b:
        out.update(status="below_range", b_crit_bound=f"< {lo_b:g}", **none,
                   message=f"the knee lies below the smallest batch size ({lo_b:g}): every swept batch is past the critical batch size")
    elif fit.b_crit > hi_b:
        out.update(status="above_range", b_crit_bound=f"> {hi_b:g}", **none,
                   message=f"the knee lies above the largest batch size ({hi_b:g}): steps still scale almost perfectly there")
    else:
        below = sum(1 for b in distinct if b <= fit.b_crit)
        above = sum(1 for b in distinct if b >= fit.b_crit)
        outside = [side for side, out_of in (("below the smallest", lo < lo_b), ("above the largest", hi > hi_b)) if out_of]
        status = "ok" if below >= 2 and above >= 2 and not outside else "edge"
        message = ""
        if below < 2 or above < 2:
            message = "the knee is near the edge of the swept range (fewer than 2 batch sizes on one side)"
        elif outside:
            message = (f"the 95 % interval reaches {' and '.join(outside)} swept batch size: the swept range does "
                       "not pin the knee down")
        out.update(status=status, b_crit=fit.b_crit, cbs_20=cbs_20(fit.b_crit, reference_batch),
                   b_compute_overhead_20=0.2 * fit.b_crit, message=message)
    return out


def _lr_exponent(rows: list[tuple[int, float]]) -> float | None:
    if len({b for b, _ in rows}) < 3:
        return None
    slope, _ = np.polyfit(np.log([b for b, _ in rows]), np.log([lr for _, lr in rows]), 1)
    return float(slope)


def _lr_exponent_by_chance(trials: list[TrialRecord], batch_sizes: set[int], draws: int = 2000, seed: int = 0
                           ) -> dict[str, float] | None:
    """The fitted LR exponent when one trial per batch size (of ``batch_sizes``, those of the fit) is
    picked at random: the null to beat.

    A search space whose LR rules and multipliers are spread evenly around a rule gives that rule's
    exponent on average whatever the data say; a fitted exponent is evidence only where it differs
    from this distribution.
    """
    by_b: dict[int, list[float]] = {}
    for t in trials:
        lr = t.hyperparameters.get("lr")
        if lr and t.tokens and t.batch_size_sequences in batch_sizes:
            by_b.setdefault(t.batch_size_sequences, []).append(float(lr))
    if len(by_b) < 3:
        return None
    rng = np.random.default_rng(seed)
    x = np.log(np.array(sorted(by_b), dtype=float))
    picks = np.stack([np.log(np.asarray(by_b[b]))[rng.integers(0, len(by_b[b]), draws)] for b in sorted(by_b)], axis=1)
    xc = x - x.mean()
    slopes = (picks - picks.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
    return {"mean": float(slopes.mean()), "sd": float(slopes.std(ddof=1)), "draws": draws}


def analyze_trials(
    trials: list[TrialRecord],
    *,
    context_length_tokens: int,
    reference_batch: float,
    flops_per_token: float | None = None,
    targets: list[float] | None = None,
    level: float = 0.95,
    tokens_per_sequence: float | None = None,
) -> dict[str, Any]:
    """The sweep's critical batch size from its trials (the content of ``cbs.json``).

    ``tokens_per_sequence`` is the number of real (counted) tokens one sequence of the batch holds:
    the context length for packed pretraining (the default), the mean non-padding tokens per row for
    padded fine-tuning. Steps to target = tokens to target / (B * tokens_per_sequence), and
    ``b_crit_tokens`` = ``b_crit`` * tokens_per_sequence.

    For each target loss, each (batch size, seed) gives one point: the minimum steps to target over
    all that batch size's trials of that seed (:func:`steps_to_target_points`, :data:`TARGET_RULE`).
    The fit and its interval are :func:`analyze_points`.

    Returns a dict with the primary target's ``b_crit`` (sequences), ``b_crit_tokens``, ``b_crit_ci``,
    ``cbs_20``, ``b_compute_overhead_20``, ``s_min``, ``e_min``, ``target_loss``, ``status``,
    ``message``; ``target_rule`` and ``interval_method`` (how points and intervals are made);
    ``targets`` (one entry per target, with its ``points`` and the trial each came from);
    ``per_batch`` (each batch size's steps and tokens to the primary target with the trials that gave
    them, and, separately, ``best_config_at_budget``: the configuration with the lowest mean loss at
    the budget); ``b_simple`` (the noise-scale series of each batch size's best-at-budget trial);
    ``lr_scaling_exponent_fit`` over the primary target's winning trials with
    ``lr_scaling_exponent_by_chance`` (the same fit on random picks). The primary target is the
    lowest whose status is ``ok``, else the lowest ``edge``, else the lowest.
    """
    T = float(tokens_per_sequence) if tokens_per_sequence else float(context_length_tokens)
    at_budget = _best_at_budget(trials)
    counts = {s: sum(1 for t in trials if t.status == s) for s in ("COMPLETED", "DIVERGED", "FAILED", "PRUNED", "STOPPED")}
    result: dict[str, Any] = {"trials": counts, "reference_batch": reference_batch,
                              "context_length_tokens": context_length_tokens, "tokens_per_sequence": T,
                              "target_rule": TARGET_RULE, "interval_method": INTERVAL_METHOD}
    if not at_budget:
        result.update(status="no_completed_trials", b_crit=None, b_crit_tokens=None, b_crit_ci=None, cbs_20=None,
                      s_min=None, e_min=None, target_loss=None, targets=[], per_batch=[], b_simple=[],
                      message="no trial completed: there is nothing to analyse")
        return result
    tlist = sorted(targets, reverse=True) if targets else choose_targets(trials)
    per_target = []
    for target in tlist:
        points, excluded = steps_to_target_points(trials, target, T)
        fit = analyze_points([p["batch_size_sequences"] for p in points], [p["steps_to_target"] for p in points],
                             reference_batch, level=level)
        per_target.append({"target_loss": target, **fit, "points": points, "excluded_batch_sizes": excluded})
    primary = next((e for e in reversed(per_target) if e["status"] == "ok"),
                   next((e for e in reversed(per_target) if e["status"] == "edge"), per_target[-1]))
    keys = ("target_loss", "b_crit", "b_crit_ci", "b_crit_bound", "cbs_20", "s_min", "e_min", "status", "n_points",
            "n_batch_sizes", "rms_log_residual", "message", "points", "excluded_batch_sizes")
    result["targets"] = [{k: e.get(k) for k in keys} for e in per_target]
    b_crit = primary.get("b_crit")
    result.update(
        target_loss=primary["target_loss"],
        b_crit=b_crit,
        b_crit_tokens=b_crit * T if b_crit is not None else None,
        b_crit_ci=primary.get("b_crit_ci"),
        b_crit_ci_tokens=[x * T if x is not None else None for x in primary["b_crit_ci"]] if primary.get("b_crit_ci") else None,
        b_crit_bound=primary.get("b_crit_bound"),
        cbs_20=primary.get("cbs_20"),
        b_compute_overhead_20=primary.get("b_compute_overhead_20"),
        s_min=primary.get("s_min"),
        e_min=primary.get("e_min"),
        e_min_tokens=primary["e_min"] * T if primary.get("e_min") is not None else None,
        status=primary["status"],
        message=primary.get("message", ""),
    )
    by_trial = {t.trial_id: t for t in trials}
    primary_points: dict[int, list[dict[str, Any]]] = {}
    for p in primary["points"]:
        primary_points.setdefault(p["batch_size_sequences"], []).append(p)
    seeds_of = {b: sorted({t.seed for t in trials if t.batch_size_sequences == b}) for b in at_budget}
    per_batch = []
    for b, ts in at_budget.items():
        pts = primary_points.get(b, [])
        tok = float(np.exp(np.mean([math.log(p["tokens_to_target"]) for p in pts]))) \
            if pts and len(pts) == len(seeds_of[b]) else None
        per_batch.append({
            "batch_size_sequences": b,
            "batch_size_tokens": b * T,
            "tokens_to_target": tok,
            "steps_to_target": tok / (b * T) if tok is not None else None,
            "flops_to_target": tok * flops_per_token if (tok is not None and flops_per_token) else None,
            "trial_ids_to_target": [p["trial_id"] for p in pts],
            "config_to_target": by_trial[pts[0]["trial_id"]].hyperparameters if pts else None,
            "best_config_at_budget": ts[0].hyperparameters,
            "trial_ids_at_budget": [t.trial_id for t in ts],
            "seeds": [t.seed for t in ts],
            "loss_at_budget": float(np.mean([t.final_loss for t in ts])),
        })
    result["per_batch"] = per_batch
    result["b_simple"] = [
        {"batch_size_sequences": b, "tokens": ts[0].tokens, "b_simple": ts[0].b_simple} for b, ts in at_budget.items()
    ]
    # LR scaling exponent of the configurations that reached the primary target first (methodology
    # section 7.4), beside what random picks of one trial per batch size give
    winners = [(b, by_trial[pts[0]["trial_id"]].hyperparameters.get("lr")) for b, pts in sorted(primary_points.items())]
    fitted = _lr_exponent([(b, lr) for b, lr in winners if lr])
    if fitted is not None:
        result["lr_scaling_exponent_fit"] = fitted
        result["lr_scaling_exponent_by_chance"] = _lr_exponent_by_chance(trials, {b for b, lr in winners if lr})
    return result


def analyze_trials_file(path: str | Path, *, reference_batch: float | None = None, targets: list[float] | None = None,
                        level: float = 0.95) -> dict[str, Any]:
    """``critbatch analyze --trials OUT/trials.json``: re-analyse a finished sweep.

    Reads the records of ``trials.json`` and, beside it, ``cbs.json`` for what the records do not hold
    (context length, real tokens per sequence, FLOPs per token, reference batch, and the sweep-level
    keys the driver adds: ``sweep_id``, ``trials_planned``, ``mlflow``, ``best_checkpoint``). With no
    other targets or reference batch the result equals that ``cbs.json``.

    Raises:
        InvalidInput: missing or unreadable files, a record without its fields, no ``cbs.json`` beside.
    """
    import json

    p = Path(path)
    try:
        rows = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"--trials: file not found: {p}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(f"--trials: cannot read {p} as JSON: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InvalidInput(f"--trials: {p} is not a list of trial records")
    cbs_path = p.parent / "cbs.json"
    try:
        prev = json.loads(cbs_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"--trials: no cbs.json beside {p} (it holds the context length and tokens per sequence)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(f"--trials: cannot read {cbs_path}: {exc}") from None
    try:
        context = int(prev["context_length_tokens"])
        tps = float(prev.get("tokens_per_sequence") or context)
    except (KeyError, TypeError, ValueError):
        raise InvalidInput(f"--trials: {cbs_path} has no context_length_tokens") from None
    ref = float(reference_batch if reference_batch is not None else prev.get("reference_batch") or 0)
    if ref <= 0:
        raise InvalidInput("--reference-batch must be positive")
    records = [TrialRecord.from_dict(r) for r in rows]
    out = analyze_trials(records, context_length_tokens=context, reference_batch=ref,
                         flops_per_token=prev.get("flops_per_token"), targets=targets, level=level,
                         tokens_per_sequence=tps)
    for k in ("sweep_id", "flops_per_token", "trials_planned", "mlflow", "best_checkpoint", "local_cbs"):
        if k in prev and k not in out:
            out[k] = prev[k]
    return out


def analyze_csv(path: str | Path, reference_batch: float, *, level: float = 0.95) -> dict[str, Any]:
    """``critbatch analyze --csv``: fit points from a CSV of ``batch_size,steps_to_target[,seed][,group]``.

    A batch size may repeat (one row per seed or trial; the optional ``seed`` column is only
    recorded). Returns :func:`analyze_points`'s dict (always with ``status`` and ``b_crit_ci``) or,
    with a ``group`` column, that dict per group.

    Raises:
        InvalidInput: missing file or columns, non-numeric or non-positive values.
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
        raise InvalidInput(f"{p}: missing column(s) {sorted(missing)}; expected batch_size,steps_to_target[,seed][,group]")
    groups: dict[str | None, tuple[list[float], list[float], list[str]]] = {}
    for i, row in enumerate(rows, start=2):
        try:
            b, s = float(row["batch_size"]), float(row["steps_to_target"])
        except (TypeError, ValueError):
            raise InvalidInput(f"{p}, line {i}: batch_size and steps_to_target must be numbers") from None
        if not (b > 0 and s > 0 and math.isfinite(b) and math.isfinite(s)):
            raise InvalidInput(f"{p}, line {i}: batch_size and steps_to_target must be positive and finite")
        g = row.get("group") if "group" in cols else None
        groups.setdefault(g, ([], [], []))
        groups[g][0].append(b)
        groups[g][1].append(s)
        groups[g][2].append(str(row.get("seed", "")))

    def one(name: str | None, bs: list[float], ss: list[float], seeds: list[str]) -> dict[str, Any]:
        if len(set(bs)) < 2:
            label = f"group {name!r}" if name is not None else str(p)
            raise InvalidInput(f"{label}: need at least 2 distinct batch sizes to fit S = S_min + E_min/B")
        res = analyze_points(bs, ss, reference_batch, level=level)
        if "seed" in cols:
            res["seeds"] = sorted(set(seeds))
        return res

    if list(groups) == [None]:
        return one(None, *groups[None])
    return {str(g): one(g, *v) for g, v in groups.items()}
