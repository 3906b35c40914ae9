"""The critical-batch-size analysis of a sweep (the content of ``cbs.json``), and its re-analysis from
``trials.json`` or a CSV of points.

For a target loss ``L*``, each batch size ``B`` needs ``S(B)`` optimizer steps to first reach ``L*`` with
hyperparameters tuned for that batch size (:mod:`sweeps.analysis.targets`); ``S(B) = S_min + E_min / B``
is fitted and ``b_crit = E_min / S_min`` reported with its interval (:mod:`sweeps.analysis.fit`,
McCandlish et al. 2018, arXiv 1812.06162, Eqs. 2.11-2.12).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sweeps.analysis.fit import cbs_20_interval
from sweeps.analysis.fits import DEFAULT_FIT, Fit, fit_names, get_fit
from sweeps.analysis.lr_scaling import lr_scaling, open_bracket_gains, open_lr_brackets
from sweeps.analysis.result import SWEEP_FIELDS, with_sweep_fields
from sweeps.analysis.summary import caveats, headline
from sweeps.analysis.targets import (
    TARGET_RULE,
    TARGET_RULE_GIVEN,
    TrialRecord,
    best_at_budget,
    censored_points,
    choose_targets,
    last_tokens_by_batch,
    steps_to_target_points,
)
from sweeps.errors import InvalidInput
from sweeps.spec.result import CbsResult
from sweeps.spec.statuses import COUNTED_TRIAL_STATUSES

__all__ = ["analyze_csv", "analyze_trials", "analyze_trials_file", "analyze_trials_files"]


def analyze_trials(
    trials: list[TrialRecord],
    *,
    context_length_tokens: int,
    reference_batch: float,
    flops_per_token: float | None = None,
    targets: list[float] | None = None,
    level: float = 0.95,
    tokens_per_sequence: float | None = None,
    fit: str = DEFAULT_FIT,
) -> CbsResult:
    """The sweep's critical batch size from its trials (the content of ``cbs.json``).

    ``tokens_per_sequence`` is the number of real (counted) tokens one sequence of the batch holds:
    the context length for packed pretraining (the default), the mean non-padding tokens per row for
    padded fine-tuning. Steps to target = tokens to target / (B * tokens_per_sequence), and
    ``b_crit_tokens`` = ``b_crit`` * tokens_per_sequence.

    For each target loss, each (batch size, seed) gives one point: the minimum steps to target over
    all that batch size's trials of that seed (:func:`steps_to_target_points`, :data:`TARGET_RULE`).
    The fit and its interval are those of the fit registered as ``fit`` (:func:`sweeps.analysis.fits.get_fit`;
    the default, ``hyperbola``, is :func:`~sweeps.analysis.fit.analyze_points`); an unknown name raises ``KeyError``.

    Returns a :class:`~sweeps.spec.result.CbsResult` with the primary target's ``b_crit`` (sequences), ``b_crit_tokens``, ``b_crit_ci``,
    ``cbs_20``, ``b_compute_overhead_20`` (each with its ``_ci``: ``b_crit_ci`` mapped through it), ``s_min``,
    ``e_min``, ``target_loss``, ``status``,
    ``message``; ``target_rule`` and ``interval_method`` (how points and intervals are made);
    ``targets`` (one entry per target, with its ``points`` and the trial each came from, and its
    ``censored_points``: the batch sizes that did not reach it, each with the steps it is known to need more
    than, :func:`~sweeps.analysis.targets.censored_points`, and whether the fit, made without them, agrees
    (``fit_steps``, ``fit_consistent``)); ``censored_points`` (the primary target's);
    ``per_batch`` (each batch size's steps and tokens to the primary target with the trials that gave
    them, and, separately, ``best_config_at_budget``: the configuration with the lowest mean loss at
    the budget); ``b_simple`` (the noise-scale series of each batch size's best-at-budget trial);
    ``lr_per_batch`` (each batch size's best LR at the primary target, with its interval where measured),
    ``lr_scaling_exponent_fit`` (alpha of ``lr ~ B^alpha`` over them) with ``lr_scaling_exponent_ci``,
    ``lr_scaling_rules_in_interval`` and ``lr_scaling_exponent_by_chance`` (the same fit on random picks)
    (:func:`sweeps.analysis.lr_scaling.lr_scaling`); ``headline``, the answer in one
    sentence (:func:`sweeps.analysis.summary.headline`). The primary target is the
    lowest whose status is ``ok``, else the lowest ``edge``, else the lowest. When the records hold it,
    ``optimizer_state_bytes_per_param``: the median over the trials of each one's measured optimizer
    state (bytes per trainable parameter), and ``n_params``, the trainable parameters the trials reported.
    """
    T = float(tokens_per_sequence) if tokens_per_sequence else float(context_length_tokens)
    model = get_fit(fit)
    at_budget = best_at_budget(trials)
    result = _sweep_facts(
        trials,
        reference_batch=reference_batch,
        context_length_tokens=context_length_tokens,
        tokens_per_sequence=T,
        interval_method=model.interval_method,
    )
    if not at_budget:
        return _with_headline(
            _no_fit(result, status="no_completed_trials", message="no trial completed: there is nothing to analyse")
        )
    tlist = sorted(targets, reverse=True) if targets else choose_targets(trials)
    if targets:
        result["target_rule"] = TARGET_RULE_GIVEN
    if not tlist:
        return _with_headline(
            _no_fit(
                result,
                status="no_targets",
                message="no target loss could be chosen from the "
                "curves (too few batch sizes or milestones completed): give `targets` or run "
                "more trials",
            )
        )
    per_target = [_analyze_target(trials, target, T, reference_batch, level, model) for target in tlist]
    primary = next(
        (e for e in reversed(per_target) if e["status"] == "ok"),
        next((e for e in reversed(per_target) if e["status"] == "edge"), per_target[-1]),
    )
    result["targets"] = [{k: e.get(k) for k in _TARGET_KEYS} for e in per_target]
    result.update(_primary_summary(primary, T))
    by_trial = {t.trial_id: t for t in trials}
    primary_points: dict[int, list[dict[str, Any]]] = {}
    for p in primary["points"]:
        primary_points.setdefault(p["batch_size_sequences"], []).append(p)
    result["per_batch"] = _per_batch(trials, at_budget, primary_points, by_trial, T, flops_per_token)
    result["b_simple"] = [
        {"batch_size_sequences": b, "tokens": ts[0].tokens, "b_simple": ts[0].b_simple} for b, ts in at_budget.items()
    ]
    # the LR scaling rule the data say (methodology section 7.4), beside what random picks give
    result |= lr_scaling(trials, primary["target_loss"], level)
    # where the fastest trial at a target ran at an end of its batch size's tried LRs (search.precision probes them)
    result["lr_brackets_open"] = open_lr_brackets(trials, tlist)
    return _with_headline(result)


def _sweep_facts(
    trials: list[TrialRecord],
    *,
    reference_batch: float,
    context_length_tokens: int,
    tokens_per_sequence: float,
    interval_method: str,
) -> dict[str, Any]:
    """The head of :func:`analyze_trials`' result, whatever the fit: the trials by status, the inputs, the
    rules, and when the records hold them the median optimizer state (bytes per trainable parameter) and
    the trainable parameters."""
    counts = {s: sum(1 for t in trials if t.status == s) for s in COUNTED_TRIAL_STATUSES}
    result: dict[str, Any] = {
        "trials": counts,
        "reference_batch": reference_batch,
        "context_length_tokens": context_length_tokens,
        "tokens_per_sequence": tokens_per_sequence,
        "target_rule": TARGET_RULE,
        "interval_method": interval_method,
    }
    state_bytes = [t.optimizer_state_bytes_per_param for t in trials if t.optimizer_state_bytes_per_param is not None]
    if state_bytes:  # measured by each trial after its first step (absent in records of older sweeps)
        result["optimizer_state_bytes_per_param"] = float(np.median(state_bytes))
    n_params = [t.trainable_params for t in trials if t.trainable_params is not None]
    if n_params:  # what a data-parallel step all-reduces the gradients of (critbatch plan reads it)
        result["n_params"] = max(n_params)
    return result


def _no_fit(result: dict[str, Any], *, status: str, message: str) -> dict[str, Any]:
    """``result`` of a sweep with nothing to fit (``status``, ``message``): every fitted field None or empty."""
    result.update(
        status=status,
        b_crit=None,
        b_crit_tokens=None,
        b_crit_ci=None,
        cbs_20=None,
        s_min=None,
        e_min=None,
        target_loss=None,
        targets=[],
        per_batch=[],
        b_simple=[],
        censored_points=[],
        message=message,
    )
    return result


def _with_headline(result: dict[str, Any]) -> CbsResult:
    """``result`` with its ``headline`` (the answer in one sentence, :func:`sweeps.analysis.summary.headline`)
    as its first key, so ``cbs.json`` opens with the answer, and its ``caveats`` (what the interval does not
    cover, :func:`sweeps.analysis.summary.caveats`)."""
    out = {"headline": headline(result), **result}
    out["caveats"] = caveats(out)
    return CbsResult.model_validate(out)


#: the keys of each entry of ``cbs.json``'s ``targets``
_TARGET_KEYS = (
    "target_loss",
    "b_crit",
    "b_crit_ci",
    "b_crit_bound",
    "cbs_20",
    "cbs_20_ci",
    "s_min",
    "s_min_ci",
    "e_min",
    "e_min_ci",
    "status",
    "n_points",
    "n_batch_sizes",
    "fitted_batch_sizes",
    "censored_in_fit",
    "upper_bounded_in_fit",
    "seed_fits",
    "between_seed_sd_log",
    "b_crit_ci_unwidened",
    "open_bracket_gains",
    "rms_log_residual",
    "message",
    "points",
    "excluded_batch_sizes",
    "censored_points",
)


def _analyze_target(
    trials: list[TrialRecord], target: float, T: float, reference_batch: float, level: float, model: Fit
) -> dict[str, Any]:
    """One target loss: its points (:func:`steps_to_target_points`) and their fit (``model``)."""
    points, excluded = steps_to_target_points(trials, target, T)
    censored = censored_points(trials, target, T)
    exact = [p for p in points if not p.get("upper_bound")]
    fit = model.analyze(
        [p["batch_size_sequences"] for p in exact],
        [p["steps_to_target"] for p in exact],
        reference_batch,
        level=level,
        seeds=[p["seed"] for p in exact],
        censored=[(c["batch_size_sequences"], c["steps_lower_bound"], c["seed"]) for c in censored],
        upper_bounds=[
            (p["batch_size_sequences"], p["steps_to_target"], p["seed"]) for p in points if p.get("upper_bound")
        ],
    )
    fit = _with_open_brackets(fit, trials, target, exact, censored, points, reference_batch, level, model)
    s_min, e_min = fit.get("s_min"), fit.get("e_min")
    for c in censored:  # does the fit, made from the cells that reached it, say they should have?
        fitted = s_min + e_min / c["batch_size_sequences"] if s_min is not None and e_min is not None else None
        c["fit_steps"] = fitted
        c["fit_consistent"] = (
            None if fitted is None or c["steps_lower_bound"] is None else bool(fitted > c["steps_lower_bound"])
        )
    note = _contradiction_note(censored, fit.get("b_crit"))
    if note:
        fit["message"] = f"{fit['message']}; {note}" if fit.get("message") else note
    return {
        "target_loss": target,
        **fit,
        "points": points,
        "excluded_batch_sizes": excluded,
        "censored_points": censored,
    }


def _with_open_brackets(
    fit: dict[str, Any],
    trials: list[TrialRecord],
    target: float,
    exact: list[dict[str, Any]],
    censored: list[dict[str, Any]],
    points: list[dict[str, Any]],
    reference_batch: float,
    level: float,
    model: Fit,
) -> dict[str, Any]:
    """``fit`` with its interval widened by the batch sizes whose LR bracket is open at ``target``: the same fit
    with each such point as fast as an optimum up to an octave beyond could make it (:func:`open_bracket_gains`)
    moves the estimate by a factor; the interval's end on that side moves by the same factor
    (``b_crit_ci_unwidened`` keeps the first). An open bracket's point overstates the tuned
    steps by an amount the scatter of the points does not show; the search closes brackets when it can, and this
    says what is left when it could not. Unchanged without open brackets or without an interval."""
    gains = open_bracket_gains(trials, target)
    if not gains or not fit.get("b_crit_ci") or fit.get("status") in ("no_knee", "misfit"):
        return fit
    alt = model.analyze(
        [p["batch_size_sequences"] for p in exact],
        [p["steps_to_target"] * math.exp(-gains.get(p["batch_size_sequences"], 0.0)) for p in exact],
        reference_batch,
        level=level,
        seeds=[p["seed"] for p in exact],
        censored=[(c["batch_size_sequences"], c["steps_lower_bound"], c["seed"]) for c in censored],
        upper_bounds=[
            (p["batch_size_sequences"], p["steps_to_target"], p["seed"]) for p in points if p.get("upper_bound")
        ],
    )
    if not alt.get("b_crit") or not fit.get("b_crit"):
        return fit
    lo, hi = fit["b_crit_ci"]
    shift = alt["b_crit"] / fit["b_crit"]  # how far the open brackets could move the estimate: each end moves as far
    wide = [lo * min(1.0, shift), None if hi is None else hi * max(1.0, shift)]
    out = {
        **fit,
        "b_crit_ci_unwidened": fit["b_crit_ci"],
        "b_crit_ci": wide,
        "open_bracket_gains": {str(b): g for b, g in sorted(gains.items())},
    }
    if out.get("b_crit") is not None:  # the mapped intervals follow the widened one
        out["cbs_20_ci"], out["b_compute_overhead_20_ci"] = cbs_20_interval(wide, reference_batch)
    return out


def _contradiction_note(censored: list[dict[str, Any]], b_crit: float | None) -> str:
    """A sentence for the target's message when censored cells needed more steps than the fit gives them, or "".

    More steps than the hyperbola allows at a batch size above the knee would raise ``S_min`` (the fit's
    ``b_crit`` then reads high); below the knee they would raise ``E_min`` (it reads low). Without a ``b_crit``
    (a knee outside the range) no direction is given. A cell's trials may also simply have run at poor LRs."""
    sizes = sorted({c["batch_size_sequences"] for c in censored if c["fit_consistent"] is False})
    if not sizes:
        return ""
    text = (
        f"batch size(s) {', '.join(str(b) for b in sizes)} did not reach this target within the steps the fit "
        f"(made from the cells that did) gives them"
    )
    if b_crit is not None:
        above = [b for b in sizes if b > b_crit]
        below = [b for b in sizes if b <= b_crit]
        why = (["b_crit may be overstated (above the knee)"] if above else []) + (
            ["b_crit may be understated (below the knee)"] if below else []
        )
        text += ": " + " and ".join(why)
    return text + ", unless their trials' learning rates were poor"


def _scaled(ci: list[float | None] | None, factor: float) -> list[float | None] | None:
    """An interval ``[lo, hi]`` (``hi`` None: unbounded) times ``factor``."""
    return [x * factor if x is not None else None for x in ci] if ci else None


def _primary_summary(primary: dict[str, Any], T: float) -> dict[str, Any]:
    """The primary target's headline values, in sequences and (``*_tokens``) in tokens."""
    b_crit = primary.get("b_crit")
    return dict(
        target_loss=primary["target_loss"],
        b_crit=b_crit,
        b_crit_tokens=b_crit * T if b_crit is not None else None,
        b_crit_ci=primary.get("b_crit_ci"),
        b_crit_ci_tokens=[x * T if x is not None else None for x in primary["b_crit_ci"]]
        if primary.get("b_crit_ci")
        else None,
        b_crit_bound=primary.get("b_crit_bound"),
        cbs_20=primary.get("cbs_20"),
        cbs_20_ci=primary.get("cbs_20_ci"),
        b_compute_overhead_20=primary.get("b_compute_overhead_20"),
        b_compute_overhead_20_ci=primary.get("b_compute_overhead_20_ci"),
        s_min=primary.get("s_min"),
        s_min_ci=primary.get("s_min_ci"),
        e_min=primary.get("e_min"),
        e_min_ci=primary.get("e_min_ci"),
        e_min_tokens=primary["e_min"] * T if primary.get("e_min") is not None else None,
        e_min_ci_tokens=_scaled(primary.get("e_min_ci"), T),
        fitted_batch_sizes=primary.get("fitted_batch_sizes"),
        censored_points=primary.get("censored_points") or [],
        status=primary["status"],
        message=primary.get("message", ""),
    )


def _per_batch(
    trials: list[TrialRecord],
    at_budget: dict[int, list[TrialRecord]],
    primary_points: dict[int, list[dict[str, Any]]],
    by_trial: dict[str, TrialRecord],
    T: float,
    flops_per_token: float | None,
) -> list[dict[str, Any]]:
    """``cbs.json``'s ``per_batch``: each batch size's steps and tokens to the primary target (geometric
    mean over its seeds, only when every seed reached it), its best configuration at the budget, its token
    budget (``budget_tokens``: the most tokens one of its trials trained), and the compute it used
    (``tokens_trained``: the sum over its ``trials`` with a curve, pruned and stopped ones at what they reached)."""
    seeds_of = {b: sorted({t.seed for t in trials if t.batch_size_sequences == b}) for b in at_budget}
    budget = last_tokens_by_batch(trials)  # the same budget the target rule uses
    trained: dict[int, float] = {}
    for t in trials:
        if t.tokens:
            trained[t.batch_size_sequences] = trained.get(t.batch_size_sequences, 0.0) + max(t.tokens)
    per_batch = []
    for b, ts in at_budget.items():
        pts = primary_points.get(b, [])
        tok = (
            float(np.exp(np.mean([math.log(p["tokens_to_target"]) for p in pts])))
            if pts and len(pts) == len(seeds_of[b])
            else None
        )
        per_batch.append(
            {
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
                "loss_at_budget": float(np.mean(np.asarray([t.final_loss for t in ts]))),
                "budget_tokens": budget.get(b),
                "tokens_trained": trained.get(b),
                "trials": sum(1 for t in trials if t.batch_size_sequences == b and t.tokens),
            }
        )
    return per_batch


def _read_json(path: Path, *, missing: str) -> Any:
    """The JSON content of ``path``.

    Raises:
        InvalidInput: ``missing`` if the file does not exist; "cannot read" if it is not JSON.
    """
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(missing) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(f"--trials: cannot read {path} as JSON: {exc}") from None


def analyze_trials_file(
    path: str | Path,
    *,
    reference_batch: float | None = None,
    targets: list[float] | None = None,
    level: float = 0.95,
    fit: str = DEFAULT_FIT,
) -> CbsResult:
    """``critbatch analyze --trials OUT/trials.json``: re-analyse a finished sweep.

    Reads the records of ``trials.json`` and, beside it, ``cbs.json`` for what the records do not hold
    (context length, real tokens per sequence, FLOPs per token, reference batch, and the sweep-level
    keys the driver adds: ``sweep_id``, ``trials_planned``, ``mlflow``, ``best_checkpoint``, ``optimizer``,
    ``provenance``). With no
    other targets or reference batch the result equals that ``cbs.json``.

    ``fit``: the registered fit to use (:func:`sweeps.analysis.fits.fit_names`).

    Raises:
        InvalidInput: missing or unreadable files, a record without its fields, no ``cbs.json`` beside, an
            unknown ``fit``.
    """
    _check_fit(fit)
    p = Path(path)
    rows = _read_json(p, missing=f"--trials: file not found: {p}")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InvalidInput(f"--trials: {p} is not a list of trial records")
    cbs_path = p.parent / "cbs.json"
    prev = _read_json(
        cbs_path, missing=f"--trials: no cbs.json beside {p} (it holds the context length and tokens per sequence)"
    )
    try:
        context = int(prev["context_length_tokens"])
        tps = float(prev.get("tokens_per_sequence") or context)
    except (KeyError, TypeError, ValueError):
        raise InvalidInput(f"--trials: {cbs_path} has no context_length_tokens") from None
    ref = float(reference_batch if reference_batch is not None else prev.get("reference_batch") or 0)
    if not 0 < ref < math.inf:
        raise InvalidInput(f"--reference-batch must be positive and finite (sequences), got {ref}")
    records = [TrialRecord.from_dict(r) for r in rows]
    if targets is None:  # the targets the sweep fixed in its spec, as the driver analysed it
        targets = _spec_targets(p.parent / "spec.yaml")
    out = analyze_trials(
        records,
        context_length_tokens=context,
        reference_batch=ref,
        flops_per_token=prev.get("flops_per_token"),
        targets=targets,
        level=level,
        tokens_per_sequence=tps,
        fit=fit,
    )
    return with_sweep_fields(out, **{k: prev[k] for k in SWEEP_FIELDS if k in prev and k not in out.model_fields_set})


def _check_fit(fit: str) -> None:
    """Raises InvalidInput naming the registered fits when ``fit`` is none of them."""
    if fit not in fit_names():
        raise InvalidInput(f"--fit: {fit!r} is not a registered fit: one of {', '.join(fit_names())}")


def _spec_targets(path: Path) -> list[float] | None:
    """The ``targets`` (nats) of the spec a sweep stored beside its records (``OUT/spec.yaml``), or None (no spec
    there, or a spec without fixed targets: the analysis then chooses them from the curves, as the driver did)."""
    if not path.is_file():
        return None
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    got = spec.get("targets") if isinstance(spec, dict) else None
    return [float(t) for t in got] if isinstance(got, list) and got else None


def analyze_trials_files(
    paths: list[str | Path],
    *,
    reference_batch: float | None = None,
    targets: list[float] | None = None,
    level: float = 0.95,
    fit: str = DEFAULT_FIT,
) -> dict[str, Any]:
    """``critbatch analyze --trials A --trials B ...``: several finished sweeps re-analysed at the same target losses,
    so that their ``b_crit`` compare at one loss.

    Args:
        targets: the target losses (nats); default the first sweep's (its ``cbs.json``'s ``targets``).

    Returns:
        ``{"targets": [...], "sweeps": [{"path", **analyze_trials_file(...)}, ...]}`` in the order given.

    Raises:
        InvalidInput: as :func:`analyze_trials_file`; the first sweep has no targets to share.
    """
    if not targets:
        first = _read_json(Path(paths[0]).parent / "cbs.json", missing=f"--trials: no cbs.json beside {paths[0]}")
        targets = [float(t["target_loss"]) for t in first.get("targets") or [] if t.get("target_loss") is not None]
        if not targets:
            raise InvalidInput(f"--trials: {paths[0]}'s cbs.json declares no targets: give --target")
    out = [
        {
            "path": str(p),
            **analyze_trials_file(
                p, reference_batch=reference_batch, targets=targets, level=level, fit=fit
            ).to_json_dict(),
        }
        for p in paths
    ]
    return {"targets": sorted(targets, reverse=True), "sweeps": out}


def analyze_csv(
    path: str | Path, reference_batch: float, *, level: float = 0.95, fit: str = DEFAULT_FIT
) -> dict[str, Any]:
    """``critbatch analyze --csv``: fit points from a CSV of ``batch_size,steps_to_target[,seed][,group]``.

    A batch size may repeat (one row per seed or trial; the optional ``seed`` column is only
    recorded). Returns the dict of the fit registered as ``fit`` (by default the hyperbola, :func:`~sweeps.analysis.fit.analyze_points`) (always with ``status`` and
    ``b_crit_ci``) or, with a ``group`` column, that dict per group.

    Raises:
        InvalidInput: missing file or columns, non-numeric or non-positive values, an unknown ``fit``.
    """
    _check_fit(fit)
    p = Path(path)
    if not 0 < reference_batch < math.inf:
        raise InvalidInput(f"--reference-batch must be positive and finite (sequences), got {reference_batch}")
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
        raise InvalidInput(
            f"{p}: missing column(s) {sorted(missing)}; expected batch_size,steps_to_target[,seed][,group]"
        )
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
        res = get_fit(fit).analyze(bs, ss, reference_batch, level=level)
        if "seed" in cols:
            res["seeds"] = sorted(set(seeds))
        return res

    if list(groups) == [None]:
        return one(None, *groups[None])
    return {str(g): one(g, *v) for g, v in groups.items()}
