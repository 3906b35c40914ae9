"""FLOPs per trained token of a decoder-only transformer (methodology note section 9).

Convention (logged with every trial as ``flops_convention``)::

    c_tok = 6 * N_matmul                      # weight matmuls of all blocks, forward + backward
          + 12 * n_layer * n_ctx * d_attn     # attention scores and values, forward + backward,
                                              #   full n_ctx per token (what a dense kernel computes;
                                              #   the causal mask is not discounted), gamma = 1
          + 6 * d_model * V                   # LM head

Embedding lookups, norms, softmax and element-wise work are not counted. This is DeepSeek's
``72 n_layer d^2 + 12 n_layer d l_seq`` (DeepSeek LLM, arXiv 2401.02954, section 3.1) generalised
to any MLP width and to gated MLPs, plus the LM head (Kaplan et al. 2020, Table 1).

Per block, ``N_matmul`` is ``d*(h*d_head) + 2*d*(h_kv*d_head) + (h*d_head)*d`` for the query, key,
value and output projections (grouped-query attention shrinks only the key and value ones:
``h_kv = num_key_value_heads``) plus ``3*d*d_ff`` for a gated MLP (gate, up, down: Llama, Mistral,
Qwen2, Qwen3, OLMo-2) or ``2*d*d_ff`` (GPT-2). ``d_attn = h*d_head``, with ``d_head`` the config's
``head_dim`` where it has one (Qwen3's is not ``d/h``). The LM head costs ``6*d*V`` tied or untied:
a tied head still does its forward and both backward matmuls; tying changes the parameter count,
not the FLOPs. Biases (Qwen2's q/k/v, GPT-2's) are additions, not counted. Checked against
``torch.utils.flop_counter.FlopCounterMode`` for each family (``tests/workloads/model/test_flops.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.errors import DataError

__all__ = [
    "FLOPS_CONVENTION",
    "FLOPS_MODEL_TYPES",
    "GIVEN_FLOPS_CONVENTION",
    "MOE_CONFIG_KEYS",
    "TransformerShape",
    "flops_per_token",
    "lora_flops_per_token",
    "matmul_params",
    "shape_of",
    "unknown_architecture",
]

#: the convention logged when the spec gives ``model.flops_per_token`` itself (an architecture the formula does not know)
GIVEN_FLOPS_CONVENTION = "given by the spec (model.flops_per_token)"
FLOPS_CONVENTION = "6*N_matmul + 12*n_layer*n_ctx*d_attn + 6*d_model*vocab (fwd+bwd, dense attention, no norms)"


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    """Shape of a decoder-only transformer, enough to count its FLOPs.

    Attributes:
        d_model: residual width.
        n_layers: number of blocks.
        n_heads: attention heads; ``n_kv_heads`` key/value heads (grouped-query attention).
        d_ff: MLP hidden width.
        gated_mlp: True for SwiGLU-style MLPs (3 matrices), False for 2.
        vocab_size: LM head output size.
        context_length_tokens: n_ctx.
        head_dim: width of one attention head; None: ``d_model // n_heads``.
    """

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    gated_mlp: bool
    vocab_size: int
    context_length_tokens: int
    head_dim: int | None = None

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


def matmul_params(shape: TransformerShape) -> int:
    """Weights that take part in matmuls per token in the blocks (no embeddings, no LM head)."""
    d, dh = shape.d_model, shape.d_head
    attn = d * (shape.n_heads * dh) + 2 * d * (shape.n_kv_heads * dh) + (shape.n_heads * dh) * d
    mlp = (3 if shape.gated_mlp else 2) * d * shape.d_ff
    return shape.n_layers * (attn + mlp)


def flops_per_token(shape: TransformerShape) -> float:
    """Training FLOPs (forward + backward) per token, by the module's convention.

    Returns:
        ``c_tok`` in FLOPs per trained token.
    """
    attention = 12 * shape.n_layers * shape.context_length_tokens * shape.n_heads * shape.d_head
    head = 6 * shape.d_model * shape.vocab_size
    return float(6 * matmul_params(shape) + attention + head)


def lora_flops_per_token(shape: TransformerShape, adapter_params: int, *, frozen_head: bool = True) -> float:
    """Training FLOPs per token for LoRA fine-tuning (methodology note section 9.4).

    Frozen weights cost a forward (2N) and the activation gradient (2N), not a weight gradient:
    ``c_tok = 4*N_frozen + 6*N_adapter + 12*n_layer*n_ctx*d_attn + (4 or 6)*d_model*V``.
    """
    attention = 12 * shape.n_layers * shape.context_length_tokens * shape.n_heads * shape.d_head
    head = (4 if frozen_head else 6) * shape.d_model * shape.vocab_size
    return float(4 * matmul_params(shape) + 6 * adapter_params + attention + head)


#: ``model_type`` values whose blocks the formula knows (dense decoders; see the module docstring)
FLOPS_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gpt2")
#: config keys that mark a mixture of experts (per-token FLOPs depend on the routing: not counted here)
MOE_CONFIG_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)


def unknown_architecture(config: dict[str, Any]) -> str | None:
    """Why the formula cannot count a config's FLOPs, or None when it can.

    Args:
        config: a ``transformers`` config as a dict (``PretrainedConfig.to_dict()`` or the keyword
            arguments of ``AutoConfig.for_model``), ``model_type`` included.

    Returns:
        A sentence naming the ``model_type`` outside :data:`FLOPS_MODEL_TYPES` or the first
        mixture-of-experts key set (:data:`MOE_CONFIG_KEYS`); None for a known dense decoder.
    """
    model_type = config.get("model_type")
    if model_type not in FLOPS_MODEL_TYPES:
        return f"model_type {model_type!r} is not one the FLOPs formula knows ({', '.join(FLOPS_MODEL_TYPES)})"
    moe = [k for k in MOE_CONFIG_KEYS if config.get(k)]
    if moe:
        return f"{moe[0]}={config[moe[0]]!r} makes it a mixture of experts, which the FLOPs formula does not count"
    return None


def shape_of(hf: Any, context_length_tokens: int | None = None) -> TransformerShape:
    """The FLOP-counting shape of a ``transformers`` config of a family in :data:`FLOPS_MODEL_TYPES`.

    Args:
        hf: the config (``hidden_size``/``n_embd``, ``num_hidden_layers``/``n_layer``,
            ``num_attention_heads``/``n_head``, ``num_key_value_heads``, ``head_dim``,
            ``intermediate_size``/``n_inner``, ``vocab_size``).
        context_length_tokens: ``n_ctx``; None: the config's maximum positions.

    Raises:
        DataError: :func:`unknown_architecture` names a reason (also at validation: a fine-tuning
            checkpoint of another family is refused, not miscounted).
    """
    why = unknown_architecture(hf.to_dict())
    if why is not None:
        raise DataError(why)
    if hf.model_type == "gpt2":
        d, n_heads = hf.n_embd, hf.n_head
        return TransformerShape(
            d_model=d,
            n_layers=hf.n_layer,
            n_heads=n_heads,
            n_kv_heads=n_heads,
            d_ff=hf.n_inner or 4 * d,
            gated_mlp=False,
            vocab_size=hf.vocab_size,
            context_length_tokens=context_length_tokens or hf.n_positions,
        )
    d, n_heads = hf.hidden_size, hf.num_attention_heads
    return TransformerShape(
        d_model=d,
        n_layers=hf.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(hf, "num_key_value_heads", None) or n_heads,
        d_ff=hf.intermediate_size,
        gated_mlp=True,
        vocab_size=hf.vocab_size,
        context_length_tokens=context_length_tokens or hf.max_position_embeddings,
        head_dim=getattr(hf, "head_dim", None) or d // n_heads,
    )
