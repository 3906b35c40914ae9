"""The critical batch size (and B_opt, the best batch size at a fixed budget) across token budgets: members, the
power law with its interval, the prediction at a production budget and the published laws beside it."""

from sweeps.scaling.b_opt import BestBatch, b_opt_from_losses, b_opt_member
from sweeps.scaling.law import LAW_STATUSES, PowerLaw, Prediction, StudyMember, fit_power_law, log_standard_error
from sweeps.scaling.study import answer_sentence, b_opt_result, member_from_cbs, member_from_csv, scale_result

__all__ = [
    "LAW_STATUSES",
    "BestBatch",
    "PowerLaw",
    "Prediction",
    "StudyMember",
    "answer_sentence",
    "b_opt_from_losses",
    "b_opt_member",
    "b_opt_result",
    "fit_power_law",
    "log_standard_error",
    "member_from_cbs",
    "member_from_csv",
    "scale_result",
]
