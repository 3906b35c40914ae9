import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from workloads.flops import FLOPS_CONVENTION, TransformerShape, flops_per_token, lora_flops_per_token, matmul_params
from workloads.config import ModelConfig
from workloads.model import hf_config, shape_of


@pytest.mark.parametrize("family,d_ff", [("llama", 176), ("gpt2", 256)])
def test_flops_per_token_matches_torch_flop_counter(family, d_ff):
    cfg = ModelConfig(family=family, d_model=64, n_layers=2, n_heads=4, d_ff=d_ff, context_length_tokens=64)
    torch.manual_seed(0)
    # eager attention: the CPU SDPA kernel is not seen by FlopCounterMode
    model = AutoModelForCausalLM.from_config(hf_config(cfg, 256), attn_implementation="eager")
    x = torch.randint(0, 256, (4, 64))
    with FlopCounterMode(display=False) as fc:
        logits = model(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x.reshape(-1)).backward()
    counted = fc.get_total_flops() / x.numel()
    ours = flops_per_token(shape_of(model.config, 64))
    assert ours == pytest.approx(counted, rel=0.10)


def test_flops_by_hand():
    s = TransformerShape(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, d_ff=512, gated_mlp=False,
                         vocab_size=65, context_length_tokens=128)
    # N = 12 * L * d^2 when d_ff = 4d (Kaplan Table 1)
    assert matmul_params(s) == 12 * 4 * 128**2
    expected = 6 * 12 * 4 * 128**2 + 12 * 4 * 128 * 128 + 6 * 128 * 65
    assert flops_per_token(s) == expected
    assert "6*N_matmul" in FLOPS_CONVENTION


def test_lora_flops_by_hand():
    s = TransformerShape(d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=256, gated_mlp=False,
                         vocab_size=100, context_length_tokens=32)
    n = matmul_params(s)
    assert lora_flops_per_token(s, 1000) == 4 * n + 6 * 1000 + 12 * 2 * 32 * 64 + 4 * 64 * 100
