"""The critical batch size across token budgets: members, the power law with its interval, the prediction at a
production budget and the published laws beside it."""

from sweeps.scaling.law import LAW_STATUSES, PowerLaw, Prediction, StudyMember, fit_power_law, log_standard_error
from sweeps.scaling.study import answer_sentence, member_from_cbs, member_from_csv, scale_result

__all__ = [
    "LAW_STATUSES",
    "PowerLaw",
    "Prediction",
    "StudyMember",
    "answer_sentence",
    "fit_power_law",
    "log_standard_error",
    "member_from_cbs",
    "member_from_csv",
    "scale_result",
]
