"""Hugging Face causal-LM construction (never a hand-written transformer).

Pretraining builds a model from a ``transformers`` config; fine-tuning loads a local checkpoint
directory with ``from_pretrained`` (no hub access).
"""

from __future__ import annotations

import torch

from workloads.config import ModelConfig
from workloads.flops import TransformerShape

__all__ = ["hf_config", "build_model", "shape_of", "peak_flops_per_s", "DEVICE_PEAK_BF16_FLOPS"]


def hf_config(cfg: ModelConfig, vocab_size: int):
    """The ``transformers`` config of an architecture (Llama or GPT-2) with ``vocab_size`` ids.

    No bos/eos/pad ids (the byte tokenizer has none); GPT-2 without dropout.

    Raises:
        ValueError: an unknown ``family``.
    """
    if cfg.family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=cfg.d_model,
            intermediate_size=cfg.d_ff,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.n_heads,
            max_position_embeddings=cfg.context_length_tokens,
            tie_word_embeddings=cfg.tie_word_embeddings,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
    if cfg.family == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=vocab_size,
            n_embd=cfg.d_model,
            n_inner=cfg.d_ff,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_positions=cfg.context_length_tokens,
            tie_word_embeddings=cfg.tie_word_embeddings,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
        )
    raise ValueError(f"unknown model family {cfg.family!r}; expected 'llama' or 'gpt2'")


def build_model(cfg: ModelConfig, vocab_size: int) -> torch.nn.Module:
    """A freshly initialised ``transformers`` causal LM (uses the current torch RNG state)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(hf_config(cfg, vocab_size), attn_implementation="sdpa")


def shape_of(hf, context_length_tokens: int | None = None) -> TransformerShape:
    """The FLOP-counting shape of a Hugging Face config (Llama-, Qwen-, Mistral- or GPT-2-style)."""
    d = getattr(hf, "hidden_size", None) or hf.n_embd
    n_layers = getattr(hf, "num_hidden_layers", None) or hf.n_layer
    n_heads = getattr(hf, "num_attention_heads", None) or hf.n_head
    n_kv = getattr(hf, "num_key_value_heads", None) or n_heads
    model_type = getattr(hf, "model_type", "")
    if model_type == "gpt2":
        d_ff = hf.n_inner or 4 * d
        gated = False
        ctx = context_length_tokens or hf.n_positions
    else:
        d_ff = hf.intermediate_size
        gated = True
        ctx = context_length_tokens or hf.max_position_embeddings
    return TransformerShape(
        d_model=d, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, d_ff=d_ff, gated_mlp=gated,
        vocab_size=hf.vocab_size, context_length_tokens=ctx,
    )


#: Dense bf16 peak FLOP/s by CUDA device name (vendor data sheets, no sparsity). A device not
#: listed gets no MFU: never a guess.
DEVICE_PEAK_BF16_FLOPS: dict[str, float] = {
    "NVIDIA H200": 989.4e12,
    "NVIDIA H100 80GB HBM3": 989.4e12,
    "NVIDIA H100 PCIe": 756.0e12,
    "NVIDIA A100-SXM4-80GB": 312.0e12,
    "NVIDIA A100-SXM4-40GB": 312.0e12,
    "NVIDIA A100 80GB PCIe": 312.0e12,
    "NVIDIA L4": 121.0e12,
    "NVIDIA A10G": 125.0e12,
}


def peak_flops_per_s(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of ``device`` from :data:`DEVICE_PEAK_BF16_FLOPS`, or None."""
    if device.type != "cuda":
        return None
    return DEVICE_PEAK_BF16_FLOPS.get(torch.cuda.get_device_name(device))
