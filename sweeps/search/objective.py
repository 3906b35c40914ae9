"""The value each batch size's Optuna study is told for a group (one configuration at one batch size, its
trials the seeds): what the fit uses, tokens to a target loss, not the final loss alone.

Optuna is told a group's value once, so the target cannot move with later groups: per batch size it is fixed
when its first group with a value ends, at that group's *common target* (:func:`common_target`, the rule
the searcher ranked LRs by before ranking at the fit's targets). A group's value is the mean over its seeds of
:func:`seed_value`: ``ln(tokens to the target)`` (interpolated in log tokens,
:func:`sweeps.analysis.targets.tokens_to_target`) plus ``TIE_BREAK x final loss``, or, for a seed that never
reaches it, ``ln(budget tokens) + 1 + final loss``: worse than any seed that does, and ordered by its final loss.

Where the records (the driver's report log) are not attached or cannot be read when a batch size's first group
ends, that batch size is told the mean final loss, as before, for good (one study, one scale).
:func:`tell_group` tells a finished group's value (the searcher,
:class:`sweeps.search.searcher.BatchSizeSearcher`, keeps ``objectives`` and hands it in); it also names each
study's metric, and :func:`label_group_trial` records each group's LR and batch size on its Optuna trial
(optuna-dashboard).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from sweeps._compat import optuna_search_completed, optuna_search_study, optuna_search_trials
from sweeps.analysis.targets import tokens_to_target

__all__ = [
    "FINAL_LOSS",
    "METRIC_NAMES",
    "OBJECTIVE",
    "TIE_BREAK",
    "TOKENS_TO_TARGET",
    "common_target",
    "curves_of",
    "label_group_trial",
    "name_metric",
    "seed_value",
    "tell_group",
]

log = logging.getLogger(__name__)

#: the metric every trial reports and each Optuna study minimises: validation loss at the end of the trial's
#: budget (a diverged trial counts as ``ln(vocab)``, the loss of a uniform prediction); a group's study is told
#: the value made from it and the seeds' curves (:func:`tell_group`)
OBJECTIVE = "objective"

#: the objective of a batch size told tokens to its target loss (the value's name in ``objectives`` and Optuna)
TOKENS_TO_TARGET = "tokens_to_target"
#: the objective of a batch size told the mean final validation loss (no records when its first group ended)
FINAL_LOSS = "final_loss"
#: weight of the final loss (nats) beside ``ln(tokens)``: it orders groups that reach the target at the same
#: tokens (e.g. all at the first milestone); tokens within 0.1 % per nat of final loss count as a tie
TIE_BREAK = 1e-3

#: Optuna user attributes (on the study: its objective and target; on each told trial: what its value is made of)
OBJECTIVE_ATTR = "critbatch.objective"
TARGET_ATTR = "critbatch.target_loss"
TOKENS_ATTR = "critbatch.tokens_to_target"
FINAL_ATTR = "critbatch.final_loss"
#: on each group's trial from when it is asked: the LR it trains at (under ``transfer`` the study samples
#: ``lr_offset_octaves`` around the batch size's centre LR, not the LR) and its batch size (sequences)
LR_ATTR = "critbatch.lr"
BATCH_SIZE_ATTR = "critbatch.batch_size_sequences"

#: the name each objective's value goes by in its Optuna study (``study.metric_names``: optuna-dashboard's
#: axis, instead of "Objective 0"): what the study is told, not the trials' reported ``objective``
METRIC_NAMES = {TOKENS_TO_TARGET: "ln_tokens_to_target_loss", FINAL_LOSS: "final_val_loss"}

Curve = tuple[Sequence[float], Sequence[float]]  # (tokens, val_loss) at the milestones


def name_metric(study: optuna.Study, objective: str) -> None:
    """Name ``study``'s one objective after ``objective`` (a key of :data:`METRIC_NAMES`), unless already so
    named. ``Study.set_metric_names`` is experimental in Optuna 4-5: its warning is not the user's concern."""
    name = METRIC_NAMES[objective]
    if study.metric_names != [name]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([name])


def _finite(curve: Curve | None) -> bool:
    return curve is not None and bool(curve[1]) and all(math.isfinite(x) for x in curve[1])


def common_target(curves: Sequence[Curve | None]) -> float | None:
    """The lowest loss (nats) every finite curve reaches before its last milestone: the highest of the curves'
    minima over their milestones but the last (the whole curve when it has one milestone). None when no curve
    is finite (missing or diverged: those are left out)."""
    finite = [c for c in curves if c is not None and _finite(c)]
    if not finite:
        return None
    return max(min(losses[:-1] or losses) for _, losses in finite)


def seed_value(
    curve: Curve | None, final_loss: float, target: float | None, budget_tokens: float
) -> tuple[float, float | None]:
    """One seed's share of a group's told value, lower is better.

    Args:
        curve: the seed's ``(tokens, val_loss)`` milestones; None when its record is missing.
        final_loss: the trial's objective (final validation loss, nats; ``ln(vocab)`` if it diverged); a
            cross-entropy, so at least 0.
        target: the batch size's target loss (nats); None while none is fixed (every seed counts as not
            reaching it).
        budget_tokens: training tokens per trial; a reached target is at most these.

    Returns:
        ``(value, tokens)``: ``ln(tokens) + TIE_BREAK * final_loss`` and the tokens to the target when the
        curve reaches it, else ``ln(budget_tokens) + 1 + final_loss`` (more than any reached value while the
        final loss is under 1000 nats) and None.
    """
    tokens = tokens_to_target(curve[0], curve[1], target) if curve and target is not None else None
    if tokens is None:
        last = max(curve[0]) if curve and curve[0] else 0.0
        return math.log(max(budget_tokens, last)) + 1.0 + final_loss, None
    return math.log(tokens) + TIE_BREAK * final_loss, tokens


