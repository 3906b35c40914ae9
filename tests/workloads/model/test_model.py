"""The model from the spec: the five-number shorthand builds today's model; a Hugging Face config
builds any dense decoder; what cannot be built or counted is refused naming ``model.hf_config...``."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from workloads.config import ModelConfig, TrialConfig
from workloads.errors import DataError
from workloads.model.flops import FLOPS_CONVENTION, GIVEN_FLOPS_CONVENTION
from workloads.model.hf import build_model, check_model_config, hf_config, model_vocab_size

V = 256


def _before_hf_config(cfg: ModelConfig, vocab_size: int):
    """The config ``workloads.model.hf.hf_config`` built for the shorthand before ``hf_config`` existed."""
    if cfg.family == "llama":
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


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(family="llama", d_model=64, n_layers=2, n_heads=4, d_ff=176, context_length_tokens=64),
        ModelConfig(
            family="gpt2",
            d_model=32,
            n_layers=1,
            n_heads=2,
            d_ff=128,
            context_length_tokens=32,
            tie_word_embeddings=True,
        ),
    ],
    ids=["llama", "gpt2-tied"],
)
def test_the_shorthand_builds_the_model_it_built_before(cfg):
    torch.manual_seed(3)
    before = AutoModelForCausalLM.from_config(_before_hf_config(cfg, V), attn_implementation="sdpa")
    torch.manual_seed(3)
    now = build_model(cfg, V)
    assert hf_config(cfg, V).to_dict() == _before_hf_config(cfg, V).to_dict()
    assert sum(p.numel() for p in now.parameters()) == sum(p.numel() for p in before.parameters())
    a, b = _weights(before), _weights(now)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randint(0, V, (2, cfg.context_length_tokens))
    assert torch.equal(before(input_ids=x, labels=x).loss, now(input_ids=x, labels=x).loss)


def test_an_hf_config_with_the_shorthand_values_builds_the_same_model():
    short = ModelConfig(family="llama", d_model=32, n_layers=1, n_heads=2, d_ff=64, context_length_tokens=32)
    full = ModelConfig(
        context_length_tokens=32,
        hf_config=dict(
            model_type="llama",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        ),
    )
    torch.manual_seed(0)
    a = _weights(build_model(short, V))
    torch.manual_seed(0)
    b = _weights(build_model(full, V))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert check_model_config(short, V) == check_model_config(full, V)


def test_vocabulary_from_the_tokenizer_unless_the_config_gives_a_larger_one():
    mc = ModelConfig(hf_config={"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2})
    assert model_vocab_size(mc, V) == V and hf_config(mc, V).vocab_size == V
    padded = ModelConfig(hf_config={"model_type": "llama", "vocab_size": 320})
    assert model_vocab_size(padded, V) == 320 and check_model_config(padded, V)["vocab_size"] == 320
    assert model_vocab_size(ModelConfig(), V) == V  # the shorthand: always the tokenizer's
    with pytest.raises(DataError, match=r"model\.hf_config\.vocab_size: 100 is smaller than the tokenizer's"):
        hf_config(ModelConfig(hf_config={"model_type": "llama", "vocab_size": 100}), V)


def test_positions_from_the_context_length():
    gpt = hf_config(
        ModelConfig(
            context_length_tokens=48, hf_config={"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 1}
        ),
        V,
    )
    assert gpt.n_positions == 48
    long = hf_config(
        ModelConfig(context_length_tokens=48, hf_config={"model_type": "llama", "max_position_embeddings": 4096}), V
    )
    assert long.max_position_embeddings == 4096
    with pytest.raises(DataError, match=r"model\.hf_config\.max_position_embeddings: 16 positions are fewer"):
        hf_config(
            ModelConfig(context_length_tokens=48, hf_config={"model_type": "llama", "max_position_embeddings": 16}), V
        )


@pytest.mark.parametrize(
    "config, match",
    [
        ({"model_type": "lama"}, r"model\.hf_config\.model_type: 'lama' is not a transformers model type"),
        (
            {"model_type": "llama", "hidden_size": "wide"},
            r"model\.hf_config: transformers refuses the config: .*hidden_size",
        ),
        (
            {"model_type": "mixtral"},
            r"model\.hf_config: model_type 'mixtral' is not one the FLOPs formula knows.*"
            r"give model\.flops_per_token",
        ),
        ({"model_type": "llama", "num_experts": 4}, r"model\.hf_config: num_experts=4 makes it a mixture of experts"),
    ],
)
def test_refusals_name_the_field(config, match):
    with pytest.raises(DataError, match=match):
        check_model_config(ModelConfig(hf_config=config), V)


def test_flops_per_token_given_by_the_spec():
    moe = ModelConfig(
        flops_per_token=1.5e6,
        hf_config={
            "model_type": "mixtral",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
    )
    facts = check_model_config(moe, V)
    assert (facts["model_type"], facts["flops_per_token"], facts["flops_convention"]) == (
        "mixtral",
        1.5e6,
        GIVEN_FLOPS_CONVENTION,
    )
    assert check_model_config(ModelConfig(), V)["flops_convention"] == FLOPS_CONVENTION


def test_an_hf_config_round_trips_through_the_trial_config():
    from tests.workloads.train.test_loop import BASE

    d = BASE.to_dict()
    d["workload"]["model"]["hf_config"] = {
        "model_type": "qwen3",
        "head_dim": 16,
        "rope_parameters": {"rope_theta": 1e4},
    }
    d["workload"]["model"]["flops_per_token"] = 2.0e6
    again = TrialConfig.from_dict(d)
    assert again.workload.model.hf_config["rope_parameters"] == {"rope_theta": 1e4}
    assert again.to_dict() == d


def test_a_pretraining_trial_builds_and_counts_an_hf_config_model():
    from tests.workloads.train.test_loop import cfg
    from workloads.model.flops import flops_per_token, shape_of
    from workloads.pretrain import build_pretrain, pretrain_flops

    gqa = {
        "model_type": "qwen3",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "tie_word_embeddings": True,
    }
    c = cfg(model={"hf_config": gqa})
    work = build_pretrain(c, torch.device("cpu"))
    hf = work.model.config
    assert (hf.model_type, hf.num_key_value_heads, hf.vocab_size, hf.max_position_embeddings) == ("qwen3", 2, V, 32)
    assert work.model.lm_head.weight is work.model.get_input_embeddings().weight  # tied
    assert work.flops_per_token == flops_per_token(shape_of(hf, 32))
    assert pretrain_flops(c.workload) == (work.flops_per_token, FLOPS_CONVENTION)


def test_a_saved_config_json_trains_in_float32():
    saved = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "tie_word_embeddings": True,
    }
    model = build_model(ModelConfig(context_length_tokens=32, hf_config=saved), V)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
