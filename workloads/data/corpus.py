"""Corpora, tokenizers and the deterministic batch stream.

A corpus is prepared token shards (``workloads.data.shards``: memory-mapped, never loaded whole; the
sweep driver prepares a raw ``data.path`` text file into shards once per sweep), or one text file
tokenized once per process: byte-level (ids 0..255, the default) or a local Hugging Face tokenizer
directory (``tokenizers``/``transformers``, no hub access), whose last ``validation_fraction`` of
the tokens is the held-out split.

The training stream is keyed by optimizer step: step ``s`` of seed ``k`` always draws the same
global batch of windows, whatever the number of workers, so a resumed run continues exactly and
the data position is the step count.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workloads.errors import DataError
from workloads.data.shards import TokenStream, open_split, read_index

__all__ = ["Corpus", "load_corpus", "load_shard_corpus", "tokenizer_vocab_size", "encode_text", "step_generator", "window_batch",
           "validation_batches"]


@dataclass(frozen=True)
class Corpus:
    """A tokenized corpus split into train and validation ids: 1-D int64 tensors (a text file) or
    memory-mapped :class:`workloads.data.shards.TokenStream` (prepared shards); both have ``len``."""

    train_ids: torch.Tensor | TokenStream
    val_ids: torch.Tensor | TokenStream
    vocab_size: int


def _load_hf_tokenizer(directory: str):
    from transformers import AutoTokenizer

    p = Path(directory)
    if not p.is_dir():
        raise DataError(f"tokenizer directory not found: {directory} (use 'byte' or a local Hugging Face tokenizer folder)")
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def tokenizer_vocab_size(tokenizer: str) -> int:
    """Vocabulary size of ``'byte'`` (256) or of a local Hugging Face tokenizer directory."""
    if tokenizer == "byte":
        return 256
    return len(_load_hf_tokenizer(tokenizer))


def encode_text(text: str, tokenizer: str) -> np.ndarray:
    """Token ids of ``text`` as a 1-D int64 array (bytes of UTF-8 for ``'byte'``)."""
    if tokenizer == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    tok = _load_hf_tokenizer(tokenizer)
    return np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int, tokenizer: str, validation_fraction: float) -> Corpus:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"corpus {path} is not UTF-8 text: {exc}") from None
    ids = torch.from_numpy(encode_text(text, tokenizer))
    n_val = int(len(ids) * validation_fraction)
    return Corpus(train_ids=ids[: len(ids) - n_val], val_ids=ids[len(ids) - n_val :], vocab_size=tokenizer_vocab_size(tokenizer))


def load_corpus(path: str, tokenizer: str, validation_fraction: float, context_length_tokens: int, *,
                keep: bool = True) -> Corpus:
    """Load and split a corpus, checking it is long enough.

    ``keep=False`` does not keep it in this process's cache (a check that only counts its tokens:
    the sweep driver's preflight, which would otherwise hold 8 bytes a token for the whole sweep).

    Raises:
        DataError: the file is missing or empty, or either split holds fewer than
            ``context_length_tokens + 1`` tokens (one training window).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"corpus not found: {path}")
    load = _load_cached if keep else _load_cached.__wrapped__
    corpus = load(str(p.resolve()), p.stat().st_mtime_ns, tokenizer, validation_fraction)
    need = context_length_tokens + 1
    if len(corpus.train_ids) < need or len(corpus.val_ids) < need:
        raise DataError(
            f"corpus {path} is too small for context_length_tokens={context_length_tokens}: "
            f"{len(corpus.train_ids)} train and {len(corpus.val_ids)} validation tokens, each split needs >= {need}"
        )
    return corpus


def load_shard_corpus(location: str, context_length_tokens: int) -> Corpus:
    """Memory-map prepared shards (a folder or fsspec URI, ``workloads.data.shards``); reads only the index.

    Raises:
        DataError: an unusable index or shard (``workloads.data.shards.read_index``), or a split shorter
            than ``context_length_tokens + 1`` tokens.
    """
    index = read_index(location)
    train, val = open_split(index, "train"), open_split(index, "validation")
    need = context_length_tokens + 1
    if len(train) < need or len(val) < need:
        raise DataError(f"shards {location} are too small for context_length_tokens={context_length_tokens}: "
                        f"{len(train)} train and {len(val)} validation tokens, each split needs >= {need}")
    return Corpus(train_ids=train, val_ids=val, vocab_size=index.vocab_size)


def _windows(ids: torch.Tensor | TokenStream, starts: torch.Tensor, length: int) -> torch.Tensor:
    """``[len(starts), length]`` int64 windows of ``ids`` at ``starts`` (the same values from a tensor
    or from memory-mapped shards holding the same tokens)."""
    if isinstance(ids, torch.Tensor):
        return ids[starts[:, None] + torch.arange(length)[None, :]]
    return ids.gather(starts.tolist(), length)


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """The generator of step ``step``'s global batch: seeded by a BLAKE2b hash of ``seed/stream/step``
    (stream 0: training, 1: WSD decay branches), so it is the same on every worker and after a resume."""
    digest = hashlib.blake2b(f"{seed}/{stream}/{step}".encode(), digest_size=8).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    return g


def window_batch(
    ids: torch.Tensor | TokenStream, *, seed: int, step: int, global_batch_size_sequences: int, context_length_tokens: int,
    start: int, count: int, stream: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences ``start .. start+count`` of step ``step``'s global batch of random windows.

    Returns:
        ``(inputs, targets)``, each ``[count, context_length_tokens]`` int64; targets are inputs
        shifted by one token.
    """
    g = step_generator(seed, step, stream)
    offsets = torch.randint(0, len(ids) - context_length_tokens - 1 + 1, (global_batch_size_sequences,), generator=g)
    w = _windows(ids, offsets[start : start + count], context_length_tokens + 1)
    return w[:, :-1], w[:, 1:]


def validation_batches(
    val_ids: torch.Tensor | TokenStream, *, eval_tokens: int, context_length_tokens: int, batch_size_sequences: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed held-out set: consecutive, non-overlapping windows from the start of the split.

    The same for every trial of a sweep, so validation losses compare across batch sizes.
    Returns at most ``eval_tokens // context_length_tokens`` windows (at least one).
    """
    T = context_length_tokens
    n = max(1, min(eval_tokens // T, (len(val_ids) - 1) // T))
    w = _windows(val_ids, torch.arange(n) * T, T + 1)
    return [(w[i : i + batch_size_sequences, :-1], w[i : i + batch_size_sequences, 1:]) for i in range(0, n, batch_size_sequences)]
