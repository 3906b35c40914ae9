"""A critical batch size measured at several token budgets, fitted as a power law in the budget, and predicted
at a larger one with an interval that widens with the extrapolation.

Zhang et al. 2024 (arXiv 2410.21676, section 4) find that the critical batch size grows with the data size D,
not with the model size; Bergsma et al. 2025 ("Power Lines", arXiv 2505.13738) fit ``B_crit ~ D^0.5`` and
``B_opt ~ D^0.383``. The law fitted here is

    b_crit(D) = b0 * (D / D0) ** gamma                                                            (1)

on log axes, ``ln b_crit = ln b0 + gamma * ln(D / D0)``, with ``D0`` the geometric mean of the members' budgets
(so ``ln b0`` and ``gamma`` are uncorrelated when the members weigh alike). Each member (one sweep at one budget)
enters with its interval, not only its point: its standard error on the log scale is the interval's half width
divided by the normal quantile of its level, ``se = (ln hi - ln lo) / (2 z)``, and the fit is weighted least
squares with weights ``1 / se^2``. With three or more members the scatter around the line beyond the members' own
errors is estimated as a random effect (DerSimonian and Laird 1986, the meta-regression form of Viechtbauer 2005,
eq. 6: ``tau^2 = max(0, (Q - (n - p)) / (sum w - tr((X'WX)^-1 X'W^2X)))``) and the covariance is scaled and read
with Student's t on ``n - 2`` degrees of freedom (Knapp and Hartung 2003, eq. 7), so that three budgets that
disagree give a wide exponent, not a confident one. With two members the line goes through both points: the
exponent's interval comes from the two members' intervals alone and the power-law form itself is not tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from sweeps.errors import InvalidInput

__all__ = ["LAW_STATUSES", "PowerLaw", "Prediction", "StudyMember", "fit_power_law", "log_standard_error"]

#: the law's statuses, worst first: fewer than two members with an interval; a member whose own status is not
#: ``ok`` (its interval enters, the status says so); a significant bend on log axes (four or more members);
#: ``ok``
LAW_STATUSES = ("too_few_budgets", "member_not_ok", "curvature", "ok")


@dataclass(frozen=True)
class StudyMember:
    """One sweep of the study: its token budget and the critical batch size it measured.

    Attributes:
        tokens: D, the training tokens of the member's budget (tokens, > 0).
        batch_size_sequences: the member's critical batch size (``b_crit``, or the study's other quantity:
            Zhang et al.'s 20 % CBS ``cbs_20``), sequences; None if it has none (a knee outside its range).
        batch_size_ci_sequences: its interval ``(lo, hi)`` (sequences) at ``level``, None if it has none.
        level: the interval's confidence level, in (0, 1).
        status: the member's own status (``ok``, ``edge``, ...: ``sweeps.analysis.fit.STATUSES``).
        label: what the member is, for messages (a folder or a CSV file).
        n_params: the model's parameter count, if known (to tell data size from model size).
    """

    tokens: float
    batch_size_sequences: float | None
    batch_size_ci_sequences: tuple[float, float] | None
    level: float = 0.95
    status: str = "ok"
    label: str = ""
    n_params: float | None = None

    def usable(self) -> bool:
        """True when the member has a positive point inside a positive, finite interval."""
        if self.batch_size_sequences is None or self.batch_size_ci_sequences is None:
            return False
        lo, hi = self.batch_size_ci_sequences
        return (
            all(math.isfinite(v) and v > 0 for v in (lo, hi, self.batch_size_sequences))
            and lo <= self.batch_size_sequences <= hi
            and lo < hi
        )


def log_standard_error(ci: tuple[float, float], level: float) -> float:
    """The standard error of ``ln b`` implied by a two-sided interval ``ci`` at ``level``, assuming it is
    ``ln b +- z se`` on the log scale (an asymmetric interval is read by its mean half width).

    Raises:
        InvalidInput: an interval that is not positive and increasing, or a level outside (0, 1).
    """
    lo, hi = ci
    if not (0 < lo < hi and math.isfinite(hi)):
        raise InvalidInput(f"an interval must be positive and increasing, got [{lo}, {hi}]")
    if not 0 < level < 1:
        raise InvalidInput(f"a confidence level must lie in (0, 1), got {level}")
    return (math.log(hi) - math.log(lo)) / (2 * float(stats.norm.ppf(0.5 + level / 2)))


@dataclass(frozen=True)
class Prediction:
    """The law's critical batch size at one budget.

    Attributes:
        tokens: the budget D (tokens).
        batch_size_sequences: the predicted critical batch size (sequences), ``b0 (D/D0)^gamma``.
        interval: its prediction interval (sequences) at ``level``: the law's uncertainty at D plus, with three
            or more members, the scatter of a single budget around the law (tau^2).
        level: the interval's level.
        extrapolation_factor: D over the largest member budget (below 1: inside or under the range swept).
    """

    tokens: float
    batch_size_sequences: float
    interval: tuple[float, float]
    level: float
    extrapolation_factor: float


@dataclass(frozen=True)
class PowerLaw:
    """Eq. (1) fitted to a study's members.

    Attributes:
        b0: the law's critical batch size at ``tokens_ref`` (sequences).
        tokens_ref: D0, the geometric mean of the fitted members' budgets (tokens).
        gamma: the exponent; ``gamma_ci`` its interval at ``level``.
        cov: the 2 x 2 covariance of ``(ln b0, gamma)``.
        tau2: the between-budget variance of ``ln b_crit`` beyond the members' own errors (0 with two members).
        quantile: the quantile the intervals use (normal with two members, Student's t on n - 2 beyond).
        residuals: ``ln b_i - law`` of each fitted member, in ``members`` order (natural log units).
        members: the members fitted (usable ones), in budget order; ``excluded`` the others' labels with why.
        status: one of :data:`LAW_STATUSES`; ``caveats``: what the fit does not show, in words.
        n_params_note: whether model size varies and whether the data can tell it from data size.
    """

    b0: float
    tokens_ref: float
    gamma: float
    gamma_ci: tuple[float, float]
    level: float
    cov: np.ndarray
    tau2: float
    quantile: float
    residuals: list[float]
    members: list[StudyMember]
    excluded: list[str] = field(default_factory=list)
    status: str = "ok"
    caveats: list[str] = field(default_factory=list)
    n_params_note: str = ""

    def predict(self, tokens: float) -> Prediction:
        """The law at budget ``tokens`` with its prediction interval (see :class:`Prediction`).

        Raises:
            InvalidInput: ``tokens`` not positive and finite, or so far beyond the budgets swept that the interval
                overflows a float.
        """
        if not (math.isfinite(tokens) and tokens > 0):
            raise InvalidInput(f"a budget to predict at must be a positive number of tokens, got {tokens}")
        x = np.array([1.0, math.log(tokens / self.tokens_ref)])
        mean = math.log(self.b0) + self.gamma * x[1]
        sd = math.sqrt(float(x @ self.cov @ x) + self.tau2)
        largest = max(m.tokens for m in self.members)
        try:
            lo, hi = math.exp(mean - self.quantile * sd), math.exp(mean + self.quantile * sd)
        except OverflowError:
            raise InvalidInput(
                f"a budget of {tokens:.3g} tokens is {tokens / largest:.3g}x beyond the largest budget swept: the "
                "prediction interval there overflows a float; predict at a nearer budget"
            ) from None
        return Prediction(
            tokens=tokens,
            batch_size_sequences=math.exp(mean),
            interval=(lo, hi),
            level=self.level,
            extrapolation_factor=tokens / largest,
        )


def _design(members: Sequence[StudyMember], tokens_ref: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, v)``: rows ``[1, ln(D/D0)]``, ``ln b_crit`` and each member's own variance ``se^2``."""
    x = np.array([[1.0, math.log(m.tokens / tokens_ref)] for m in members])
    y = np.array([math.log(m.batch_size_sequences) for m in members])  # type: ignore[arg-type]  # usable(): not None
    v = np.array([log_standard_error(m.batch_size_ci_sequences, m.level) ** 2 for m in members])  # type: ignore[arg-type]
    return x, y, v


def _wls(x: np.ndarray, y: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted least squares with weights ``1/v``: ``(coefficients, (X'WX)^-1, Q = sum w r^2)``."""
    w = 1.0 / v
    xtwx_inv = np.linalg.inv(x.T @ (w[:, None] * x))
    beta = xtwx_inv @ (x.T @ (w * y))
    r = y - x @ beta
    return beta, xtwx_inv, float(np.sum(w * r * r))


def _tau2(x: np.ndarray, v: np.ndarray, q: float) -> float:
    """DerSimonian-Laird's between-study variance for a meta-regression (Viechtbauer 2005, eq. 6)."""
    n, p = x.shape
    w = 1.0 / v
    xtwx_inv = np.linalg.inv(x.T @ (w[:, None] * x))
    trace = float(np.sum(w) - np.trace(xtwx_inv @ (x.T @ ((w * w)[:, None] * x))))
    return max(0.0, (q - (n - p)) / trace) if trace > 0 else 0.0


def _curved(members: Sequence[StudyMember], tokens_ref: float, v: np.ndarray, level: float) -> bool:
    """True when a quadratic term in ``ln D`` is significant at ``level`` (four or more members)."""
    if len(members) < 4:
        return False
    x, y, _ = _design(members, tokens_ref)
    xq = np.column_stack([x, x[:, 1] ** 2])
    beta, xtwx_inv, q = _wls(xq, y, v)
    dof = len(members) - 3
    scale = max(1.0, q / dof)
    t = abs(beta[2]) / math.sqrt(xtwx_inv[2, 2] * scale)
    return t > stats.t.ppf(0.5 + level / 2, dof)


def _model_size_note(members: Sequence[StudyMember], level: float) -> str:
    """Whether the members' model sizes vary, and whether data size and model size can be told apart: with four or
    more members whose ln N and ln D are not collinear (|correlation| < 0.95), ``ln b = a + gamma ln D + delta ln N``
    is fitted (weights ``1/se^2``, scaled and read with t on n - 3 degrees of freedom as the law is) and delta, the
    exponent in model size at fixed data, is given with its interval."""
    sizes = [m.n_params for m in members]
    if all(s is None for s in sizes):
        return ""
    if any(s is None for s in sizes) or len({round(math.log(s), 6) for s in sizes if s}) <= 1:  # type: ignore[arg-type]
        return "one model size (or some unknown): the law is in data size at that size"
    ln_n = np.log(np.array(sizes, dtype=float))
    ln_d = np.log(np.array([m.tokens for m in members]))
    r = float(np.corrcoef(ln_n, ln_d)[0, 1]) if len(members) > 2 else 1.0
    if len(members) < 4 or abs(r) >= 0.95:
        return (
            f"model size varies with the budget (correlation of ln N and ln D {r:.2f} over {len(members)} "
            "members): these data cannot tell data size from model size; the exponent is in D with N moving "
            "along (Zhang et al. 2024 find D, not N, drives it, at fixed N or fixed D)"
        )
    x = np.column_stack([np.ones(len(members)), ln_d - ln_d.mean(), ln_n - ln_n.mean()])
    y = np.array([math.log(m.batch_size_sequences) for m in members])  # type: ignore[arg-type]  # usable members
    v = np.array([log_standard_error(m.batch_size_ci_sequences, m.level) ** 2 for m in members])  # type: ignore[arg-type]
    beta, cov, q = _wls(x, y, v)
    dof = len(members) - 3
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * math.sqrt(cov[2, 2] * max(1.0, q / dof))
    return (
        f"model size varies apart from the budget (correlation of ln N and ln D {r:.2f}): at fixed D, "
        f"~ N^{beta[2]:.2f} ({100 * level:g} % interval [{beta[2] - half:.2f}, {beta[2] + half:.2f}]), "
        f"and at fixed N ~ D^{beta[1]:.2f} (Zhang et al. 2024: N barely matters at fixed D)"
    )


def fit_power_law(members: Sequence[StudyMember], *, level: float = 0.95) -> PowerLaw:
    """Fit eq. (1) to the members that have an interval (see the module's docstring for the method).

    Args:
        members: the study's members, any order; at least two with distinct budgets and an interval.
        level: the confidence level of ``gamma_ci`` and of predictions, in (0, 1).

    Returns:
        the :class:`PowerLaw`; its ``status`` says ``member_not_ok`` when a fitted member's own status is not
        ``ok``, ``curvature`` when four or more members bend on log axes.

    Raises:
        InvalidInput: fewer than two usable members or two budgets alike (status ``too_few_budgets``: nothing
            to fit), a level outside (0, 1), a budget that is not positive.
    """
    if not 0 < level < 1:
        raise InvalidInput(f"--level must lie in (0, 1), got {level}")
    for m in members:
        if not (math.isfinite(m.tokens) and m.tokens > 0):
            raise InvalidInput(
                f"{m.label or 'a member'}: its budget must be a positive number of tokens, got {m.tokens}"
            )
    used = sorted((m for m in members if m.usable()), key=lambda m: m.tokens)
    excluded = [f"{m.label or m.tokens}: status {m.status}, no interval" for m in members if not m.usable()]
    if len({m.tokens for m in used}) < 2:
        raise InvalidInput(
            f"too_few_budgets: a law needs two budgets with a critical batch size and its interval; "
            f"{len(used)} of {len(members)} member(s) have one, at {len({m.tokens for m in used})} distinct "
            "budget(s)" + (f" ({'; '.join(excluded)})" if excluded else "")
        )
    tokens_ref = math.exp(sum(math.log(m.tokens) for m in used) / len(used))
    x, y, v = _design(used, tokens_ref)
    beta, cov, q = _wls(x, y, v)
    n = len(used)
    tau2, quantile = 0.0, float(stats.norm.ppf(0.5 + level / 2))
    if n >= 3:
        tau2 = _tau2(x, v, q)
        beta, cov, q_star = _wls(x, y, v + tau2)
        cov = cov * max(1.0, q_star / (n - 2))  # Knapp-Hartung, never below the members' own errors
        quantile = float(stats.t.ppf(0.5 + level / 2, n - 2))
    gamma, se_gamma = float(beta[1]), math.sqrt(cov[1, 1])
    residuals = [float(r) for r in y - x @ beta]
    caveats = []
    not_ok = [m for m in used if m.status != "ok"]
    status = "member_not_ok" if not_ok else "ok"
    if not_ok:
        caveats.append("member(s) not ok: " + "; ".join(f"{m.label or m.tokens} ({m.status})" for m in not_ok))
    if excluded:
        caveats.append("left out (no interval): " + "; ".join(excluded))
    if status == "ok" and _curved(used, tokens_ref, v, level):
        status = "curvature"
        caveats.append(
            "the members bend on log axes (a quadratic term in ln D is significant): a power law is the "
            "wrong shape over this range, and predictions beyond it are doubtful"
        )
    if n == 2:
        caveats.append(
            "two budgets: the line goes through both, so the power-law form is assumed, not tested, and "
            "the exponent's interval comes from the two members' intervals alone"
        )
    return PowerLaw(
        b0=math.exp(float(beta[0])),
        tokens_ref=tokens_ref,
        gamma=gamma,
        gamma_ci=(gamma - quantile * se_gamma, gamma + quantile * se_gamma),
        level=level,
        cov=cov,
        tau2=tau2,
        quantile=quantile,
        residuals=residuals,
        members=list(used),
        excluded=excluded,
        status=status,
        caveats=caveats,
        n_params_note=_model_size_note(used, level),
    )
