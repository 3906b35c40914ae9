"""The analysis: trials -> steps to a target per batch size (:mod:`~sweeps.analysis.targets`) -> a fit by name
(:mod:`~sweeps.analysis.fits`; the hyperbola, :mod:`~sweeps.analysis.fit`) and its interval -> ``cbs.json``
(:mod:`~sweeps.analysis.sweep`, its record :class:`~sweeps.spec.result.CbsResult`)
-> the HTML report (:mod:`~sweeps.analysis.report`, imported on its own: it loads matplotlib). Pure:
imports neither Ray nor MLflow.
"""

from sweeps.analysis.fit import (
    INTERVAL_METHOD,
    STATUSES,
    HyperbolaFit,
    analyze_points,
    cbs_20,
    cbs_20_interval,
    fit_hyperbola,
    interval_b_crit,
)
from sweeps.analysis.fits import DEFAULT_FIT, Fit, fit_names, get_fit, register_fit
from sweeps.analysis.result import finite_json, finite_result, with_sweep_fields
from sweeps.analysis.sweep import analyze_csv, analyze_trials, analyze_trials_file, analyze_trials_files
from sweeps.analysis.targets import (
    TARGET_RULE,
    TrialRecord,
    censored_points,
    choose_targets,
    steps_to_target_points,
    tokens_to_target,
)
from sweeps.spec.result import CbsResult

__all__ = [
    "DEFAULT_FIT",
    "INTERVAL_METHOD",
    "STATUSES",
    "TARGET_RULE",
    "CbsResult",
    "Fit",
    "HyperbolaFit",
    "TrialRecord",
    "analyze_csv",
    "analyze_points",
    "analyze_trials",
    "analyze_trials_file",
    "analyze_trials_files",
    "cbs_20",
    "cbs_20_interval",
    "censored_points",
    "choose_targets",
    "finite_json",
    "finite_result",
    "fit_hyperbola",
    "fit_names",
    "get_fit",
    "interval_b_crit",
    "register_fit",
    "steps_to_target_points",
    "tokens_to_target",
    "with_sweep_fields",
]
