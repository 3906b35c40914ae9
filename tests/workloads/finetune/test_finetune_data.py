"""Instruction data: response-only loss, packing without leaks, real-token counts, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from workloads.config import FinetuneConfig, LoraConfig
from workloads.data.tokenizer import byte_tokenizer
from workloads.errors import DataError
from workloads.finetune.examples import load_finetune_data, read_records, tokenize_examples
from workloads.finetune.packing import Example, pack_examples, rows_batch

from .conftest import CONTEXT, TEMPLATE, qa_records, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
OPTS = FinetuneConfig(checkpoint_dir="unused", prompt_template=TEMPLATE)


def examples(n: int = 6) -> list[Example]:
    recs = [(i + 1, r["question"], r["answer"]) for i, r in enumerate(qa_records(n))]
    exs, stats = tokenize_examples(recs, byte_tokenizer(), OPTS, context_length_tokens=CONTEXT, vocab_size=256)
    assert stats["truncated"] == stats["skipped"] == 0
    return exs


def test_example_tokens_are_template_then_response():
    ex = examples(1)[0]
    r = qa_records(1)[0]
    prompt = TEMPLATE.replace("{prompt}", r["question"]).encode()
    assert ex.prompt_len == len(prompt)
    assert bytes(ex.ids.tolist()) == prompt + r["answer"].encode()


@pytest.mark.parametrize("packing", ["packed", "padded"])
def test_loss_is_taken_on_response_tokens_only(packing):
    exs = examples(6)
    rows = pack_examples(exs, context_length_tokens=CONTEXT, packing=packing)
    # the loss-carrying targets are exactly the response tokens, in order
    want = np.concatenate([ex.ids[ex.prompt_len :] for ex in exs])
    got = rows.targets[rows.targets != -100].numpy()
    assert np.array_equal(got, want)
    # prompt and padding positions get exactly zero gradient from the loss
    logits = torch.randn(*rows.targets.shape, 256, requires_grad=True)
    loss = F.cross_entropy(logits.reshape(-1, 256), rows.targets.reshape(-1), ignore_index=-100)
    loss.backward()
    no_loss = rows.targets == -100
    assert int(no_loss.sum()) > 0
    assert torch.count_nonzero(logits.grad[no_loss]) == 0
    assert bool((logits.grad[~no_loss].abs().sum(-1) > 0).all())


def test_packing_fills_rows_and_counts_real_tokens():
    exs = examples(8)
    packed = pack_examples(exs, context_length_tokens=CONTEXT, packing="packed")
    padded = pack_examples(exs, context_length_tokens=CONTEXT, packing="padded")
    total = sum(ex.n_inputs for ex in exs)
    assert int(packed.real_tokens.sum()) == int(padded.real_tokens.sum()) == total
    assert len(padded) == len(exs) and len(packed) < len(exs)
    inputs, _ = rows_batch(packed, torch.arange(len(packed)))
    assert inputs.n_real_tokens == total
    assert int((packed.segment_ids >= 0).sum()) == total
    # padding sits at the tail of each row
    for r in range(len(packed)):
        n = int(packed.real_tokens[r])
        assert bool((packed.segment_ids[r, n:] == -1).all()) and bool((packed.segment_ids[r, :n] >= 0).all())


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_packed_example_logits_equal_the_example_alone(family):
    from workloads.config import ModelConfig
    from workloads.model.hf import build_model

    torch.manual_seed(0)
    model = build_model(
        ModelConfig(family=family, d_model=32, n_layers=2, n_heads=2, d_ff=64, context_length_tokens=CONTEXT), 256
    ).eval()
    exs = examples(6)
    rows = pack_examples(exs, context_length_tokens=CONTEXT, packing="packed")
    assert int(rows.segment_ids.max()) >= 1  # some row holds more than one example
    inputs, targets = rows_batch(rows, torch.arange(len(rows)))
    assert inputs["attention_mask"].shape == (len(rows), 1, CONTEXT, CONTEXT)
    with torch.no_grad():
        packed_logits = model(**inputs).logits
        k = 0
        for r in range(len(rows)):
            at = 0
            for s in range(int(rows.segment_ids[r].max()) + 1):
                ex = exs[k]
                n = ex.n_inputs
                alone = model(input_ids=torch.from_numpy(ex.ids[:-1])[None]).logits[0]
                torch.testing.assert_close(packed_logits[r, at : at + n], alone, rtol=1e-5, atol=1e-5)
                # and the same loss
                tgt = targets[r, at : at + n]
                assert F.cross_entropy(packed_logits[r, at : at + n], tgt, ignore_index=-100).item() == pytest.approx(
                    F.cross_entropy(alone, tgt, ignore_index=-100).item(), rel=1e-5
                )
                at += n
                k += 1
    assert k == len(exs)


def test_eager_float_mask_gives_the_same_logits():
    from transformers import AutoModelForCausalLM

    from workloads.config import ModelConfig
    from workloads.model.hf import hf_config

    torch.manual_seed(0)
    mc = ModelConfig(family="llama", d_model=32, n_layers=1, n_heads=2, d_ff=64, context_length_tokens=CONTEXT)
    sdpa = AutoModelForCausalLM.from_config(hf_config(mc, 256), attn_implementation="sdpa").eval()
    eager = AutoModelForCausalLM.from_config(hf_config(mc, 256), attn_implementation="eager").eval()
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    eager.load_state_dict(sdpa.state_dict())
    rows = pack_examples(examples(6), context_length_tokens=CONTEXT, packing="packed")
    a, _ = rows_batch(rows, torch.arange(len(rows)))
    b, _ = rows_batch(rows, torch.arange(len(rows)), float_mask_dtype=torch.float32)
    with torch.no_grad():
        la, lb = sdpa(**a).logits, eager(**b).logits
    real = rows.segment_ids >= 0
    torch.testing.assert_close(la[real], lb[real], rtol=1e-4, atol=1e-4)


# ---- bad input ------------------------------------------------------------------------------


def test_missing_field_names_the_line_and_field(tmp_path):
    recs = qa_records(3)
    recs[1] = {"question": "no answer here"}
    p = write_jsonl(tmp_path / "x.jsonl", recs)
    with pytest.raises(DataError, match=r"line 2: missing field 'answer' \(finetune.response_field\)"):
        read_records(str(p), "question", "answer")
    with pytest.raises(DataError, match=r"line 1: missing field 'prompt'"):
        read_records(str(p), "prompt", "answer")


@pytest.mark.parametrize(
    "line,msg",
    [
        ("{not json", r"line 2: not valid JSON"),
        ("[1, 2]", r"line 2: expected a JSON object"),
        ('{"question": "q", "answer": 5}', r"line 2: field 'answer' must be a string"),
        ('{"question": "q", "answer": ""}', r"line 2: field 'answer' is empty"),
    ],
)
def test_malformed_lines_are_named(tmp_path, line, msg):
    p = write_jsonl(tmp_path / "x.jsonl", [qa_records(1)[0], line])
    with pytest.raises(DataError, match=msg):
        read_records(str(p), "question", "answer")


def test_over_long_example_is_refused_or_truncated_and_counted(tmp_path):
    recs = qa_records(10)
    recs[3] = {"question": "short?", "answer": "x" * 200}  # truncated: its prompt fits
    recs[6] = {"question": "q" * 200, "answer": "y"}  # skipped: the prompt alone fills T
    p = write_jsonl(tmp_path / "x.jsonl", recs)
    kw = dict(tokenizer_source="byte", context_length_tokens=CONTEXT, validation_fraction=0.2, vocab_size=256)
    with pytest.raises(
        DataError,
        match=r"line 4: example is \d+ tokens .* longer than context_length_tokens \+ 1 = 97; "
        r"2 of 10 examples are too long \(lines 4, 7\).*finetune.truncate",
    ):
        load_finetune_data(str(p), opts=OPTS, **kw)
    trunc = FinetuneConfig(checkpoint_dir="unused", prompt_template=TEMPLATE, truncate=True)
    data = load_finetune_data(str(p), opts=trunc, **kw)
    s = data.stats
    assert (s["truncated"], s["skipped"], s["truncated_lines"], s["skipped_lines"]) == (1, 1, [4], [7])
    assert (s["examples"], s["train_examples"], s["validation_examples"]) == (10, 8, 1)
    assert int(data.train.real_tokens.max()) <= CONTEXT


def test_template_without_placeholder_is_refused():
    with pytest.raises(ValidationError, match=r"prompt_template\n.*must contain '\{prompt\}'"):
        FinetuneConfig(checkpoint_dir="x", prompt_template="Question: ")


def test_token_ids_beyond_the_model_vocabulary_are_refused():
    recs = [(1, "q", "a")]
    with pytest.raises(DataError, match="outside the model's vocabulary"):
        tokenize_examples(recs, byte_tokenizer(), OPTS, context_length_tokens=CONTEXT, vocab_size=100)


def _spec(ckpt, data, **ft):
    """The workload config of a fine-tuning spec, converted as the sweep converts it."""
    from sweeps.launch.workload import workload_config
    from sweeps.spec import parse_spec

    return workload_config(
        parse_spec(
            {
                "name": "ft",
                "workload": "finetune",
                "model": {"context_length_tokens": CONTEXT},
                "data": {"path": str(data), "validation_fraction": 0.2},
                "finetune": {"checkpoint_dir": str(ckpt), "prompt_template": TEMPLATE, **ft},
                "budget_tokens": 4096,
                "schedule": {"warmup_tokens": 0},
                "search": {"batch_sizes_sequences": [2, 4], "base_lr": 1e-3, "base_batch_size_sequences": 2},
            }
        )
    )


def test_check_finetune_inputs_reports_the_data_and_flops(ckpt, qa_file):
    from workloads.finetune import check_finetune_inputs
    from workloads.finetune.lora import finetune_flops_per_token

    lora = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    out = check_finetune_inputs(_spec(ckpt, qa_file, lora=lora))
    assert (out["examples"], out["train_examples"], out["validation_examples"]) == (40, 32, 8)
    assert out["adapter_params"] == 2 * 2 * 4 * (32 + 32)
    assert out["flops_per_token"] == finetune_flops_per_token(
        str(ckpt), CONTEXT, LoraConfig(rank=4, alpha=8.0, dropout=0.0, target_modules=("q_proj", "v_proj"))
    )
    assert out["tokenizer"] == str(ckpt)


def test_check_finetune_inputs_names_each_problem(ckpt, qa_file, tmp_path):
    from workloads.finetune import check_finetune_inputs

    with pytest.raises(DataError, match=r"finetune.checkpoint_dir: directory not found: .*nowhere.*init-checkpoint"):
        check_finetune_inputs(_spec(tmp_path / "nowhere", qa_file))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"is not a Hugging Face checkpoint \(no config.json\)"):
        check_finetune_inputs(_spec(tmp_path / "empty", qa_file))
    with pytest.raises(DataError, match=r"missing field 'instruction' \(finetune.prompt_field\)"):
        check_finetune_inputs(_spec(ckpt, qa_file, prompt_field="instruction"))
    with pytest.raises(DataError, match=r"finetune.lora.target_modules: .*c_attn.*linear layers: .*q_proj"):
        check_finetune_inputs(_spec(ckpt, qa_file, lora={"target_modules": ["c_attn"]}))
    with pytest.raises(DataError, match="JSON Lines file not found"):
        check_finetune_inputs(_spec(ckpt, tmp_path / "missing.jsonl"))