def curves_of(records: Callable[[], list[Any]] | None, trial_ids: Sequence[str]) -> dict[str, Curve]:
    """The milestone curves of ``trial_ids`` that ``records()`` (the sweep's :class:`TrialRecord` list) holds.

    Raises:
        LookupError: no records attached (``records`` None); what ``records()`` raises.
    """
    if records is None:
        raise LookupError("no records attached")
    by_id = {r.trial_id: r for r in records()}
    return {t: (by_id[t].tokens, by_id[t].val_loss) for t in trial_ids if t in by_id}


def label_group_trial(sub: Any, batch_size: int, trial_id: str, lr: float) -> None:
    """Label a group's Optuna trial (``trial_id``, its primary) for optuna-dashboard just after it is asked: its LR
    and batch size as user attributes (:data:`LR_ATTR`, :data:`BATCH_SIZE_ATTR`), and the study's metric by name
    where it has none yet. ``sub``: the batch size's ``OptunaSearch``."""
    study = optuna_search_study(sub)
    if study.metric_names is None:  # what it is told until a group's records say otherwise (tell_group)
        name_metric(study, TOKENS_TO_TARGET)
    trial = optuna_search_trials(sub)[trial_id]
    trial.set_user_attr(LR_ATTR, float(lr))
    trial.set_user_attr(BATCH_SIZE_ATTR, batch_size)


def tell_group(
    sub: Any,
    group: Any,
    finals: dict[str, float],
    objectives: dict[int, dict[str, Any]],
    records: Callable[[], list[Any]] | None,
    budget_tokens: float,
) -> None:
    """Tell ``group``'s Optuna trial its value and say in its user attributes (and its study's) what it is.

    Args:
        sub: the batch size's ``OptunaSearch``.
        group: the finished group (none of its seeds pruned; at least one completed).
        finals: the final loss (nats) of each completed seed, by Tune trial id.
        objectives: per batch size ``{"objective": TOKENS_TO_TARGET | FINAL_LOSS, "target_loss": nats | None}``
            (the searcher's, saved with it): the batch size's entry is fixed here when its first group ends.
        records: ``records() -> list[TrialRecord]``, the trials so far; None when not attached.
        budget_tokens: training tokens per trial.
    """
    b, mean_final = group.batch, sum(finals.values()) / len(finals)
    state = objectives.get(b)
    curves: dict[str, Curve] = {}
    if state is None or state["objective"] == TOKENS_TO_TARGET:
        try:
            curves = curves_of(records, list(finals))
            if len(curves) < len(finals):
                log.warning(
                    "batch size %d: no record of trials %s; told as not reaching the target loss",
                    b,
                    sorted(set(finals) - set(curves)),
                )
        except Exception as exc:
            if state is None:
                log.warning(
                    "batch size %d: the trials' records cannot be read (%r); its study is told the "
                    "final validation loss, not tokens to a target",
                    b,
                    exc,
                )
                state = objectives[b] = {"objective": FINAL_LOSS, "target_loss": None}
            else:
                log.exception(
                    "batch size %d: the trials' records cannot be read; group %s is told as not "
                    "reaching the target loss (ordered by its final loss)",
                    b,
                    group.primary,
                )
    if state is None:
        state = objectives[b] = {"objective": TOKENS_TO_TARGET, "target_loss": None}
    if state["objective"] == FINAL_LOSS:
        value, attrs = mean_final, {OBJECTIVE_ATTR: FINAL_LOSS, FINAL_ATTR: mean_final}
    else:
        if state["target_loss"] is None:
            state["target_loss"] = common_target([curves.get(t) for t in finals])
        seeds = [seed_value(curves.get(t), f, state["target_loss"], budget_tokens) for t, f in finals.items()]
        value = sum(v for v, _ in seeds) / len(seeds)
        attrs = {
            OBJECTIVE_ATTR: TOKENS_TO_TARGET,
            TARGET_ATTR: state["target_loss"],
            TOKENS_ATTR: [tok for _, tok in seeds],
            FINAL_ATTR: mean_final,
        }
    if group.primary in optuna_search_completed(sub):
        return  # told before the searcher was last saved (a restored sweep ran its last seed again)
    study = optuna_search_study(sub)
    for k in (OBJECTIVE_ATTR, TARGET_ATTR):
        if k in attrs and study.user_attrs.get(k) != attrs[k]:
            study.set_user_attr(k, attrs[k])
    name_metric(study, state["objective"])
    try:
        for k, v in attrs.items():
            optuna_search_trials(sub)[group.primary].set_user_attr(k, v)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # told in a run the saved state does not know of: OptunaSearch logs it and tells nothing
    sub.on_trial_complete(group.primary, {OBJECTIVE: value})
