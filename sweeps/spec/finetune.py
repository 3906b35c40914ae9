"""The spec's ``finetune`` section: supervised fine-tuning of a local checkpoint, optionally with LoRA
(``lora``). Both are the trial config's sections (:class:`workloads.api.FinetuneConfig`,
:class:`workloads.api.LoraConfig`), defined once there; here they only take the spec's names and docstrings.

Plain data: imports neither torch nor Ray, so the REST service can use it.
"""

from __future__ import annotations

from workloads.api import FinetuneConfig, LoraConfig

__all__ = ["FinetuneSpec", "LoraSpec"]


class LoraSpec(LoraConfig):
    """LoRA adapters through ``peft``."""


class FinetuneSpec(FinetuneConfig):
    """Supervised fine-tuning of a local Hugging Face checkpoint on instruction JSON Lines."""

    lora: LoraSpec | None = None  # the same section, under the spec's name  # pyright: ignore[reportIncompatibleVariableOverride]
