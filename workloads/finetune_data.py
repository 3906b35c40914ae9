"""The inputs of a fine-tuning trial: instruction JSON Lines, the checkpoint, LoRA, FLOPs.

Data. Each line of the JSON Lines file is an object with a prompt field and a response field
(names configurable). An example's tokens are ``[bos] + tok(template(prompt)) + tok(response) +
[eos]`` (bos/eos only when the tokenizer defines them; the byte tokenizer has neither). Prompt and
response are tokenized separately so the boundary is exact. Loss is taken on response tokens
only: an example of ``L`` tokens whose prompt has ``m`` gives ``L - 1`` input positions, the first
``m - 1`` of whose targets are -100 (they predict prompt tokens).

Sequences. ``packed``: examples are laid end to end into rows of ``T = context_length_tokens``
input positions (greedy, in file order; an example never spans two rows), and a 4-D block-diagonal
causal attention mask plus per-example ``position_ids`` keep examples from seeing each other, so a
packed example's logits equal its logits alone. ``padded``: one example per row. In both, the
row's tail is padding: id 0 (or the tokenizer's pad id), target -100, its own attention block, and
never counted as a token.

The held-out split is the last ``validation_fraction`` of the examples (file order). Every problem
is a :class:`workloads.data.DataError` naming the line and the field, raised before launch by
:func:`check_finetune_inputs`.
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workloads.data import DataError

__all__ = [
    "FinetuneOptions",
    "Example",
    "PackedRows",
    "FinetuneData",
    "ModelInputs",
    "read_records",
    "tokenize_examples",
    "pack_examples",
    "block_causal_mask",
    "rows_batch",
    "load_finetune_data",
    "resolve_checkpoint",
    "resolve_tokenizer",
    "load_checkpoint_config",
    "check_context_length",
    "lora_config",
    "count_adapter_params",
    "finetune_flops_per_token",
    "finetune_flops_convention",
    "LORA_FLOPS_CONVENTION",
    "check_finetune_inputs",
]

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
PAD_SEGMENT = -1
_MAX_LISTED = 5


@dataclass(frozen=True, kw_only=True)
class FinetuneOptions:
    """The ``finetune`` section of a trial (``sweeps.spec.FinetuneSpec`` as a dict).

    Attributes:
        checkpoint_dir: a local Hugging Face checkpoint (``config.json`` + weights), or a LoRA
            adapter directory saved by this workload.
        prompt_field, response_field: JSON keys of each line.
        prompt_template: text around the prompt; must contain ``{prompt}`` (replaced literally, so
            other braces are kept as they are).
        packing: ``"packed"`` or ``"padded"``.
        truncate: cut over-long examples to the context length (counted; an example whose prompt
            alone fills the context is skipped, also counted) instead of refusing the data.
        lora: None (full fine-tuning) or ``{rank, alpha, dropout, target_modules}``.
    """

    checkpoint_dir: str
    prompt_field: str = "question"
    response_field: str = "answer"
    prompt_template: str = "Question: {prompt}\nAnswer: "
    packing: str = "packed"
    truncate: bool = False
    lora: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if "{prompt}" not in self.prompt_template:
            raise DataError(f"finetune.prompt_template must contain '{{prompt}}': {self.prompt_template!r}")
        if self.packing not in ("packed", "padded"):
            raise DataError(f"finetune.packing must be 'packed' or 'padded', got {self.packing!r}")
        if not self.prompt_field or not self.response_field:
            raise DataError("finetune.prompt_field and finetune.response_field must not be empty")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "FinetuneOptions":
        """Build from ``TrialConfig.finetune``.

        Raises:
            DataError: missing (None), unknown keys, or an invalid field (named).
        """
        if d is None:
            raise DataError("the finetune workload needs a 'finetune' section (checkpoint_dir, fields, template)")
        known = {"checkpoint_dir", "prompt_field", "response_field", "prompt_template", "packing", "truncate", "lora"}
        unknown = set(d) - known
        if unknown:
            raise DataError(f"finetune: unknown keys {sorted(unknown)}")
        if "checkpoint_dir" not in d:
            raise DataError("finetune.checkpoint_dir is required")
        return cls(**d)

    def template(self, prompt: str) -> str:
        """The prompt text the model sees."""
        return self.prompt_template.replace("{prompt}", prompt)


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


# ---- reading --------------------------------------------------------------------------------


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
    records: list[tuple[int, str, str]], tokenizer, opts: FinetuneOptions, *, context_length_tokens: int, vocab_size: int,
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
        "truncated": len(truncated), "skipped": len(skipped),
        "truncated_lines": truncated[:_MAX_LISTED], "skipped_lines": skipped[:_MAX_LISTED],
    }
    return examples, stats


# ---- packing --------------------------------------------------------------------------------


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
    return PackedRows(input_ids=input_ids, targets=targets, position_ids=position_ids, segment_ids=segment_ids,
                      real_tokens=real)


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """4-D attention mask ``[n, 1, T, T]`` (bool, True = may attend): causal within a segment.

    Padding (segment -1) attends causally within its own block, so no query row is empty (an
    all-masked row gives NaN in scaled-dot-product attention); no real token attends to it.
    """
    T = segment_ids.shape[-1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (same & causal)[:, None]


def rows_batch(rows: PackedRows, idx: torch.Tensor, *, float_mask_dtype: torch.dtype | None = None
               ) -> tuple[ModelInputs, torch.Tensor]:
    """The micro-batch of rows ``idx``: model keyword arguments and targets ``[n, T]``.

    Args:
        float_mask_dtype: None for a boolean mask (scaled-dot-product attention); a float dtype for
            an additive mask (0 / the dtype's minimum) for eager attention.
    """
    mask = block_causal_mask(rows.segment_ids[idx])
    if float_mask_dtype is not None:
        mask = torch.zeros(mask.shape, dtype=float_mask_dtype).masked_fill(~mask, torch.finfo(float_mask_dtype).min)
    inputs = ModelInputs(input_ids=rows.input_ids[idx], attention_mask=mask, position_ids=rows.position_ids[idx],
                         n_real_tokens=int(rows.real_tokens[idx].sum()))
    return inputs, rows.targets[idx]


# ---- checkpoint and tokenizer ---------------------------------------------------------------


def resolve_checkpoint(checkpoint_dir: str) -> tuple[Path, Path | None]:
    """``(base model directory, LoRA adapter directory or None)`` of a checkpoint directory.

    A directory with ``config.json`` is a full model. One with ``adapter_config.json`` (a LoRA
    result of this workload) names its base in ``base_model_name_or_path``.

    Raises:
        DataError: the directory is missing, holds neither file, or the adapter's base is missing.
    """
    p = Path(checkpoint_dir).expanduser()
    hint = ("build a tiny one with `critbatch init-checkpoint DIR`, or use a pretraining sweep's "
            "OUT/best_checkpoint")
    if not p.is_dir():
        raise DataError(f"finetune.checkpoint_dir: directory not found: {checkpoint_dir} ({hint})")
    p = p.resolve()
    if (p / "config.json").is_file():
        return p, None
    if (p / "adapter_config.json").is_file():
        try:
            base = json.loads((p / "adapter_config.json").read_text())["base_model_name_or_path"]
        except (ValueError, KeyError) as exc:
            raise DataError(f"finetune.checkpoint_dir: unreadable adapter_config.json in {p}: {exc}") from None
        bp = Path(base) if Path(base).is_absolute() else (p / base)
        if not (bp / "config.json").is_file():
            raise DataError(f"finetune.checkpoint_dir: the LoRA adapter in {p} needs its base model {base}, which is not a local checkpoint")
        return bp.resolve(), p
    raise DataError(f"finetune.checkpoint_dir: {checkpoint_dir} is not a Hugging Face checkpoint (no config.json) ({hint})")


def load_checkpoint_config(checkpoint_dir: str):
    """The ``transformers`` config of a checkpoint (of its base, for a LoRA adapter directory).

    Raises:
        DataError: see :func:`resolve_checkpoint`; or ``config.json`` cannot be read.
    """
    from transformers import AutoConfig

    base, _ = resolve_checkpoint(checkpoint_dir)
    try:
        return AutoConfig.from_pretrained(str(base), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"finetune.checkpoint_dir: cannot read {base / 'config.json'}: {exc}") from None


def resolve_tokenizer(checkpoint_dir: str, data_tokenizer: str, vocab_size: int) -> str:
    """Which tokenizer a fine-tuning run uses, as ``'byte'`` or a directory.

    Order: ``data.tokenizer`` when it is a directory (explicit); else the tokenizer saved in the
    checkpoint (or next to a LoRA adapter, else with its base); else ``'byte'`` when the model has
    256 ids.

    Raises:
        DataError: no tokenizer found for a model that is not byte-level.
    """
    from workloads.tokenizer import BYTE_VOCAB_SIZE, has_tokenizer_files

    if data_tokenizer != "byte":
        if not has_tokenizer_files(data_tokenizer):
            raise DataError(f"data.tokenizer: no Hugging Face tokenizer in {data_tokenizer}")
        return str(Path(data_tokenizer).resolve())
    base, adapter = resolve_checkpoint(checkpoint_dir)
    for d in (adapter, base):
        if d is not None and has_tokenizer_files(d):
            return str(d)
    if vocab_size == BYTE_VOCAB_SIZE:
        return "byte"
    raise DataError(
        f"finetune.checkpoint_dir: {checkpoint_dir} holds no tokenizer and the model has {vocab_size} ids "
        "(not byte-level); save the tokenizer there or set data.tokenizer to its directory"
    )


def _positions_limit(hf_config) -> tuple[int | None, bool]:
    """``(max positions, learned absolute positions?)`` of a config."""
    if getattr(hf_config, "n_positions", None):
        return int(hf_config.n_positions), True
    mpe = getattr(hf_config, "max_position_embeddings", None)
    return (int(mpe) if mpe else None), False


def check_context_length(hf_config, context_length_tokens: int) -> None:
    """Refuse a context longer than learned absolute position embeddings; warn for rotary ones.

    Raises:
        DataError: ``context_length_tokens`` exceeds a GPT-2-style ``n_positions``.
    """
    limit, absolute = _positions_limit(hf_config)
    if limit is None or context_length_tokens <= limit:
        return
    if absolute:
        raise DataError(
            f"model.context_length_tokens={context_length_tokens} exceeds the checkpoint's learned positions "
            f"(n_positions={limit}); lower it to <= {limit}"
        )
    log.warning("model.context_length_tokens=%d exceeds the checkpoint's max_position_embeddings=%d: "
                "rotary positions beyond the pretraining context are extrapolated", context_length_tokens, limit)


# ---- the data set ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int, tokenizer_source: str, data_fields: tuple, T: int,
                 validation_fraction: float, vocab_size: int, pad_id: int) -> FinetuneData:
    from workloads.tokenizer import load_tokenizer

    opts = FinetuneOptions(checkpoint_dir="", **dict(data_fields))

    records = read_records(path, opts.prompt_field, opts.response_field)
    tok = load_tokenizer(tokenizer_source)
    examples, stats = tokenize_examples(records, tok, opts, context_length_tokens=T, vocab_size=vocab_size, path=path)
    n_val = int(len(examples) * validation_fraction)
    if n_val < 1 or len(examples) - n_val < 1:
        raise DataError(
            f"{path}: {len(examples)} usable examples with validation_fraction={validation_fraction} leave "
            f"{len(examples) - n_val} for training and {n_val} for validation; each needs at least 1"
        )
    train = pack_examples(examples[: len(examples) - n_val], context_length_tokens=T, packing=opts.packing, pad_id=pad_id)
    val = pack_examples(examples[len(examples) - n_val :], context_length_tokens=T, packing=opts.packing, pad_id=pad_id)
    stats.update(
        examples=len(examples) + stats["skipped"], train_examples=len(examples) - n_val, validation_examples=n_val,
        train_rows=len(train), validation_rows=len(val), train_real_tokens=int(train.real_tokens.sum()),
        validation_real_tokens=int(val.real_tokens.sum()), tokenizer=tokenizer_source,
    )
    return FinetuneData(train=train, val=val, stats=stats)


def load_finetune_data(path: str, *, tokenizer_source: str, opts: FinetuneOptions, context_length_tokens: int,
                       validation_fraction: float, vocab_size: int, pad_id: int = 0) -> FinetuneData:
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
    data_fields = tuple((k, getattr(opts, k)) for k in ("prompt_field", "response_field", "prompt_template", "packing", "truncate"))
    data = _load_cached(str(p.resolve()), p.stat().st_mtime_ns, tokenizer_source, data_fields, context_length_tokens,
                        validation_fraction, vocab_size, pad_id)
    if data.stats["truncated"] or data.stats["skipped"]:
        log.warning("%s: %d example(s) truncated to context_length_tokens=%d (lines %s...), %d skipped (lines %s...)",
                    path, data.stats["truncated"], context_length_tokens, data.stats["truncated_lines"],
                    data.stats["skipped"], data.stats["skipped_lines"])
    return data


# ---- LoRA and FLOPs -------------------------------------------------------------------------


def lora_config(lora: dict[str, Any]):
    """A ``peft.LoraConfig`` for causal-LM fine-tuning from ``{rank, alpha, dropout, target_modules}``.

    Target modules match ``peft``'s way: a module whose name ends with one of the given names.
    """
    from peft import LoraConfig

    return LoraConfig(r=int(lora["rank"]), lora_alpha=float(lora["alpha"]), lora_dropout=float(lora.get("dropout", 0.0)),
                      target_modules=list(lora["target_modules"]), bias="none", task_type="CAUSAL_LM")


def count_adapter_params(hf_config, lora: dict[str, Any]) -> int:
    """Parameters the LoRA adapters add to a model of ``hf_config``: ``sum r*(d_in + d_out)`` over targets.

    Counted by applying ``peft`` to the model built on the ``meta`` device (no memory, no weights),
    so the module matching is exactly the one training uses.

    Raises:
        DataError: no module of the model matches ``target_modules``.
    """
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    try:
        with warnings.catch_warnings():  # peft's own use of a deprecated transformers name; not the user's concern
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            peft_model = get_peft_model(model, lora_config(lora))
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) or
                        type(m).__name__ == "Conv1D"})
        raise DataError(f"finetune.lora.target_modules: {exc} (this model's linear layers: {names})") from None
    return sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


#: The LoRA counterpart of ``workloads.flops.FLOPS_CONVENTION`` (methodology section 9.4).
LORA_FLOPS_CONVENTION = ("4*N_matmul + 6*N_adapter + 12*n_layer*n_ctx*d_attn + 4*d_model*vocab "
                         "(frozen weights: fwd + activation grad; adapters: fwd + both grads; dense attention, no norms)")


def finetune_flops_convention(lora: dict[str, Any] | None) -> str:
    """The FLOP-counting convention of a fine-tuning run, to log beside its FLOPs per token."""
    from workloads.flops import FLOPS_CONVENTION

    return FLOPS_CONVENTION if lora is None else LORA_FLOPS_CONVENTION


def finetune_flops_per_token(checkpoint_dir: str, context_length_tokens: int, lora: dict[str, Any] | None) -> float:
    """Training FLOPs per real token of fine-tuning a checkpoint (``workloads.flops`` convention).

    Full fine-tuning: ``flops_per_token`` (6 N_matmul + 12 n_layer n_ctx d_attn + 6 d V).
    LoRA: ``lora_flops_per_token`` (methodology section 9.4): frozen weights cost forward plus the
    activation gradient, ``4 N_frozen + 6 N_adapter + 12 n_layer n_ctx d_attn + 4 d V``; layers below
    the lowest adapter are charged the full backward too (an upper bound by at most 2 N per token).

    Args:
        checkpoint_dir: the model (see :func:`resolve_checkpoint`).
        context_length_tokens: n_ctx, the fine-tuning sequence length (dense attention over it).
        lora: None, or ``{rank, alpha, dropout, target_modules}``.

    Raises:
        DataError: missing checkpoint; LoRA targets that match nothing.
    """
    from workloads.flops import flops_per_token, lora_flops_per_token
    from workloads.model import shape_of

    hf = load_checkpoint_config(checkpoint_dir)
    shape = shape_of(hf, context_length_tokens)
    if lora is None:
        return flops_per_token(shape)
    return lora_flops_per_token(shape, count_adapter_params(hf, lora), frozen_head=True)


def _field(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def check_finetune_inputs(spec: Any) -> dict[str, Any]:
    """Check everything a fine-tuning sweep reads, before launch (called by the driver's preflight).

    Args:
        spec: a ``sweeps.spec.SweepSpec`` (read by attribute: ``finetune``, ``data.path``,
            ``data.tokenizer``, ``data.validation_fraction``, ``model.context_length_tokens``).
            Relative paths resolve from the working directory.

    Returns:
        the data set's ``stats`` (see :class:`FinetuneData`) plus ``flops_per_token``,
        ``flops_convention``, ``adapter_params`` (0 for full fine-tuning), ``checkpoint_dir``
        (absolute) and ``mean_real_tokens_per_row`` (training rows; the tokens a "sequence" holds).

    Raises:
        DataError: a missing checkpoint or data file; a line that is not a JSON object or lacks a
            configured field; an over-long example (unless ``finetune.truncate``); a context longer
            than learned positions; LoRA targets that match no module; too few examples.
    """
    ft = spec.finetune
    d = ft.model_dump() if hasattr(ft, "model_dump") else dict(ft)
    opts = FinetuneOptions.from_dict(d)
    T = int(spec.model.context_length_tokens)
    hf = load_checkpoint_config(opts.checkpoint_dir)
    check_context_length(hf, T)
    vocab = int(hf.vocab_size)
    source = resolve_tokenizer(opts.checkpoint_dir, _field(spec.data, "tokenizer"), vocab)
    path = str(Path(_field(spec.data, "path")).expanduser().resolve())
    data = load_finetune_data(path, tokenizer_source=source, opts=opts, context_length_tokens=T,
                              validation_fraction=float(_field(spec.data, "validation_fraction")), vocab_size=vocab)
    from workloads.flops import flops_per_token, lora_flops_per_token
    from workloads.model import shape_of

    shape = shape_of(hf, T)
    if opts.lora is None:
        adapters, c_tok = 0, flops_per_token(shape)
    else:
        adapters = count_adapter_params(hf, opts.lora)
        c_tok = lora_flops_per_token(shape, adapters, frozen_head=True)
    out = dict(data.stats)
    out.update(flops_per_token=c_tok, flops_convention=finetune_flops_convention(opts.lora), adapter_params=adapters,
               checkpoint_dir=str(Path(opts.checkpoint_dir).expanduser().resolve()),
               mean_real_tokens_per_row=data.stats["train_real_tokens"] / max(data.stats["train_rows"], 1))
    return out
