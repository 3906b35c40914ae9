"""The one place ``cbs.json``'s record (:class:`~sweeps.spec.result.CbsResult`) is completed: the fields a
sweep adds to its analysis (:func:`with_sweep_fields`) and the JSON form without non-finite floats
(:func:`finite_json`, :func:`finite_result`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from sweeps.spec.result import CbsResult

__all__ = ["SWEEP_FIELDS", "finite_json", "finite_result", "with_sweep_fields"]

#: the sweep-level fields of ``cbs.json`` that a re-analysis (:func:`sweeps.analysis.sweep.analyze_trials_file`) keeps from the file
SWEEP_FIELDS = (
    "sweep_id",
    "flops_per_token",
    "trials_planned",
    "mlflow",
    "best_checkpoint",
    "local_cbs",
    "optimizer",
    "provenance",
)


def finite_json(o: Any) -> Any:
    """Replace non-finite floats by None, recursively (JSON has no NaN or Infinity); a record of ``cbs.json``
    (:class:`~sweeps.spec.result.CbsResult` or one of its parts) becomes the JSON object it is written as."""
    if isinstance(o, BaseModel):
        return finite_json(o.model_dump(mode="python"))
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_json(v) for v in o]
    return o


def finite_result(result: CbsResult) -> CbsResult:
    """``result`` with every non-finite float replaced by None (:func:`finite_json`): what ``cbs.json`` holds."""
    return CbsResult.model_validate(finite_json(result))


def with_sweep_fields(result: CbsResult, **fields: Any) -> CbsResult:
    """``result`` with the fields a sweep adds to its analysis (``sweep_id``, ``flops_per_token``,
    ``trials_planned``, ``optimizer``, ``provenance``, ``mlflow``, ``precision``, ``best_checkpoint``,
    ``local_cbs``), each validated into its record; the fields keep ``cbs.json``'s order whatever the order given.

    Raises:
        ValueError: a name that is not a field of :class:`~sweeps.spec.result.CbsResult`.
    """
    unknown = sorted(set(fields) - set(CbsResult.model_fields))
    if unknown:
        raise ValueError(f"not fields of cbs.json: {unknown}")
    return CbsResult.model_validate({**result.to_json_dict(), **finite_json(fields)})
