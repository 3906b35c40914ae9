"""``model``: the five-number shorthand or ``hf_config`` (inline or a config.json path), never both;
``flops_per_token``; each refusal named by its dotted path, at parse time or by ``critbatch validate``."""

import copy
import json

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.spec import SpecError, load_spec, parse_spec
from tests.conftest import ROOT, write_spec

GQA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _with_model(d: dict, model: dict) -> dict:
    d = copy.deepcopy(d)
    d["model"] = model
    return d


def _errors(d: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as ei:
        parse_spec(d)
    return dict(ei.value.errors)


def test_a_shorthand_model_dumps_as_before_hf_config(tiny_spec_dict):
    dumped = parse_spec(tiny_spec_dict).model.model_dump(mode="json")
    # the fields a spec had before hf_config: same dump, so the same fingerprint and sweep id
    assert dumped == {
        "family": "llama",
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 2,
        "d_ff": None,
        "context_length_tokens": 32,
        "tie_word_embeddings": False,
    }


def test_an_hf_config_spec_dumps_one_form_and_round_trips(tiny_spec_dict):
    s = parse_spec(
        _with_model(tiny_spec_dict, {"hf_config": GQA, "context_length_tokens": 32, "flops_per_token": 1.0e6})
    )
    assert s.model.model_dump(mode="json") == {"context_length_tokens": 32, "hf_config": GQA, "flops_per_token": 1.0e6}
    assert parse_spec(s.model_dump(mode="json")) == s


def test_hf_config_beside_the_shorthand_is_refused(tiny_spec_dict):
    errs = _errors(_with_model(tiny_spec_dict, {"hf_config": GQA, "d_model": 32, "n_heads": 2}))
    assert "remove the shorthand field(s) d_model, n_heads" in errs["model"]
    assert "hf_config defines the architecture" in errs["model"]


def test_a_derived_spec_clears_its_base_shorthand_with_null(tmp_path, tiny_spec_dict):
    write_spec(tmp_path, tiny_spec_dict, "base.yaml")
    (tmp_path / "mixed.yaml").write_text(f"base: base.yaml\nmodel:\n  hf_config: {json.dumps(GQA)}\n")
    with pytest.raises(SpecError, match="remove the shorthand field"):
        load_spec(tmp_path / "mixed.yaml")
    (tmp_path / "child.yaml").write_text(
        "base: base.yaml\nmodel:\n  family: null\n  d_model: null\n  n_layers: null\n  n_heads: null\n"
        f"  hf_config: {json.dumps(GQA)}\n"
    )
    m = load_spec(tmp_path / "child.yaml").model
    assert m.hf_config == GQA and m.context_length_tokens == 32  # the base's context length is kept


@pytest.mark.parametrize(
    "hf_config, message",
    [
        ({"hidden_size": 32}, "an inline config needs model_type"),
        ({"model_type": ""}, "an inline config needs model_type"),
        (7, "give a mapping with model_type or the path of a config.json, not int"),
        (["llama"], "not list"),
        ("  ", "must not be empty"),
        ("s3://bucket/config.json", "is a URI"),
    ],
)
def test_bad_hf_config_values(tiny_spec_dict, hf_config, message):
    errs = _errors(_with_model(tiny_spec_dict, {"hf_config": hf_config}))
    assert message in errs["model.hf_config"]


@pytest.mark.parametrize("value", [0, -1.0, 1e19, "many"])
def test_flops_per_token_is_a_positive_number(tiny_spec_dict, value):
    assert "model.flops_per_token" in _errors(_with_model(tiny_spec_dict, {"flops_per_token": value}))


def test_the_gqa_example_is_an_hf_config_llama():
    m = load_spec(ROOT / "sweeps" / "examples" / "shakespeare-gqa.yaml").model
    assert m.hf_config["model_type"] == "llama" and m.hf_config["num_key_value_heads"] == 2
    assert m.hf_config["num_attention_heads"] == 4 and m.context_length_tokens == 64


def _validate(tmp_path, d: dict):
    return CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])


@pytest.mark.parametrize(
    "model, message",
    [
        ({"hf_config": {"model_type": "lama"}}, "model.hf_config.model_type: 'lama' is not a transformers model type"),
        (
            {"hf_config": {"model_type": "mixtral"}},
            "model.hf_config: model_type 'mixtral' is not one the FLOPs formula knows",
        ),
        ({"hf_config": {**GQA, "num_experts": 4}}, "model.hf_config: num_experts=4 makes it a mixture of experts"),
        ({"hf_config": {**GQA, "vocab_size": 128}}, "model.hf_config.vocab_size: 128 is smaller than the tokenizer's"),
        ({"hf_config": "missing/config.json"}, "model.hf_config: file not found: missing/config.json"),
    ],
)
def test_cli_validate_refuses_what_cannot_be_built_or_counted(tmp_path, tiny_spec_dict, model, message):
    r = _validate(tmp_path, _with_model(tiny_spec_dict, {**model, "context_length_tokens": 32}))
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output


def test_cli_validate_a_config_json_and_a_given_flops_per_token(tmp_path, tiny_spec_dict):
    (tmp_path / "bad.json").write_text("{model_type: llama")
    r = _validate(tmp_path, _with_model(tiny_spec_dict, {"hf_config": str(tmp_path / "bad.json")}))
    assert r.exit_code == 2 and "is not JSON" in r.output, r.output
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps(GQA))
    r = _validate(
        tmp_path, _with_model(tiny_spec_dict, {"hf_config": str(tmp_path / "ck"), "context_length_tokens": 32})
    )
    assert r.exit_code == 0, r.output  # a folder: its config.json
    moe = {
        "model_type": "mixtral",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_local_experts": 4,
    }
    r = _validate(
        tmp_path, _with_model(tiny_spec_dict, {"hf_config": moe, "flops_per_token": 2.0e6, "context_length_tokens": 32})
    )
    assert r.exit_code == 0, r.output


def test_cli_validate_refuses_hf_config_for_fine_tuning(tmp_path):
    import yaml

    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "gsm8k-finetune.yaml").read_text())
    d["model"] = {"hf_config": GQA, "context_length_tokens": d.get("model", {}).get("context_length_tokens", 64)}
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 2 and "model.hf_config: only pretraining builds a model from a config" in r.output, r.output
    d["model"] = {"context_length_tokens": d["model"]["context_length_tokens"], "flops_per_token": 1.0e6}
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 2 and "model.flops_per_token: only pretraining takes it" in r.output, r.output
