import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from workloads.config import ModelConfig
from workloads.model.flops import (
    FLOPS_CONVENTION,
    TransformerShape,
    flops_per_token,
    lora_flops_per_token,
    matmul_params,
    shape_of,
    unknown_architecture,
)
from workloads.model.hf import hf_config

T, V = 32, 256
_DENSE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
#: one tiny model per family the formula knows; GQA everywhere but GPT-2 (which has none), Qwen3 with a
#: head_dim that is not hidden/heads, one tied head
FAMILIES = {
    "llama": dict(model_type="llama", **_DENSE),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True, **_DENSE),
    "mistral": dict(model_type="mistral", **_DENSE),
    "qwen2": dict(model_type="qwen2", **_DENSE),
    "qwen3": dict(model_type="qwen3", head_dim=32, **_DENSE),
    "olmo2": dict(model_type="olmo2", **_DENSE),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_inner=128, n_layer=2, n_head=4),
    "gpt2-shorthand": None,  # the five-number form, as the main job builds it
}
#: Measured (transformers 5.24, torch 2.13): every family matches exactly, since the counter, like the
#: formula, sees only matmuls (embedding lookups, norms, softmax, rotary element-wise work, the loss are
#: neither's). The slack is for a version whose rotary embedding does its inv_freq x positions as a
#: matmul (d_head FLOPs per token, forward only: ~1e-4 of these totals).
REL_TOL = 1e-3


def _counted_flops_per_token(hf) -> float:
    """FLOPs of one forward + backward of a batch, by torch's counter, per token."""
    torch.manual_seed(0)
    # eager attention: the CPU SDPA kernel is not seen by FlopCounterMode
    model = AutoModelForCausalLM.from_config(hf, attn_implementation="eager")
    x = torch.randint(0, V, (2, T))
    with FlopCounterMode(display=False) as fc:
        logits = model(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, V), x.reshape(-1)).backward()
    return fc.get_total_flops() / x.numel()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_flops_per_token_matches_torch_flop_counter(name):
    mc = (
        ModelConfig(family="gpt2", d_model=64, n_layers=2, n_heads=4, d_ff=256, context_length_tokens=T)
        if FAMILIES[name] is None
        else ModelConfig(context_length_tokens=T, hf_config=FAMILIES[name])
    )
    hf = hf_config(mc, V)
    counted = _counted_flops_per_token(hf)
    ours = flops_per_token(shape_of(hf, T))
    assert ours == pytest.approx(counted, rel=REL_TOL), f"{name}: formula {ours:.0f}, counted {counted:.0f}"
    if hf.model_type == "gpt2":  # no rotary embedding: nothing for the slack to cover
        assert ours == counted


def test_gqa_head_dim_and_gating_enter_the_shape():
    s = shape_of(hf_config(ModelConfig(context_length_tokens=T, hf_config=FAMILIES["qwen3"]), V), T)
    assert (s.n_heads, s.n_kv_heads, s.d_head, s.gated_mlp) == (4, 2, 32, True)
    # q and o: 64 x 128 each; k and v: 64 x 64 each; 3 MLP matrices 64 x 128; 2 layers
    assert matmul_params(s) == 2 * (2 * 64 * 128 + 2 * 64 * 64 + 3 * 64 * 128)
    assert flops_per_token(s) == 6 * matmul_params(s) + 12 * 2 * T * 128 + 6 * 64 * V
    g = shape_of(hf_config(ModelConfig(context_length_tokens=T, hf_config=FAMILIES["gpt2"]), V), T)
    assert (g.n_kv_heads, g.gated_mlp, matmul_params(g)) == (4, False, 2 * (4 * 64 * 64 + 2 * 64 * 128))


@pytest.mark.parametrize(
    "config, reason",
    [
        ({"model_type": "mixtral"}, "model_type 'mixtral' is not one the FLOPs formula knows"),
        ({"model_type": "qwen2_moe"}, "model_type 'qwen2_moe'"),
        ({"model_type": "llama", "num_experts": 8}, "num_experts=8 makes it a mixture of experts"),
        ({"model_type": "mistral", "num_local_experts": 4}, "num_local_experts=4"),
    ],
)
def test_architectures_the_formula_does_not_know(config, reason):
    assert reason in unknown_architecture(config)
    assert unknown_architecture({"model_type": "qwen3", "num_experts": 0}) is None  # 0 experts: dense


def test_flops_by_hand():
    s = TransformerShape(
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        d_ff=512,
        gated_mlp=False,
        vocab_size=65,
        context_length_tokens=128,
    )
    # N = 12 * L * d^2 when d_ff = 4d (Kaplan Table 1)
    assert matmul_params(s) == 12 * 4 * 128**2
    expected = 6 * 12 * 4 * 128**2 + 12 * 4 * 128 * 128 + 6 * 128 * 65
    assert flops_per_token(s) == expected
    assert "6*N_matmul" in FLOPS_CONVENTION


def test_lora_flops_by_hand():
    s = TransformerShape(
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        d_ff=256,
        gated_mlp=False,
        vocab_size=100,
        context_length_tokens=32,
    )
    n = matmul_params(s)
    assert lora_flops_per_token(s, 1000) == 4 * n + 6 * 1000 + 12 * 2 * 32 * 64 + 4 * 64 * 100
