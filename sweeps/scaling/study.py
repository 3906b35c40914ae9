"""A scaling study's members read from what critbatch writes (``critbatch analyze --csv`` tables, a sweep's
``cbs.json``), its law fitted, and the result as ``scale.json`` with the one-sentence answer."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput
from sweeps.scaling.b_opt import LR_CAVEAT, STOPPED_CAVEAT, BestBatch
from sweeps.scaling.law import PowerLaw, StudyMember, fit_power_law
from sweeps.scaling.published import published_predictions

__all__ = ["QUANTITIES", "answer_sentence", "b_opt_result", "member_from_cbs", "member_from_csv", "scale_result"]

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
        InvalidInput: no readable ``cbs.json`` (or not a JSON object), or no budget given and none found.
    """
    _check_quantity(quantity)
    cbs_path = path / "cbs.json" if path.is_dir() else path
    try:
        cbs = json.loads(cbs_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{cbs_path}: cannot read a sweep's cbs.json ({exc})") from None
    if not isinstance(cbs, dict):
        raise InvalidInput(f"{cbs_path}: not a sweep's cbs.json (a JSON object with {quantity} and {quantity}_ci)")
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
    b_opt_members: Sequence[tuple[StudyMember, BestBatch]] = (),
) -> dict[str, Any]:
    """``scale.json``: the members, the law (eq. 1 of :mod:`sweeps.scaling.law`), its residuals and status, and
    the prediction at ``predict_tokens`` beside the published laws' (sequences; tokens where
    ``tokens_per_sequence`` is known); under ``b_opt``, the same for B_opt (:func:`b_opt_result` of
    ``b_opt_members``, the sweep folders' :func:`sweeps.scaling.b_opt.b_opt_member`), and the answer adds its
    prediction or why there is none.

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
    b_opt = b_opt_result(
        b_opt_members, predict_tokens=predict_tokens, level=level, tokens_per_sequence=tokens_per_sequence
    )
    if b_opt_members and len(b_opt_members) < len(members):
        b_opt["caveats"].append(
            f"{len(members) - len(b_opt_members)} member(s) are steps-to-target tables, not sweep folders: "
            "they give no loss at a fixed budget and are not in B_opt's law"
        )
    result["b_opt"] = b_opt
    result["answer"] = answer_sentence(law, result["prediction"], quantity) + "; " + b_opt["answer"]
    return result


def b_opt_result(
    measured: Sequence[tuple[StudyMember, BestBatch]],
    *,
    predict_tokens: float | None = None,
    level: float = 0.95,
    tokens_per_sequence: float | None = None,
) -> dict[str, Any]:
    """``scale.json``'s ``b_opt`` section: B_opt per member (:mod:`sweeps.scaling.b_opt`), its power law in D
    fitted as b_crit's is (:func:`sweeps.scaling.law.fit_power_law`: members with an interval only, ``edge``
    ones left out), and its prediction at ``predict_tokens`` beside the published B_opt laws (Power Lines'
    exponent anchored at the largest fitted member; Step Law's absolute law in tokens).

    The keys mirror b_crit's at the top of ``scale.json``; those of the law are None when it cannot be fitted
    (``status`` ``too_few_budgets``, ``absent`` saying why), and ``absent`` says so when no member is a sweep
    folder (steps-to-target tables hold no loss at a fixed budget). ``answer`` is B_opt's part of the sentence.

    Raises:
        InvalidInput: a ``predict_tokens`` that is not positive, a level outside (0, 1).
    """
    out: dict[str, Any] = {
        "quantity": "b_opt",
        "definition": "the batch size of lowest validation loss at the member's budget D (sequences)",
        "law": None,
        **dict.fromkeys(("gamma", "gamma_ci", "b0", "tokens_ref", "tau2", "cov_ln_b0_gamma", "quantile")),
        "level": level,
        "status": "too_few_budgets",
        "caveats": _b_opt_caveats(measured),
        "members": [_b_opt_member_json(m, d, None) for m, d in measured],
        "excluded": [],
        "prediction": None,
        "absent": None,
    }
    if not measured:
        out["absent"] = (
            "no member is a sweep folder: steps-to-target tables (--csv) hold no loss at a fixed budget, so B_opt "
            "needs the sweeps' trials.json (--cbs SWEEP)"
        )
        out["answer"] = f"no B_opt: {out['absent']}"
        return out
    try:
        law = fit_power_law([m for m, _ in measured], level=level)
    except InvalidInput as exc:
        if not str(exc).startswith("too_few_budgets"):
            raise
        out["answer"] = _no_b_opt_law(measured)
        out["absent"] = "too_few_budgets: a law needs two budgets whose B_opt has an interval; " + out["answer"]
        return out
    residual = {id(m): r for m, r in zip(law.members, law.residuals)}
    out.update(
        law="b_opt(D) = b0 * (D / D0) ** gamma",
        gamma=law.gamma,
        gamma_ci=list(law.gamma_ci),
        b0=law.b0,
        tokens_ref=law.tokens_ref,
        tau2=law.tau2,
        cov_ln_b0_gamma=law.cov.tolist(),
        quantile=law.quantile,
        status=law.status,
        caveats=[*_b_opt_caveats(measured), *law.caveats],
        members=[_b_opt_member_json(m, d, residual.get(id(m))) for m, d in measured],
        excluded=law.excluded,
    )
    if predict_tokens is not None:
        p = law.predict(predict_tokens)
        largest = max(law.members, key=lambda m: m.tokens)
        published = published_predictions(
            p.tokens, largest.tokens, largest.batch_size_sequences or math.nan, tokens_per_sequence
        )
        out["prediction"] = {
            "tokens": p.tokens,
            "b_opt": p.batch_size_sequences,
            "interval": list(p.interval),
            "level": p.level,
            "extrapolation_factor": p.extrapolation_factor,
            "b_opt_tokens": p.batch_size_sequences * tokens_per_sequence if tokens_per_sequence else None,
            "published": [x for x in published if x["quantity"] == "b_opt"],
        }
    out["answer"] = answer_sentence(law, out["prediction"], "b_opt")
    return out


def _no_b_opt_law(measured: Sequence[tuple[StudyMember, BestBatch]]) -> str:
    """Why there is no law of B_opt, with each member's B_opt or status."""
    each = ", ".join(
        f"{d.budget_tokens:.3g} tokens: "
        + (
            f"{d.batch_size_sequences:.3g} [{d.interval_sequences[0]:.3g}, {d.interval_sequences[1]:.3g}]"
            if d.interval_sequences and d.batch_size_sequences
            else d.status
        )
        for _, d in measured
    )
    return f"no B_opt law: {sum(m.usable() for m, _ in measured)} of {len(measured)} budgets bracket B_opt ({each})"


def _b_opt_caveats(measured: Sequence[tuple[StudyMember, BestBatch]]) -> list[str]:
    stopped = sum(d.trials_stopped_early for _, d in measured)
    total = stopped + sum(d.trials_at_budget for _, d in measured)
    return [LR_CAVEAT] + ([f"{stopped} of {total} trials: {STOPPED_CAVEAT}"] if stopped else [])


def _b_opt_member_json(m: StudyMember, d: BestBatch, residual: float | None) -> dict[str, Any]:
    return {
        "label": m.label,
        "tokens": m.tokens,
        "batch_size_sequences": d.batch_size_sequences,
        "batch_size_ci_sequences": list(d.interval_sequences or ()),
        "level": d.level,
        "status": d.status,
        "message": d.message,
        "bound": d.bound,
        "losses_at_budget": {str(b): v for b, v in d.losses_at_budget.items()},
        "trials_at_budget": d.trials_at_budget,
        "trials_stopped_early": d.trials_stopped_early,
        "trials_by_batch_size": {str(b): list(n) for b, n in d.trials_by_batch_size.items()},
        "log_residual": residual,
    }


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
    smallest = min(m.tokens for m in law.members)
    if factor > 1:
        where = f"extrapolated {factor:.3g}x beyond the largest budget swept"
    elif prediction["tokens"] < smallest:
        where = f"extrapolated {smallest / prediction['tokens']:.3g}x below the smallest budget swept"
    else:
        where = "inside the budgets swept"
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
