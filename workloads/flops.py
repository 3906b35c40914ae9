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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FLOPS_CONVENTION", "TransformerShape", "flops_per_token", "matmul_params", "lora_flops_per_token"]

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
    """

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    gated_mlp: bool
    vocab_size: int
    context_length_tokens: int

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


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


def lora_flops_per_token(
    shape: TransformerShape, adapter_params: int, *, frozen_head: bool = True
) -> float:
    """Training FLOPs per token for LoRA fine-tuning (methodology note section 9.4).

    Frozen weights cost a forward (2N) and the activation gradient (2N), not a weight gradient:
    ``c_tok = 4*N_frozen + 6*N_adapter + 12*n_layer*n_ctx*d_attn + (4 or 6)*d_model*V``.
    """
    attention = 12 * shape.n_layers * shape.context_length_tokens * shape.n_heads * shape.d_head
    head = (4 if frozen_head else 6) * shape.d_model * shape.vocab_size
    return float(4 * matmul_params(shape) + 6 * adapter_params + attention + head)
