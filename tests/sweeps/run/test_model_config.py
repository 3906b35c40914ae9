"""sweeps/launch/workload.py and preflight.py on the model: the spec's model as the workers' ModelConfig."""

import copy
import json

import pytest

from sweeps.errors import InvalidInput
from sweeps.launch.workload import check_model, model_config
from sweeps.run.preflight import resolve_paths
from sweeps.spec import parse_spec
from sweeps.spec.hf_config import read_hf_config
from workloads.api import FLOPS_CONVENTION, ModelConfig

GQA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_the_shorthand_converts_as_before(tiny_spec_dict):
    assert model_config(parse_spec(tiny_spec_dict)) == ModelConfig(
        family="llama", d_model=32, n_layers=1, n_heads=2, d_ff=96, context_length_tokens=32, tie_word_embeddings=False
    )


def test_a_config_json_is_read_once_and_inlined_for_the_workers(tmp_path, tiny_spec_dict):
    (tmp_path / "config.json").write_text(json.dumps(GQA))
    d = copy.deepcopy(tiny_spec_dict)
    d["model"] = {"hf_config": str(tmp_path / "config.json"), "context_length_tokens": 32}
    spec = parse_spec(d)
    assert model_config(spec).hf_config == GQA
    resolved = resolve_paths(spec)
    (tmp_path / "config.json").unlink()  # the resolved spec (spec.yaml, the trials) no longer needs the file
    assert resolved.model.hf_config == GQA and model_config(resolved).hf_config == GQA
    facts = check_model(resolved)
    assert (
        facts["model_type"] == "llama" and facts["vocab_size"] == 256 and facts["flops_convention"] == FLOPS_CONVENTION
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "is not a transformers config"),
        ('{"hidden_size": 3}', "is not a transformers config"),
        ('{"model_type": " "}', "is not a transformers config"),  # blank: refused here, not by the section later
        ("not json", "is not JSON"),
    ],
)
def test_read_hf_config_refusals(tmp_path, text, message):
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(InvalidInput, match=message):
        read_hf_config(str(tmp_path / "c.json"))
    with pytest.raises(InvalidInput, match="model.hf_config: file not found"):
        read_hf_config(str(tmp_path / "none.json"))
