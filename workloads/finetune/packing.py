"""Packing tokenized examples into rows of ``T`` input positions, and the model inputs of a micro-batch.

``packed``: examples are laid end to end into rows of ``T = context_length_tokens`` input positions
(greedy, in file order; an example never spans two rows), and a 4-D block-diagonal causal attention
mask plus per-example ``position_ids`` keep examples from seeing each other, so a packed example's
logits equal its logits alone. ``padded``: one example per row. In both, the row's tail is padding:
id 0 (or the tokenizer's pad id), target -100, its own attention block, and never counted as a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "IGNORE_INDEX",
    "PAD_SEGMENT",
    "Example",
    "ModelInputs",
    "PackedRows",
    "block_causal_mask",
    "pack_examples",
    "rows_batch",
]

IGNORE_INDEX = -100
PAD_SEGMENT = -1


@dataclass(frozen=True)
class Example:
    """One tokenized example.

    Attributes:
        line: 1-based line number in the JSON Lines file.
        ids: prompt then response token ids, int64 ``[L]`` (after any truncation).
        prompt_len: ``m``, the number of prompt ids at the front.
    """

    line: int
    ids: np.ndarray
    prompt_len: int

    @property
    def n_inputs(self) -> int:
        """Input positions (real tokens) this example occupies in a row: ``L - 1``."""
        return len(self.ids) - 1


@dataclass(frozen=True)
class PackedRows:
    """Rows of ``T`` input positions, padding at the tail of each row.

    Attributes:
        input_ids: ``[R, T]`` int64 (padding: the pad id).
        targets: ``[R, T]`` int64, -100 on prompt and padding positions.
        position_ids: ``[R, T]`` int64, restarting at 0 for each example (and for the padding run).
        segment_ids: ``[R, T]`` int32: the example's index within its row, -1 on padding.
        real_tokens: ``[R]`` int64, non-padding input positions per row.
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    real_tokens: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class ModelInputs(dict):
    """Keyword arguments for a Hugging Face causal LM (``input_ids``, a 4-D ``attention_mask``
    ``[n, 1, T, T]`` and ``position_ids``), with ``n_real_tokens``: the micro-batch's non-padding
    input positions, the unit of tokens seen and FLOPs. Only the dict items go to the model."""

    n_real_tokens: int

    def __init__(self, *args: Any, n_real_tokens: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.n_real_tokens = n_real_tokens


def pack_examples(examples: list[Example], *, context_length_tokens: int, packing: str, pad_id: int = 0) -> PackedRows:
    """Lay examples into rows of ``T`` input positions (see the module docstring).

    ``packed`` is greedy next-fit in the given order: an example goes into the current row if it
    fits, else it starts a new row. ``padded`` puts one example in each row.

    Raises:
        ValueError: an example longer than ``T`` input positions (tokenize with the same ``T``).
    """
    T = context_length_tokens
    rows: list[list[Example]] = []
    used = T + 1
    for ex in examples:
        n = ex.n_inputs
        if n > T:
            raise ValueError(f"example at line {ex.line} has {n} input positions, more than {T}")
        if packing == "padded" or used + n > T:
            rows.append([])
            used = 0
        rows[-1].append(ex)
        used += n
    R = len(rows)
    input_ids = torch.full((R, T), pad_id, dtype=torch.int64)
    targets = torch.full((R, T), IGNORE_INDEX, dtype=torch.int64)
    position_ids = torch.zeros((R, T), dtype=torch.int64)
    segment_ids = torch.full((R, T), PAD_SEGMENT, dtype=torch.int32)
    real = torch.zeros(R, dtype=torch.int64)
    for r, row in enumerate(rows):
        at = 0
        for s, ex in enumerate(row):
            n = ex.n_inputs
            ids = torch.from_numpy(ex.ids)
            input_ids[r, at : at + n] = ids[:-1]
            tgt = ids[1:].clone()
            tgt[: max(ex.prompt_len - 1, 0)] = IGNORE_INDEX
            targets[r, at : at + n] = tgt
            position_ids[r, at : at + n] = torch.arange(n)
            segment_ids[r, at : at + n] = s
            at += n
        position_ids[r, at:] = torch.arange(T - at)
        real[r] = at
    return PackedRows(
        input_ids=input_ids, targets=targets, position_ids=position_ids, segment_ids=segment_ids, real_tokens=real
    )


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """4-D attention mask ``[n, 1, T, T]`` (bool, True = may attend): causal within a segment.

    Padding (segment -1) attends causally within its own block, so no query row is empty (an
    all-masked row gives NaN in scaled-dot-product attention); no real token attends to it.
    """
    T = segment_ids.shape[-1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (same & causal)[:, None]


def rows_batch(
    rows: PackedRows, idx: torch.Tensor, *, float_mask_dtype: torch.dtype | None = None
) -> tuple[ModelInputs, torch.Tensor]:
    """The micro-batch of rows ``idx``: model keyword arguments and targets ``[n, T]``.

    Args:
        float_mask_dtype: None for a boolean mask (scaled-dot-product attention); a float dtype for
            an additive mask (0 / the dtype's minimum) for eager attention.
    """
    mask = block_causal_mask(rows.segment_ids[idx])
    if float_mask_dtype is not None:
        mask = torch.zeros(mask.shape, dtype=float_mask_dtype).masked_fill(~mask, torch.finfo(float_mask_dtype).min)
    inputs = ModelInputs(
        input_ids=rows.input_ids[idx],
        attention_mask=mask,
        position_ids=rows.position_ids[idx],
        n_real_tokens=int(rows.real_tokens[idx].sum()),
    )
    return inputs, rows.targets[idx]
