"""The one base exception of ``workloads``: inputs a trial cannot use."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """The inputs cannot be used: a missing, empty or too short corpus, malformed fine-tuning data
    (line and field named), a missing checkpoint, an invalid ``finetune`` section."""
