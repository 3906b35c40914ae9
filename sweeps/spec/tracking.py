"""The spec's ``tracking`` section: where MLflow logs, and the tags every run of a sweep gets.

Plain data: imports neither torch nor Ray, so the REST service can use it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_serializer

from sweeps.spec.sections import _Strict

__all__ = ["COMPARISON_TAG_KEYS", "STUDY_TAG_KEYS", "TrackingSpec"]

#: ``tracking.tags`` keys a comparison (``arms``) sets on its arms' runs; every other ``critbatch.`` key is reserved
COMPARISON_TAG_KEYS = ("critbatch.comparison", "critbatch.arm")
#: the tags a scaling study sets on its members (``sweeps.scaling.run``): the study's name and the member's budget
STUDY_TAG_KEYS = ("critbatch.study", "critbatch.budget_tokens")


class TrackingSpec(_Strict):
    """MLflow tracking. The experiment is named after the sweep unless given.

    ``tags`` are set on the sweep's parent run and on every trial run (MLflow's limits: keys of at
    most 250 characters, values of at most 5000). Keys starting with ``critbatch.`` are the sweep's
    own, except the two a comparison sets on its arms (:data:`COMPARISON_TAG_KEYS`) and the two a scaling study
    sets on its members (:data:`STUDY_TAG_KEYS`).
    """

    uri: str | None = Field(
        default=None,
        description="MLflow tracking URI; default: --tracking-uri, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db",
    )
    experiment: str | None = None
    checkpoint_artifact_max_mb: float = Field(default=50.0, ge=0, le=100_000)
    tags: dict[Annotated[str, Field(min_length=1, max_length=250)], Annotated[str, Field(max_length=5000)]] = Field(
        default_factory=dict, max_length=100, description="extra MLflow tags on the parent run and every trial run"
    )

    @field_validator("tags")
    @classmethod
    def _own_tags(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in v if k.startswith("critbatch.") and k not in COMPARISON_TAG_KEYS + STUDY_TAG_KEYS)
        if reserved:
            raise ValueError(f"{reserved}: keys starting with 'critbatch.' are the sweep's own tags")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)  # no tags: the dump (and fingerprint) of a spec from before the field existed
        if not out.get("tags"):
            out.pop("tags", None)
        return out
