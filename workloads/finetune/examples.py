"""Instruction data of a fine-tuning trial: reading, tokenizing, the held-out split.

Data. Each line of the JSON Lines file is an object with a prompt field and a response field
(names configurable). An example's tokens are ``[bos] + tok(template(prompt)) + tok(response) +
[eos]`` (bos/eos only when the tokenizer defines them; the byte tokenizer has neither). Prompt and
response are tokenized separately so the boundary is exact. Loss is taken on response tokens
only: an example of ``L`` tokens whose prompt has ``m`` gives ``L - 1`` input positions, the first
``m - 1`` of whose targets are -100 (they predict prompt tokens).

Rows: packed or padded (:mod:`workloads.finetune.packing`).

The held-out split is the last ``validation_fraction`` of the examples (file order). Every problem
is a :class:`workloads.errors.DataError` naming the line and the field, raised before launch by
:func:`workloads.finetune.check_finetune_inputs`.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.config import FinetuneConfig
from workloads.errors import DataError
from workloads.finetune.packing import Example, PackedRows, pack_examples

__all__ = ["FinetuneData", "load_finetune_data", "read_records", "tokenize_examples"]

log = logging.getLogger(__name__)

_MAX_LISTED = 5


@dataclass(frozen=True)
class FinetuneData:
    """Train and validation rows of one data set, and what happened to its examples.

    ``stats`` holds ``examples``, ``train_examples``, ``validation_examples``, ``truncated`` and
    ``skipped`` (counts of examples), ``train_rows``, ``validation_rows``, ``train_real_tokens``,
    ``validation_real_tokens`` (tokens), ``truncated_lines`` and ``skipped_lines`` (first few line
    numbers) and ``tokenizer``.
    """

    train: PackedRows
    val: PackedRows
    stats: dict[str, Any]


def read_records(path: str, prompt_field: str, response_field: str) -> list[tuple[int, str, str]]:
    """``(line number, prompt, response)`` of every non-blank line of a JSON Lines file.

    Raises:
        DataError: the file is missing or not UTF-8; a line is not a JSON object; a line lacks a
            configured field or its value is not a string; a response is empty; no examples.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data.path: JSON Lines file not found: {path}")
    out: list[tuple[int, str, str]] = []
    try:
        with p.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} line {n}: not valid JSON ({exc.msg})") from None
                if not isinstance(rec, dict):
                    raise DataError(f"{path} line {n}: expected a JSON object, got {type(rec).__name__}")
                for name, role in ((prompt_field, "prompt_field"), (response_field, "response_field")):
                    if name not in rec:
                        raise DataError(
                            f"{path} line {n}: missing field {name!r} (finetune.{role}); the line has {sorted(rec)}"
                        )
                    if not isinstance(rec[name], str):
                        raise DataError(
                            f"{path} line {n}: field {name!r} must be a string, got {type(rec[name]).__name__}"
                        )
                if not rec[response_field]:
                    raise DataError(f"{path} line {n}: field {response_field!r} is empty (nothing to learn)")
                out.append((n, rec[prompt_field], rec[response_field]))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text: {exc}") from None
    if not out:
        raise DataError(f"{path} holds no examples")
    return out


