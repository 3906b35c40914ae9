"""The tiny-checkpoint builder (``workloads.api.init_checkpoint``, ``workloads/finetune/checkpoint.py``)."""

from __future__ import annotations

import pytest


def test_init_checkpoint_writes_a_loadable_byte_checkpoint(ckpt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.api import init_checkpoint

    model = AutoModelForCausalLM.from_pretrained(str(ckpt), local_files_only=True)
    assert (model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers) == (256, 32, 2)
    assert model.config.max_position_embeddings == 128
    assert AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)("hi")["input_ids"] == [104, 105]
    with pytest.raises(FileExistsError, match="already holds a checkpoint"):
        init_checkpoint(str(ckpt), d_model=32, n_layers=2, n_heads=2, context_length_tokens=128)
    with pytest.raises(ValueError, match="divisible"):
        init_checkpoint(str(ckpt.parent / "bad"), d_model=30, n_layers=1, n_heads=4, context_length_tokens=16)
