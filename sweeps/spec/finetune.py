"""The spec's ``finetune`` section: supervised fine-tuning of a local checkpoint, optionally with LoRA
(``lora``: the trial config's :class:`workloads.api.LoraConfig`, whose fields it is).

Plain data: imports neither torch nor Ray, so the REST service can use it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sweeps.spec.sections import _Strict
from workloads.api import LoraConfig

__all__ = ["FinetuneSpec", "LoraSpec"]


class LoraSpec(LoraConfig):
    """LoRA adapters through ``peft``."""


class FinetuneSpec(_Strict):
    """Supervised fine-tuning of a local Hugging Face checkpoint on instruction JSON Lines."""

    checkpoint_dir: str
    prompt_field: str = "question"
    response_field: str = "answer"
    prompt_template: str = "Question: {prompt}\nAnswer: "
    packing: Literal["packed", "padded"] = "packed"
    truncate: bool = Field(default=False, description="truncate over-long examples (counted and reported) instead of refusing")
    lora: LoraSpec | None = None
