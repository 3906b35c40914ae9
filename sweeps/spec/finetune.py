"""The spec's ``finetune`` section: supervised fine-tuning of a local checkpoint, optionally with LoRA.

Plain data: imports neither torch nor Ray, so the REST service can use it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sweeps.spec.sections import PositiveInt, _Strict

__all__ = ["FinetuneSpec", "LoraSpec"]

class LoraSpec(_Strict):
    """LoRA adapters through ``peft``."""

    rank: PositiveInt = Field(default=8, le=4096)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)


class FinetuneSpec(_Strict):
    """Supervised fine-tuning of a local Hugging Face checkpoint on instruction JSON Lines."""

    checkpoint_dir: str
    prompt_field: str = "question"
    response_field: str = "answer"
    prompt_template: str = "Question: {prompt}\nAnswer: "
    packing: Literal["packed", "padded"] = "packed"
    truncate: bool = Field(default=False, description="truncate over-long examples (counted and reported) instead of refusing")
    lora: LoraSpec | None = None
