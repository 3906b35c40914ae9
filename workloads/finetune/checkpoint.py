"""Fine-tuning checkpoints: finding a local checkpoint (or a LoRA adapter and its base), its
config, its tokenizer and its position limit; loading it; writing a fresh tiny one to fine-tune offline.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Literal

import torch

from workloads.config import ModelConfig
from workloads.errors import DataError
from workloads.model.hf import build_model

__all__ = [
    "check_context_length",
    "init_checkpoint",
    "load_checkpoint_config",
    "load_checkpoint_model",
    "load_finetuned",
    "resolve_checkpoint",
    "resolve_tokenizer",
]

log = logging.getLogger(__name__)


def resolve_checkpoint(checkpoint_dir: str) -> tuple[Path, Path | None]:
    """``(base model directory, LoRA adapter directory or None)`` of a checkpoint directory.

    A directory with ``config.json`` is a full model. One with ``adapter_config.json`` (a LoRA
    result of this workload) names its base in ``base_model_name_or_path``.

    Raises:
        DataError: the directory is missing, holds neither file, or the adapter's base is missing.
    """
    p = Path(checkpoint_dir).expanduser()
    hint = "build a tiny one with `critbatch init-checkpoint DIR`, or use a pretraining sweep's OUT/best_checkpoint"
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
            raise DataError(
                f"finetune.checkpoint_dir: the LoRA adapter in {p} needs its base model {base}, which is not a local checkpoint"
            )
        return bp.resolve(), p
    raise DataError(
        f"finetune.checkpoint_dir: {checkpoint_dir} is not a Hugging Face checkpoint (no config.json) ({hint})"
    )


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
    from workloads.data.tokenizer import BYTE_VOCAB_SIZE, has_tokenizer_files

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
    log.warning(
        "model.context_length_tokens=%d exceeds the checkpoint's max_position_embeddings=%d: "
        "rotary positions beyond the pretraining context are extrapolated",
        context_length_tokens,
        limit,
    )


def load_checkpoint_model(checkpoint_dir: str, *, merge_adapter: bool = True) -> torch.nn.Module:
    """A causal LM from a local checkpoint directory, in float32, scaled-dot-product attention when
    the architecture supports it (eager otherwise).

    A LoRA adapter directory (``adapter_config.json``) loads its base and the adapter; with
    ``merge_adapter`` the adapter is merged into the weights (a plain model to fine-tune further),
    otherwise a ``peft.PeftModel`` is returned.

    Raises:
        DataError: missing or unreadable checkpoint (see :func:`resolve_checkpoint`).
    """
    from transformers import AutoModelForCausalLM

    base, adapter = resolve_checkpoint(checkpoint_dir)
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(base), local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
            )
        except ValueError:  # the architecture has no SDPA path
            model = AutoModelForCausalLM.from_pretrained(
                str(base), local_files_only=True, dtype=torch.float32, attn_implementation="eager"
            )
    except (OSError, ValueError) as exc:
        raise DataError(f"finetune.checkpoint_dir: cannot load the model in {base}: {exc}") from None
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
        if merge_adapter:
            model = model.merge_and_unload()
    return model


def load_finetuned(checkpoint_dir: str) -> torch.nn.Module:
    """Reload a checkpoint saved by :func:`save_finetuned` (or any local checkpoint), in eval mode.

    A LoRA result comes back as a ``peft.PeftModel`` over its base (adapter not merged, so its
    outputs are exactly those of the trained model).

    Raises:
        DataError: missing directory, or a LoRA adapter whose base checkpoint is gone.
    """
    return load_checkpoint_model(checkpoint_dir, merge_adapter=False).eval()


def init_checkpoint(
    directory: str,
    d_model: int,
    n_layers: int,
    n_heads: int,
    context_length_tokens: int,
    *,
    d_ff: int | None = None,
    family: Literal["llama", "gpt2"] = "llama",
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write a freshly initialised byte-level causal LM and its tokenizer: a checkpoint to fine-tune offline.

    Args:
        directory: created if missing.
        d_model, n_layers, n_heads: the architecture (``d_model`` divisible by ``n_heads``).
        context_length_tokens: ``max_position_embeddings`` (``n_positions`` for GPT-2).
        d_ff: MLP width; default as ``sweeps.spec.ModelSpec`` (8/3 d_model rounded up to 16 for
            Llama, 4 d_model for GPT-2).
        family: ``'llama'`` or ``'gpt2'``.
        seed: initialisation seed.
        overwrite: replace a checkpoint already in ``directory``.

    Returns:
        the directory (absolute).

    Raises:
        FileExistsError: ``directory`` already holds a checkpoint and not ``overwrite``.
        ValueError: ``d_model`` not divisible by ``n_heads``, non-positive sizes, unknown family.
    """
    from workloads.data.tokenizer import BYTE_VOCAB_SIZE, save_tokenizer

    if min(d_model, n_layers, n_heads, context_length_tokens) <= 0:
        raise ValueError("d_model, n_layers, n_heads and context_length_tokens must be positive")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    out = Path(directory).expanduser().resolve()
    if (out / "config.json").exists() and not overwrite:
        raise FileExistsError(f"{out} already holds a checkpoint (config.json); pass overwrite to replace it")
    if d_ff is None:
        d_ff = 4 * d_model if family == "gpt2" else int(math.ceil(8 * d_model / 3 / 16) * 16)
    torch.manual_seed(seed)
    model = build_model(
        ModelConfig(
            family=family,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            d_ff=d_ff,
            context_length_tokens=context_length_tokens,
        ),
        BYTE_VOCAB_SIZE,
    )
    from transformers import PreTrainedModel

    assert isinstance(model, PreTrainedModel)  # build_model's
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    save_tokenizer("byte", str(out))
    return out
