"""The byte-level Hugging Face tokenizer and tokenizer saving (``workloads/data/tokenizer.py``)."""

from __future__ import annotations

import pytest

from workloads.data.corpus import encode_text
from workloads.data.tokenizer import byte_tokenizer, load_tokenizer, save_tokenizer

TEXTS = ["Hello, world!", "héllo wörld’s\r\n\ttabs  and  spaces", "Ā and \x00 NUL", "emoji 🙂 #### 42", "<pad> <s> </s>", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_ids_are_the_utf8_bytes(text):
    tok = byte_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == encode_text(text, "byte").tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_byte_tokenizer_has_256_ids_and_no_special_tokens():
    tok = byte_tokenizer()
    assert len(tok) == 256
    assert tok.pad_token is None and tok.bos_token_id is None and tok.eos_token_id is None


def test_saved_byte_tokenizer_reloads_identically(tmp_path):
    from transformers import AutoTokenizer

    save_tokenizer("byte", str(tmp_path / "a"))
    again = AutoTokenizer.from_pretrained(str(tmp_path / "a"), local_files_only=True)
    for text in TEXTS:
        assert again(text, add_special_tokens=False)["input_ids"] == list(text.encode("utf-8"))
    # a local tokenizer directory is loaded and saved again
    save_tokenizer(str(tmp_path / "a"), str(tmp_path / "b"))
    assert load_tokenizer(str(tmp_path / "b"))("Ā", add_special_tokens=False)["input_ids"] == [196, 128]


def test_save_tokenizer_rejects_a_folder_without_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Hugging Face tokenizer"):
        save_tokenizer(str(tmp_path), str(tmp_path / "out"))
