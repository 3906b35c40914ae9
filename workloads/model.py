"""Hugging Face causal-LM construction (never a hand-written transformer).

Pretraining builds a model from a ``transformers`` config; fine-tuning loads a local checkpoint
directory with ``from_pretrained`` (no hub access).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workloads.flops import TransformerShape

__all__ = ["ModelConfig", "build_model", "shape_of", "peak_flops_per_s", "DEVICE_PEAK_BF16_FLOPS"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a pretraining model (mirrors ``sweeps.spec.ModelSpec``)."""

    family: str
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    context_length_tokens: int
    vocab_size: int
    tie_word_embeddings: bool = False


def _hf_config(cfg: ModelConfig):
    if cfg.family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=cfg.vocab_size,
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
            vocab_size=cfg.vocab_size,
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


def build_model(cfg: ModelConfig) -> torch.nn.Module:
    """A freshly initialised ``transformers`` causal LM (uses the current torch RNG state)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(_hf_config(cfg), attn_implementation="sdpa")


def shape_of(hf_config, context_length_tokens: int | None = None) -> TransformerShape:
    """The FLOP-counting shape of a Hugging Face config (Llama-, Qwen-, Mistral- or GPT-2-style)."""
    d = getattr(hf_config, "hidden_size", None) or hf_config.n_embd
    n_layers = getattr(hf_config, "num_hidden_layers", None) or hf_config.n_layer
    n_heads = getattr(hf_config, "num_attention_heads", None) or hf_config.n_head
    n_kv = getattr(hf_config, "num_key_value_heads", None) or n_heads
    model_type = getattr(hf_config, "model_type", "")
    if model_type == "gpt2":
        d_ff = hf_config.n_inner or 4 * d
        gated = False
        ctx = context_length_tokens or hf_config.n_positions
    else:
        d_ff = hf_config.intermediate_size
        gated = True
        ctx = context_length_tokens or hf_config.max_position_embeddings
    return TransformerShape(
        d_model=d, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, d_ff=d_ff, gated_mlp=gated,
        vocab_size=hf_config.vocab_size, context_length_tokens=ctx,
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
