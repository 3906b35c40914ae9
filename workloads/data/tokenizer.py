"""Hugging Face tokenizers for checkpoints: the byte-level tokenizer, saving, and loading.

A checkpoint is only usable offline with its tokenizer next to it, so the pretraining workload
saves one with every Hugging Face checkpoint (:func:`save_tokenizer`) and the fine-tuning workload
loads it back (:func:`load_tokenizer`).

The ``byte`` tokenizer is a real ``tokenizers`` model wrapped in
``transformers.PreTrainedTokenizerFast``: 256 ids, id ``b`` is the UTF-8 byte ``b``, no merges, no
special tokens, so ``tok(text, add_special_tokens=False)["input_ids"]`` equals
``workloads.data.corpus.encode_text(text, "byte")`` for every string. Bytes are carried through the
GPT-2 byte-to-unicode map (``pre_tokenizers.ByteLevel`` without its splitting regex, Radford et al.
2019), the standard way to make a byte-level vocabulary printable.

Padding: the byte tokenizer has **no pad token**. Every id is a real byte, and declaring id 0 as a
special pad token makes ``tokenizers`` match the pad token's text (``"Ā"``, U+0100) inside the input
and turn its two bytes into id 0, so the ids would no longer be the bytes. The workloads never
rely on a pad id: padding positions carry id 0 and are excluded by the attention mask, by -100
labels and from every token count. Code that needs ``tok.pad(...)`` can set ``tok.pad_token_id = 0``
in memory (that does not change encoding; saving such a tokenizer does).
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["BYTE_VOCAB_SIZE", "byte_tokenizer", "save_tokenizer", "load_tokenizer", "has_tokenizer_files"]

BYTE_VOCAB_SIZE = 256

#: Files any one of which marks a saved Hugging Face tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")


@functools.lru_cache(maxsize=1)
def _byte_backend_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()  # byte -> printable unicode character (GPT-2)
    tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(BYTE_VOCAB_SIZE)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def byte_tokenizer():
    """The byte-level tokenizer as a ``transformers.PreTrainedTokenizerFast``.

    Returns:
        a tokenizer of 256 ids (id = UTF-8 byte value), no special tokens, no pad token (see the
        module docstring), ``model_max_length`` unlimited. ``decode`` inverts ``encode`` exactly for
        valid UTF-8.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_byte_backend_json()), model_max_length=int(1e30))


def has_tokenizer_files(directory: str | Path) -> bool:
    """Whether ``directory`` holds a saved Hugging Face tokenizer (``tokenizer.json`` and the like)."""
    p = Path(directory)
    return any((p / f).is_file() for f in _TOKENIZER_FILES)


def load_tokenizer(tokenizer: str):
    """``'byte'`` (:func:`byte_tokenizer`) or a local Hugging Face tokenizer directory (no hub access).

    Raises:
        FileNotFoundError: ``tokenizer`` is neither ``'byte'`` nor a directory holding a tokenizer.
    """
    if tokenizer == "byte":
        return byte_tokenizer()
    if not Path(tokenizer).is_dir() or not has_tokenizer_files(tokenizer):
        raise FileNotFoundError(f"no Hugging Face tokenizer in {tokenizer} (expected tokenizer.json or tokenizer_config.json)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)


def save_tokenizer(tokenizer: str, save_dir: str) -> None:
    """Write the tokenizer next to a checkpoint so it loads with ``AutoTokenizer.from_pretrained(save_dir)``.

    Args:
        tokenizer: ``'byte'``, or a local Hugging Face tokenizer directory (loaded and saved again).
        save_dir: the checkpoint directory (created if missing).

    Raises:
        FileNotFoundError: ``tokenizer`` is a directory without a tokenizer.
    """
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    load_tokenizer(tokenizer).save_pretrained(save_dir)
