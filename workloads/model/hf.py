"""Hugging Face causal-LM construction (never a hand-written transformer).

Pretraining builds a model from a ``transformers`` config; fine-tuning loads a local checkpoint
directory with ``from_pretrained`` (no hub access).
"""

from __future__ import annotations

from typing import Any

import torch

from workloads.config import ModelConfig
from workloads.errors import DataError
from workloads.model.flops import (
    FLOPS_CONVENTION,
    GIVEN_FLOPS_CONVENTION,
    flops_per_token,
    shape_of,
    unknown_architecture,
)

__all__ = [
    "DEVICE_PEAK_BF16_FLOPS",
    "build_model",
    "check_model_config",
    "hf_config",
    "model_flops_per_token",
    "model_vocab_size",
    "peak_flops_per_s",
    "shape_of",
]

#: keys of a saved ``config.json`` that describe a checkpoint, not the architecture: dropped, so a config
#: saved in bf16 still trains with float32 weights (the precision is the training loop's choice)
_NOT_ARCHITECTURE = ("torch_dtype", "dtype", "architectures", "transformers_version", "_name_or_path")


def _shorthand(cfg: ModelConfig, vocab_size: int) -> dict[str, Any]:
    """``AutoConfig.for_model`` arguments of the five-number form (Llama or GPT-2), as built since the first version."""
    if cfg.family == "llama":
        return {
            "model_type": "llama",
            "vocab_size": vocab_size,
            "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff_resolved,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_heads,
            "max_position_embeddings": cfg.context_length_tokens,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        }
    if cfg.family == "gpt2":
        return {
            "model_type": "gpt2",
            "vocab_size": vocab_size,
            "n_embd": cfg.d_model,
            "n_inner": cfg.d_ff_resolved,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_positions": cfg.context_length_tokens,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": None,
            "eos_token_id": None,
        }
    raise ValueError(f"unknown model family {cfg.family!r}; expected 'llama' or 'gpt2'")


def _given_config(cfg: ModelConfig) -> dict[str, Any] | None:
    """``model.hf_config`` as the mapping a trial builds from (a config.json path is read into one when the
    sweep starts), or None for the shorthand.

    Raises:
        DataError: still a path.
    """
    if isinstance(cfg.hf_config, str):
        raise DataError(f"model.hf_config: {cfg.hf_config!r} is a path, not the mapping read from it")
    return cfg.hf_config


def model_vocab_size(cfg: ModelConfig, tokenizer_vocab_size: int) -> int:
    """Rows of the model's embedding (ids it accepts): ``hf_config.vocab_size`` when the config gives one,
    else the tokenizer's (the shorthand always takes the tokenizer's).

    Raises:
        DataError: ``model.hf_config.vocab_size`` smaller than the tokenizer's vocabulary.
    """
    given = (_given_config(cfg) or {}).get("vocab_size")
    if given is None:
        return tokenizer_vocab_size
    if not isinstance(given, int) or isinstance(given, bool) or given < tokenizer_vocab_size:
        raise DataError(
            f"model.hf_config.vocab_size: {given!r} is smaller than the tokenizer's vocabulary "
            f"({tokenizer_vocab_size} ids): the model could not embed every token"
        )
    return given


