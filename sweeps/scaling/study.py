"""A scaling study's members read from what critbatch writes (``critbatch analyze --csv`` tables, a sweep's
``cbs.json``), its law fitted, and the result as ``scale.json`` with the one-sentence answer."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput
from sweeps.scaling.law import PowerLaw, StudyMember, fit_power_law
from sweeps.scaling.published import published_predictions

__all__ = ["QUANTITIES", "answer_sentence", "member_from_cbs", "member_from_csv", "scale_result"]

#: what a study fits across budgets: McCandlish's b_crit = E_min / S_min, or Zhang et al.'s 20 % CBS
#: (0.2 b_crit + 1.2 B0, which carries the constant of its reference batch B0)
QUANTITIES = ("b_crit", "cbs_20")


def _check_quantity(quantity: str) -> None:
    if quantity not in QUANTITIES:
        raise InvalidInput(f"--quantity must be one of {', '.join(QUANTITIES)}, got {quantity!r}")


def member_from_csv(
    path: Path,
    tokens: float,
    reference_batch: float,
    *,
    level: float = 0.95,
    n_params: float | None = None,
    quantity: str = "b_crit",
) -> StudyMember:
    """A member from a steps-to-target table (``batch_size,steps_to_target``, as ``critbatch analyze --csv``
    reads it) measured at budget ``tokens``.

    ``quantity``: one of :data:`QUANTITIES` (the key of the fit's value and ``<key>_ci`` its interval).

    Raises:
        InvalidInput: the table cannot be read or fitted (see ``sweeps.analysis.analyze_csv``), or it has groups.
    """
    _check_quantity(quantity)
    from sweeps.analysis import analyze_csv

    fit = analyze_csv(path, reference_batch, level=level)
    if "groups" in fit or "b_crit" not in fit:
        raise InvalidInput(f"{path}: a table with a group column is several members: split it, one file per budget")
    ci = fit.get(f"{quantity}_ci")
    return StudyMember(
        tokens=tokens,
        batch_size_sequences=fit.get(quantity),
        batch_size_ci_sequences=tuple(ci) if ci else None,
        level=level,
        status=fit.get("status", "?"),
        label=str(path),
        n_params=n_params,
    )


def member_from_cbs(path: Path, tokens: float | None = None, quantity: str = "b_crit") -> StudyMember:
    """A member from a finished sweep's ``cbs.json`` (or its folder); its budget is ``tokens`` or, by default,
    the trials' token budget the sweep's ``spec.yaml`` beside it gives (``budget_tokens``).

    Raises:
        InvalidInput: no readable ``cbs.json``, or no budget given and none found.
    """
    _check_quantity(quantity)
    cbs_path = path / "cbs.json" if path.is_dir() else path
    try:
        cbs = json.loads(cbs_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{cbs_path}: cannot read a sweep's cbs.json ({exc})") from None
    if tokens is None:
        tokens = _spec_budget_tokens(cbs_path.parent / "spec.yaml")
    ci = cbs.get(f"{quantity}_ci")
    return StudyMember(
        tokens=float(tokens),
        batch_size_sequences=cbs.get(quantity),
        batch_size_ci_sequences=tuple(ci) if ci else None,
        status=cbs.get("status", "?"),
        label=str(cbs_path.parent),
        n_params=cbs.get("n_params"),
    )


def _spec_budget_tokens(spec_path: Path) -> float:
    """``budget_tokens`` (each trial's token budget) of a sweep's resolved ``spec.yaml``. Raises InvalidInput
    when it has none."""
    import yaml

    try:
        spec = yaml.safe_load(spec_path.read_text(encoding="utf-8")) or {}
        return float(spec["budget_tokens"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        raise InvalidInput(
            f"{spec_path}: no budget_tokens to read the member's budget from; give it (--cbs PATH:TOKENS)"
        ) from None


def scale_result(
    members: Sequence[StudyMember],
    *,
    predict_tokens: float | None = None,
    level: float = 0.95,
    tokens_per_sequence: float | None = None,
    quantity: str = "b_crit",
) -> dict[str, Any]:
    """``scale.json``: the members, the law (eq. 1 of :mod:`sweeps.scaling.law`), its residuals and status, and
    the prediction at ``predict_tokens`` beside the published laws' (sequences; tokens where
    ``tokens_per_sequence`` is known).

    Raises:
        InvalidInput: see :func:`sweeps.scaling.law.fit_power_law`; a ``predict_tokens`` that is not positive.
    """
    law = fit_power_law(members, level=level)
    result: dict[str, Any] = {
        "answer": None,
        "quantity": quantity,
        "law": f"{quantity}(D) = b0 * (D / D0) ** gamma",
        "gamma": law.gamma,
        "gamma_ci": list(law.gamma_ci),
        "level": law.level,
        "b0": law.b0,
        "tokens_ref": law.tokens_ref,
        "tau2": law.tau2,
        "cov_ln_b0_gamma": law.cov.tolist(),
        "quantile": law.quantile,
        "status": law.status,
        "caveats": law.caveats,
        "model_size": law.n_params_note or None,
        "members": [_member_json(m, r) for m, r in zip(law.members, law.residuals)],
        "excluded": law.excluded,
        "prediction": None,
    }
    if predict_tokens is not None:
        p = law.predict(predict_tokens)
        largest = max(law.members, key=lambda m: m.tokens)
        result["prediction"] = {
            "tokens": p.tokens,
            quantity: p.batch_size_sequences,
            "interval": list(p.interval),
            "level": p.level,
            "extrapolation_factor": p.extrapolation_factor,
            f"{quantity}_tokens": p.batch_size_sequences * tokens_per_sequence if tokens_per_sequence else None,
            "published": published_predictions(
                p.tokens, largest.tokens, largest.batch_size_sequences or math.nan, tokens_per_sequence
            ),
        }
    result["answer"] = answer_sentence(law, result["prediction"], quantity)
    return result


def _member_json(m: StudyMember, residual: float) -> dict[str, Any]:
    return {
        "label": m.label,
        "tokens": m.tokens,
        "batch_size_sequences": m.batch_size_sequences,
        "batch_size_ci_sequences": list(m.batch_size_ci_sequences or ()),
        "level": m.level,
        "status": m.status,
        "n_params": m.n_params,
        "log_residual": residual,
    }


def answer_sentence(law: PowerLaw, prediction: dict[str, Any] | None, quantity: str = "b_crit") -> str:
    """The study in one sentence: the exponent with its interval, and the prediction with how far it extrapolates."""
    pct = f"{100 * law.level:g} %"
    head = (
        f"{quantity} grows as D^{law.gamma:.2f} ({pct} interval [{law.gamma_ci[0]:.2f}, {law.gamma_ci[1]:.2f}], "
        f"{len(law.members)} budgets, status {law.status})"
    )
    if prediction is None:
        return head
    lo, hi = prediction["interval"]
    factor = prediction["extrapolation_factor"]
    where = f"extrapolated {factor:.3g}x beyond the largest budget swept" if factor > 1 else "inside the budgets swept"
    return (
        f"at {prediction['tokens']:.3g} tokens, {quantity} is most likely ~{prediction[quantity]:.3g} sequences, "
        f"{pct} prediction interval [{lo:.3g}, {hi:.3g}], {where}; {head}"
    )


def log_band(result: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
    """``(mean, sd)`` of ``ln b`` that ``scale.json``'s law (``result``) predicts at ``tokens`` (a number or an
    array): the law's own uncertainty plus tau^2, as :meth:`sweeps.scaling.law.PowerLaw.predict` reads it; the
    prediction interval is ``exp(mean -+ result["quantile"] * sd)``."""
    import numpy as np

    x = np.log(np.asarray(tokens, dtype=float) / result["tokens_ref"])
    cov = result["cov_ln_b0_gamma"]
    mean = math.log(result["b0"]) + result["gamma"] * x
    sd = np.sqrt(cov[0][0] + 2 * cov[0][1] * x + cov[1][1] * x * x + result["tau2"])
    return mean, sd
