"""LoRA adapters through ``peft``, and the FLOPs per token of fine-tuning (full or LoRA)."""

from __future__ import annotations

import warnings

import torch

from workloads.config import LoraConfig
from workloads.errors import DataError
from workloads.finetune.checkpoint import load_checkpoint_config
from workloads.model.flops import FLOPS_CONVENTION, flops_per_token, lora_flops_per_token
from workloads.model.hf import shape_of

__all__ = [
    "LORA_FLOPS_CONVENTION",
    "count_adapter_params",
    "finetune_flops_convention",
    "finetune_flops_per_token",
    "lora_config",
]


def lora_config(lora: LoraConfig):
    """The ``peft.LoraConfig`` of causal-LM fine-tuning with these adapters (no bias terms).

    Target modules match ``peft``'s way: a module whose name ends with one of the given names.
    """
    from peft import LoraConfig as PeftLoraConfig

    # peft annotates lora_alpha as int; it only divides it by r, so a float alpha scales as written
    return PeftLoraConfig(
        r=int(lora.rank),
        lora_alpha=float(lora.alpha),  # pyright: ignore[reportArgumentType] lora_dropout=float(lora.dropout),
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def count_adapter_params(hf_config, lora: LoraConfig) -> int:
    """Parameters the LoRA adapters add to a model of ``hf_config``: ``sum r*(d_in + d_out)`` over targets.

    Counted by applying ``peft`` to the model built on the ``meta`` device (no memory, no weights),
    so the module matching is exactly the one training uses.

    Raises:
        DataError: no module of the model matches ``target_modules``.
    """
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    try:
        with warnings.catch_warnings():  # peft's own use of a deprecated transformers name; not the user's concern
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            peft_model = get_peft_model(model, lora_config(lora))
    except ValueError as exc:
        names = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
            }
        )
        raise DataError(f"finetune.lora.target_modules: {exc} (this model's linear layers: {names})") from None
    return sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


#: The LoRA counterpart of ``workloads.model.flops.FLOPS_CONVENTION`` (methodology section 9.4).
LORA_FLOPS_CONVENTION = (
    "4*N_matmul + 6*N_adapter + 12*n_layer*n_ctx*d_attn + 4*d_model*vocab "
    "(frozen weights: fwd + activation grad; adapters: fwd + both grads; dense attention, no norms)"
)


def finetune_flops_convention(lora: LoraConfig | None) -> str:
    """The FLOP-counting convention of a fine-tuning run, to log beside its FLOPs per token."""
    return FLOPS_CONVENTION if lora is None else LORA_FLOPS_CONVENTION


def finetune_flops_per_token(checkpoint_dir: str, context_length_tokens: int, lora: LoraConfig | None) -> float:
    """Training FLOPs per real token of fine-tuning a checkpoint (``workloads.model.flops`` convention).

    Full fine-tuning: ``flops_per_token`` (6 N_matmul + 12 n_layer n_ctx d_attn + 6 d V).
    LoRA: ``lora_flops_per_token`` (methodology section 9.4): frozen weights cost forward plus the
    activation gradient, ``4 N_frozen + 6 N_adapter + 12 n_layer n_ctx d_attn + 4 d V``; layers below
    the lowest adapter are charged the full backward too (an upper bound by at most 2 N per token).

    Args:
        checkpoint_dir: the model (see :func:`workloads.finetune.checkpoint.resolve_checkpoint`).
        context_length_tokens: n_ctx, the fine-tuning sequence length (dense attention over it).
        lora: None (full fine-tuning), or the adapters.

    Raises:
        DataError: missing checkpoint; LoRA targets that match nothing.
    """
    hf = load_checkpoint_config(checkpoint_dir)
    shape = shape_of(hf, context_length_tokens)
    if lora is None:
        return flops_per_token(shape)
    return lora_flops_per_token(shape, count_adapter_params(hf, lora), frozen_head=True)