def tokenize_examples(
    records: list[tuple[int, str, str]],
    tokenizer,
    opts: FinetuneConfig,
    *,
    context_length_tokens: int,
    vocab_size: int,
    path: str = "data",
) -> tuple[list[Example], dict[str, Any]]:
    """Template and tokenize records; apply the context-length rule.

    An example fits when ``L - 1 <= context_length_tokens`` (its inputs fill at most one row).
    With ``opts.truncate``, a longer one keeps its first ``T + 1`` tokens, or is skipped when that
    leaves no response token; both are counted.

    Returns:
        ``(examples, stats)`` with ``stats`` keys ``truncated``, ``skipped`` (counts) and
        ``truncated_lines``, ``skipped_lines`` (the first few line numbers).

    Raises:
        DataError: an over-long example without ``truncate`` (its line, length and the limit named,
            with the count of such lines); a token id outside the model's vocabulary; every
            example skipped.
    """
    T = context_length_tokens
    bos = getattr(tokenizer, "bos_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    prompts = tokenizer([opts.template(p) for _, p, _ in records], add_special_tokens=False)["input_ids"]
    responses = tokenizer([r for _, _, r in records], add_special_tokens=False)["input_ids"]
    examples: list[Example] = []
    too_long: list[tuple[int, int, int]] = []
    truncated: list[int] = []
    skipped: list[int] = []
    for (line, _, _), p_ids, r_ids in zip(records, prompts, responses):
        p_ids = ([bos] if bos is not None else []) + list(p_ids)
        r_ids = list(r_ids) + ([eos] if eos is not None else [])
        ids = np.asarray(p_ids + r_ids, dtype=np.int64)
        m = len(p_ids)
        if len(ids) - 1 > T:
            too_long.append((line, m, len(r_ids)))
            if not opts.truncate:
                continue
            if m >= T + 1:
                skipped.append(line)
                continue
            ids = ids[: T + 1]
            truncated.append(line)
        if len(ids) and (ids.max() >= vocab_size or ids.min() < 0):
            raise DataError(
                f"{path} line {line}: token id {int(ids.max())} is outside the model's vocabulary "
                f"({vocab_size}); the tokenizer does not match the checkpoint"
            )
        examples.append(Example(line=line, ids=ids, prompt_len=m))
    if too_long and not opts.truncate:
        line, m, r = too_long[0]
        lines = ", ".join(str(x[0]) for x in too_long[:_MAX_LISTED]) + (", ..." if len(too_long) > _MAX_LISTED else "")
        raise DataError(
            f"{path} line {line}: example is {m + r} tokens (prompt {m} + response {r}), longer than "
            f"context_length_tokens + 1 = {T + 1}; {len(too_long)} of {len(records)} examples are too long "
            f"(lines {lines}). Raise model.context_length_tokens, or set finetune.truncate: true to cut them "
            "(counted and reported)"
        )
    if not examples:
        raise DataError(
            f"{path}: every example was skipped: each prompt alone fills context_length_tokens={T}; raise it"
        )
    stats = {
        "truncated": len(truncated),
        "skipped": len(skipped),
        "truncated_lines": truncated[:_MAX_LISTED],
        "skipped_lines": skipped[:_MAX_LISTED],
    }
    return examples, stats


@functools.lru_cache(maxsize=4)
def _load_cached(
    path: str,
    mtime_ns: int,
    tokenizer_source: str,
    data_fields: tuple,
    T: int,
    validation_fraction: float,
    vocab_size: int,
    pad_id: int,
) -> FinetuneData:
    from workloads.data.tokenizer import load_tokenizer

    opts = FinetuneConfig(checkpoint_dir="", **dict(data_fields))

    records = read_records(path, opts.prompt_field, opts.response_field)
    tok = load_tokenizer(tokenizer_source)
    examples, stats = tokenize_examples(records, tok, opts, context_length_tokens=T, vocab_size=vocab_size, path=path)
    n_val = int(len(examples) * validation_fraction)
    if n_val < 1 or len(examples) - n_val < 1:
        raise DataError(
            f"{path}: {len(examples)} usable examples with validation_fraction={validation_fraction} leave "
            f"{len(examples) - n_val} for training and {n_val} for validation; each needs at least 1"
        )
    train = pack_examples(
        examples[: len(examples) - n_val], context_length_tokens=T, packing=opts.packing, pad_id=pad_id
    )
    val = pack_examples(examples[len(examples) - n_val :], context_length_tokens=T, packing=opts.packing, pad_id=pad_id)
    stats.update(
        examples=len(examples) + stats["skipped"],
        train_examples=len(examples) - n_val,
        validation_examples=n_val,
        train_rows=len(train),
        validation_rows=len(val),
        train_real_tokens=int(train.real_tokens.sum()),
        validation_real_tokens=int(val.real_tokens.sum()),
        tokenizer=tokenizer_source,
    )
    return FinetuneData(train=train, val=val, stats=stats)


def load_finetune_data(
    path: str,
    *,
    tokenizer_source: str,
    opts: FinetuneConfig,
    context_length_tokens: int,
    validation_fraction: float,
    vocab_size: int,
    pad_id: int = 0,
) -> FinetuneData:
    """Read, tokenize, split (last ``validation_fraction`` of examples held out) and pack a data set.

    Cached per process by the file's path and modification time and the arguments.

    Args:
        tokenizer_source: ``'byte'`` or a tokenizer directory (:func:`resolve_tokenizer`).
        vocab_size: the model's number of ids; a token id outside it is an error.

    Raises:
        DataError: see :func:`read_records` and :func:`tokenize_examples`; or a split with no example.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data.path: JSON Lines file not found: {path}")
    data_fields = tuple(
        (k, getattr(opts, k)) for k in ("prompt_field", "response_field", "prompt_template", "packing", "truncate")
    )
    data = _load_cached(
        str(p.resolve()),
        p.stat().st_mtime_ns,
        tokenizer_source,
        data_fields,
        context_length_tokens,
        validation_fraction,
        vocab_size,
        pad_id,
    )
    if data.stats["truncated"] or data.stats["skipped"]:
        log.warning(
            "%s: %d example(s) truncated to context_length_tokens=%d (lines %s...), %d skipped (lines %s...)",
            path,
            data.stats["truncated"],
            context_length_tokens,
            data.stats["truncated_lines"],
            data.stats["skipped"],
            data.stats["skipped_lines"],
        )
    return data