def hf_config(cfg: ModelConfig, vocab_size: int):
    """The ``transformers`` config (``AutoConfig.for_model``) of ``cfg`` for a tokenizer of ``vocab_size`` ids.

    The shorthand (``cfg.hf_config`` None) is a Llama or GPT-2 with no bos/eos/pad ids (the byte
    tokenizer has none), GPT-2 without dropout. A given ``hf_config`` is taken as it is, but its
    vocabulary is :func:`model_vocab_size`, its maximum positions default to
    ``context_length_tokens``, and a saved config's ``torch_dtype``/``dtype`` (and other checkpoint
    facts, :data:`_NOT_ARCHITECTURE`) are dropped: weights are float32.

    Raises:
        ValueError: an unknown ``family``.
        DataError: ``model.hf_config...``: an unknown ``model_type``, a value ``transformers``
            refuses, a vocabulary smaller than the tokenizer's, maximum positions shorter than
            ``context_length_tokens``.
    """
    from transformers import AutoConfig

    given = _given_config(cfg)
    if given is None:
        kwargs = _shorthand(cfg, vocab_size)
    else:
        kwargs = {**given, "vocab_size": model_vocab_size(cfg, vocab_size)}
        for stored in _NOT_ARCHITECTURE:
            kwargs.pop(stored, None)
    model_type = kwargs.pop("model_type", None)
    try:
        hf = AutoConfig.for_model(model_type, **kwargs)
    except ValueError as exc:
        if str(exc).startswith("Unrecognized model identifier"):
            raise DataError(f"model.hf_config.model_type: {model_type!r} is not a transformers model type") from None
        raise DataError(f"model.hf_config: transformers refuses the config: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - transformers' strict-dataclass checks raise their own types
        first = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2]) or type(exc).__name__
        raise DataError(f"model.hf_config: transformers refuses the config: {first}") from None
    if given is not None:
        _fit_positions(hf, cfg, given)
    return hf


def _fit_positions(hf, cfg: ModelConfig, config: dict[str, Any]) -> None:
    """Maximum positions: the context length unless ``config`` (``model.hf_config``) gives them (then at least
    that)."""
    given = config.get("max_position_embeddings", config.get("n_positions"))
    if given is None:
        hf.max_position_embeddings = cfg.context_length_tokens  # GPT-2 maps it to n_positions
    elif given < cfg.context_length_tokens:
        raise DataError(
            f"model.hf_config.max_position_embeddings: {given} positions are fewer than "
            f"model.context_length_tokens={cfg.context_length_tokens}"
        )


def build_model(cfg: ModelConfig, vocab_size: int) -> torch.nn.Module:
    """A freshly initialised ``transformers`` causal LM (uses the current torch RNG state).

    Raises:
        DataError: see :func:`hf_config`.
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(hf_config(cfg, vocab_size), attn_implementation="sdpa")


def model_flops_per_token(cfg: ModelConfig, hf) -> tuple[float, str]:
    """``(training FLOPs per token, convention)`` of the model ``hf`` (its ``transformers`` config).

    ``cfg.flops_per_token`` when the spec gives it (:data:`GIVEN_FLOPS_CONVENTION`), else
    ``workloads.model.flops.flops_per_token`` (:data:`workloads.model.flops.FLOPS_CONVENTION`) at
    ``cfg.context_length_tokens``.

    Raises:
        DataError: ``model.hf_config``: an architecture the formula does not know
            (``workloads.model.flops.unknown_architecture``) and no ``flops_per_token``.
    """
    if cfg.flops_per_token is not None:
        return float(cfg.flops_per_token), GIVEN_FLOPS_CONVENTION
    why = unknown_architecture(hf.to_dict())
    if why is not None:
        raise DataError(f"model.hf_config: {why}; give model.flops_per_token (training FLOPs per token) to run it")
    return flops_per_token(shape_of(hf, cfg.context_length_tokens)), FLOPS_CONVENTION


def check_model_config(cfg: ModelConfig, tokenizer_vocab_size: int) -> dict[str, Any]:
    """Build the model's config as a trial would, before launch (no weights are made).

    Returns:
        ``model_type``, ``vocab_size`` (:func:`model_vocab_size`: what shards' ids must stay below),
        ``flops_per_token`` and ``flops_convention`` (:func:`model_flops_per_token`).

    Raises:
        DataError: see :func:`hf_config` and :func:`model_flops_per_token`.
    """
    hf = hf_config(cfg, tokenizer_vocab_size)
    c_tok, convention = model_flops_per_token(cfg, hf)
    return {
        "model_type": hf.model_type,
        "vocab_size": hf.vocab_size,
        "flops_per_token": c_tok,
        "flops_convention": convention,
    }


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
