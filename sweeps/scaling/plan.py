"""A study's prediction as ``critbatch plan``'s input: the production run planned with the predicted critical
batch size and the two ends of its prediction interval, with the predicted B_opt beside it in words."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput

__all__ = ["b_opt_sentence", "is_scale_result", "plan_inputs_from_scale"]


def is_scale_result(path: Path) -> bool:
    """True when ``path`` is a study's ``scale.json`` (or a folder holding one and no ``cbs.json``)."""
    p = path / "scale.json" if path.is_dir() and not (path / "cbs.json").is_file() else path
    try:
        data = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "law" in data and "members" in data


def _check_prediction(pred: Any, quantity: str, path: Path) -> None:
    """Refuse a ``prediction`` section the plan cannot read: ``tokens``, ``extrapolation_factor``, the predicted
    ``quantity`` and both ends of ``interval`` must be positive, finite numbers. Raises InvalidInput naming them."""

    def positive(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf

    interval = pred.get("interval") if isinstance(pred, dict) else None
    fields = {
        "tokens": pred.get("tokens") if isinstance(pred, dict) else None,
        "extrapolation_factor": pred.get("extrapolation_factor") if isinstance(pred, dict) else None,
        quantity: pred.get(quantity) if isinstance(pred, dict) else None,
        "interval": interval,
    }
    bad = [k for k, v in fields.items() if k != "interval" and not positive(v)]
    if not (isinstance(interval, list) and len(interval) == 2 and all(positive(v) for v in interval)):
        bad.append("interval")
    if bad:
        raise InvalidInput(
            f"plan: {path}'s prediction needs {', '.join(bad)} as positive, finite numbers (the interval as "
            "[low, high] sequences): run critbatch scale with --predict-tokens D again"
        )


def plan_inputs_from_scale(
    path: Path, *, flops_per_token: float | None, params: float | None, tokens_per_sequence: float | None
) -> dict[str, Any]:
    """What ``sweeps.analysis.plan_files.make_plan`` takes, from a ``scale.json`` with a prediction.

    The steps-to-target hyperbola at the production budget D* is ``S(B) = S_min (1 + b_crit / B)`` with
    ``E_min = D* / tokens_per_sequence`` sequences (the budget is read as the data a small batch needs to reach
    the production run's loss: a batch B then needs ``D* (1 + B / b_crit)`` tokens, McCandlish et al. 2018,
    eq. 2.11) and ``S_min = E_min / b_crit``, once for the predicted ``b_crit`` and once for each end of its
    prediction interval (the plan's rows ``group``: ``predicted``, ``interval low``, ``interval high``).
    The production model's ``flops_per_token``, ``params`` and ``tokens_per_sequence`` are not the study's:
    each must be given.

    Raises:
        InvalidInput: no prediction in the file (run ``critbatch scale`` with ``--predict-tokens``) or one with
            fields missing or not finite, or a production-model option missing or not positive and finite (each
            named).
    """
    p = path / "scale.json" if path.is_dir() else path
    data = json.loads(p.read_text(encoding="utf-8"))
    pred = data.get("prediction")
    if not pred:
        raise InvalidInput(f"plan: {p} holds no prediction: run critbatch scale with --predict-tokens D")
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
        raise InvalidInput(
            f"plan: {p} is a study's prediction for a production run, whose model it does not hold: "
            f"give {', '.join(missing)} (the production model's)"
        )
    for name, v in (
        ("--flops-per-token", flops_per_token),
        ("--params", params),
        ("--tokens-per-sequence", tokens_per_sequence),
    ):
        if v is not None and not 0 < v < math.inf:
            raise InvalidInput(f"plan: {name} must be a positive, finite number, got {v}")
    assert tokens_per_sequence and flops_per_token and params  # each checked above
    quantity = data.get("quantity", "b_crit")
    _check_prediction(pred, quantity, p)
    e_min = pred["tokens"] / float(tokens_per_sequence)
    lo, hi = pred["interval"]
    fits = [
        {
            "group": label,
            "b_crit": b,
            "e_min": e_min,
            "s_min": e_min / b,
            "status": data.get("status"),
            "target_loss": None,
            "swept": None,
            "message": "",
        }
        for label, b in (("predicted", pred[quantity]), ("interval low", lo), ("interval high", hi))
    ]
    b_opt = b_opt_sentence(data)
    factor = pred["extrapolation_factor"]
    return {
        "b_opt_sentence": b_opt,
        "source": str(p),
        "fits": fits,
        "headline_target_loss": None,
        "tokens_per_sequence": float(tokens_per_sequence),
        "flops_per_token": float(flops_per_token),
        "n_params": float(params),
        "n_params_source": "--params",
        "spec_sync_every_steps": None,
        "out_dir": None,
        "notes": [
            f"{quantity} predicted at {pred['tokens']:.3g} tokens, "
            + (
                f"extrapolated {factor:.3g}x beyond the largest budget the study swept"
                if factor > 1
                else f"at {factor:.3g}x the largest budget the study swept"
            )
            + f" (status {data.get('status')}); the budget is read as the tokens a small batch needs to reach the "
            "production loss, so a batch B needs D (1 + B / b_crit) tokens",
            *([b_opt] if b_opt else []),
        ],
    }


def b_opt_sentence(data: dict[str, Any]) -> str | None:
    """The B_opt a ``scale.json`` (``data``) predicts, in words, to print beside the plan made from b_crit (the
    loss-optimal batch at the budget, a different quantity; the plan does not use it); why there is none when its
    law is absent; None for a file written before B_opt was measured."""
    b_opt = data.get("b_opt")
    if not b_opt:
        return None
    pred = b_opt.get("prediction")
    if not pred:
        return f"B_opt (not planned with): {b_opt.get('answer') or b_opt.get('absent')}"
    lo, hi = pred["interval"]
    return (
        f"B_opt (the batch of lowest loss at the budget; not planned with) at {pred['tokens']:.3g} tokens: "
        f"~{pred['b_opt']:.3g} sequences, {100 * pred['level']:g} % prediction interval [{lo:.3g}, {hi:.3g}], "
        f"law status {b_opt['status']}"
    )
