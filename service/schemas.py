"""Response bodies of the REST API (the request body is a sweep spec: ``sweeps.spec.SweepSpec``)."""

from __future__ import annotations

import math
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, Field

from sweeps.remote import TrialCounts
from sweeps.spec.result import CbsResult
from sweeps.spec.statuses import SERVED_STATUSES

#: trials by outcome (``done``: completed normally; ``stopped``: cut short by a stop); the dataclass that
#: ``sweeps.remote.status`` counts them in, served as it is
TrialCountsOut = TrialCounts

__all__ = [
    "BestTrialOut",
    "ConflictOut",
    "ErrorOut",
    "FieldErrorOut",
    "HealthOut",
    "InvalidRequestOut",
    "ReadyOut",
    "ReportOut",
    "SweepCreatedOut",
    "SweepOut",
    "SweepPageOut",
    "SweepStatusName",
    "SweepStoppedOut",
    "TrialCountsOut",
    "finite",
]

#: A sweep's status as served (``sweeps.spec.statuses.SERVED_STATUSES``).
# a Literal over the tuple's strings at run time; a type checker reads no values out of a tuple constant
SweepStatusName: TypeAlias = Literal[SERVED_STATUSES]  # pyright: ignore[reportInvalidTypeForm]


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


class BestTrialOut(BaseModel):
    """The trial with the lowest validation loss so far (at its latest milestone)."""

    trial_id: str | None = None
    run_id: str
    status: str | None = None
    val_loss: float
    batch_size_sequences: int | None = None
    lr: float | None = None
    lr_rule: str | None = None
    beta2: float | None = None


class SweepOut(BaseModel):
    """A sweep's state: Ray's job status corrected by its MLflow runs."""

    id: str
    status: SweepStatusName
    ray_status: str = Field(description="the Ray job's own status")
    name: str | None = None
    reason: str | None = Field(default=None, description="why it FAILED or was STOPPED")
    submitted_at: str | None = None
    ended_at: str | None = None
    trials: TrialCounts | None = Field(default=None, description="null when MLflow could not be read")
    best: BestTrialOut | None = None
    result: dict[str, float | None] | None = Field(default=None, description="b_crit and friends once analysed")
    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    mlflow_error: str | None = None
    links: dict[str, str] = Field(default_factory=dict)


class SweepStoppedOut(SweepOut):
    stop_sent: bool = Field(description="False when the sweep had already ended")


class SweepCreatedOut(BaseModel):
    id: str
    status: SweepStatusName
    warnings: list[str] = Field(default_factory=list)
    links: dict[str, str] = Field(default_factory=dict)


class SweepPageOut(BaseModel):
    items: list[SweepOut]
    total: int
    limit: int
    offset: int
    next_offset: int | None = None


class ReportOut(BaseModel):
    """The sweep's ``cbs.json`` and where its runs are in MLflow."""

    id: str
    status: SweepStatusName
    cbs: CbsResult | None
    mlflow: dict[str, Any]


class FieldErrorOut(BaseModel):
    path: str = Field(
        description="dotted path of the field, e.g. search.batch_sizes_sequences.2; <root> for the whole body"
    )
    message: str


class InvalidRequestOut(BaseModel):
    detail: str
    errors: list[FieldErrorOut]


class ErrorOut(BaseModel):
    detail: str


class ConflictOut(BaseModel):
    detail: str
    id: str
    status: str
    same_spec: bool


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    """``/readyz``: ``ok`` when Ray's job server and MLflow answer; each dependency's state."""

    status: str
    ray: str
    mlflow: str
