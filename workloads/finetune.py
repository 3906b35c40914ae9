"""The fine-tuning workload: supervised fine-tuning of a local Hugging Face checkpoint, full or LoRA.

The model and its tokenizer load from a checkpoint directory with ``from_pretrained`` (no hub
access); LoRA adapters come from ``peft`` and are then the only trainable parameters. Data,
masking and packing are in :mod:`workloads.finetune_data`; the training loop is the shared
:func:`workloads.loop.run_loop`, so the search, tracking and analysis are those of pretraining.
Tokens seen and FLOPs count real (non-padding) input tokens, prompt tokens included: they are
computed even though they carry no loss.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workloads.config import TrialConfig
from workloads.data import DataError, _step_generator
from workloads.finetune_data import (
    FinetuneData,
    FinetuneOptions,
    ModelInputs,
    check_context_length,
    load_checkpoint_config,
    load_finetune_data,
    lora_config,
    resolve_checkpoint,
    resolve_tokenizer,
    rows_batch,
)
from workloads.flops import flops_per_token, lora_flops_per_token
from workloads.loop import Reporter, TrainingOutcome, run_loop
from workloads.model import ModelConfig, build_model, peak_flops_per_s, shape_of

__all__ = [
    "FinetuneWorkload",
    "build_finetune",
    "run_finetune",
    "load_checkpoint_model",
    "save_finetuned",
    "load_finetuned",
    "init_checkpoint",
    "FINETUNE_META_FILE",
]

log = logging.getLogger(__name__)

#: Written next to a fine-tuned checkpoint: base checkpoint, LoRA settings, data format.
FINETUNE_META_FILE = "critbatch_finetune.json"

#: Largest number of validation rows per batch, also bounded by ``_VAL_BATCH_TOKENS // T``.
_VAL_BATCH_ROWS = 64
_VAL_BATCH_TOKENS = 16384


def load_checkpoint_model(checkpoint_dir: str, *, merge_adapter: bool = True) -> torch.nn.Module:
    """A causal LM from a local checkpoint directory, in float32, scaled-dot-product attention when
    the architecture supports it (eager otherwise).

    A LoRA adapter directory (``adapter_config.json``) loads its base and the adapter; with
    ``merge_adapter`` the adapter is merged into the weights (a plain model to fine-tune further),
    otherwise a ``peft.PeftModel`` is returned.

    Raises:
        DataError: missing or unreadable checkpoint (see ``finetune_data.resolve_checkpoint``).
    """
    from transformers import AutoModelForCausalLM

    base, adapter = resolve_checkpoint(checkpoint_dir)
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True, dtype=torch.float32,
                                                         attn_implementation="sdpa")
        except ValueError:  # the architecture has no SDPA path
            model = AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True, dtype=torch.float32,
                                                         attn_implementation="eager")
    except (OSError, ValueError) as exc:
        raise DataError(f"finetune.checkpoint_dir: cannot load the model in {base}: {exc}") from None
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
        if merge_adapter:
            model = model.merge_and_unload()
    return model


@dataclass
class FinetuneWorkload:
    """Model, packed data and FLOP count of one fine-tuning trial (implements ``loop.Workload``).

    Attributes:
        model: the causal LM (a ``peft.PeftModel`` with LoRA, only adapters trainable).
        data: train and validation rows.
        cfg: the trial.
        opts: its ``finetune`` section.
        vocab_size: the model's number of ids.
        flops_per_token: training FLOPs per real token (full or LoRA convention).
        tokenizer_source: ``'byte'`` or the tokenizer directory used.
        base_dir: the base checkpoint directory (absolute).
        adapter_params: trainable adapter parameters (0 for full fine-tuning).
        float_mask_dtype: None (boolean masks for SDPA) or the dtype of additive masks (eager).
    """

    model: torch.nn.Module
    data: FinetuneData
    cfg: TrialConfig
    opts: FinetuneOptions
    vocab_size: int
    flops_per_token: float
    tokenizer_source: str
    base_dir: Path
    adapter_params: int = 0
    float_mask_dtype: torch.dtype | None = None

    def train_batch(self, *, step: int, global_batch_size_sequences: int, start: int, count: int, stream: int = 0
                    ) -> tuple[ModelInputs, torch.Tensor]:
        """Rows ``start .. start+count`` of step ``step``'s global batch.

        The global batch is ``global_batch_size_sequences`` rows drawn uniformly with replacement
        by a generator seeded by ``(seed, stream, step)`` (as ``workloads.data.window_batch``), so it
        is the same whatever the number of workers, and a resumed run continues exactly.

        Returns:
            ``(inputs, targets)``: model keyword arguments (``input_ids`` ``[count, T]``, a 4-D
            block-diagonal causal ``attention_mask`` ``[count, 1, T, T]``, ``position_ids``
            ``[count, T]``) and targets ``[count, T]`` with -100 on prompt and padding positions.
        """
        g = _step_generator(self.cfg.seed, step, stream)
        rows = torch.randint(0, len(self.data.train), (global_batch_size_sequences,), generator=g)
        return rows_batch(self.data.train, rows[start : start + count], float_mask_dtype=self.float_mask_dtype)

    def val_batches(self) -> list[tuple[ModelInputs, torch.Tensor]]:
        """The fixed held-out set: validation rows in order until ``cfg.eval_tokens`` real tokens (at
        least one row), in batches of at most ``min(64, 16384 // T)`` rows."""
        real = self.data.val.real_tokens
        cum = torch.cumsum(real, 0)
        n = int((cum < self.cfg.eval_tokens).sum()) + 1
        n = min(n, len(self.data.val))
        per = max(1, min(_VAL_BATCH_ROWS, _VAL_BATCH_TOKENS // self.cfg.context_length_tokens))
        return [rows_batch(self.data.val, torch.arange(i, min(i + per, n)), float_mask_dtype=self.float_mask_dtype)
                for i in range(0, n, per)]

    def real_tokens(self, inputs: Any, targets: torch.Tensor) -> int:
        """Non-padding input positions of a micro-batch (prompt and response tokens)."""
        if isinstance(inputs, ModelInputs):
            return inputs.n_real_tokens
        return int(targets.numel())


def build_finetune(cfg: TrialConfig, device: torch.device) -> FinetuneWorkload:
    """Load the checkpoint, its tokenizer and the data; add LoRA adapters when configured.

    The LoRA initialisation is seeded by ``cfg.seed`` (identical on every rank).

    Raises:
        workloads.data.DataError: missing checkpoint, unusable data (line and field named), a
            context longer than learned positions, LoRA targets that match nothing.
    """
    opts = FinetuneOptions.from_dict(cfg.finetune)
    T = cfg.context_length_tokens
    hf = load_checkpoint_config(opts.checkpoint_dir)
    check_context_length(hf, T)
    vocab = int(hf.vocab_size)
    source = resolve_tokenizer(opts.checkpoint_dir, cfg.tokenizer, vocab)
    data = load_finetune_data(cfg.data_path, tokenizer_source=source, opts=opts, context_length_tokens=T,
                              validation_fraction=cfg.validation_fraction, vocab_size=vocab)
    base_dir, _ = resolve_checkpoint(opts.checkpoint_dir)
    model = load_checkpoint_model(opts.checkpoint_dir)
    shape = shape_of(model.config, T)
    torch.manual_seed(cfg.seed)
    adapters = 0
    if opts.lora is not None:
        from peft import get_peft_model

        try:
            model = get_peft_model(model, lora_config(opts.lora))
        except ValueError as exc:
            raise DataError(f"finetune.lora.target_modules: {exc}") from None
        adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        c_tok = lora_flops_per_token(shape, adapters, frozen_head=True)
    else:
        c_tok = flops_per_token(shape)
    model = model.to(device)
    model.train()
    attn = getattr(model.config, "_attn_implementation", "sdpa")
    return FinetuneWorkload(
        model=model, data=data, cfg=cfg, opts=opts, vocab_size=vocab, flops_per_token=c_tok, tokenizer_source=source,
        base_dir=base_dir, adapter_params=adapters, float_mask_dtype=None if attn == "sdpa" else torch.float32,
    )


def run_finetune(cfg: TrialConfig, *, device: torch.device, report: Reporter, resume_state: dict[str, Any] | None = None,
                 save_dir: str | None = None) -> TrainingOutcome:
    """Run one fine-tuning trial; if ``save_dir`` is given, save the result there at the end.

    Same contract as ``workloads.pretrain.run_pretrain`` (the registry's ``finetune`` entry).
    Tokens seen, milestones and FLOPs count real input tokens; the validation loss is the mean
    cross-entropy (nats per token) on response tokens of the held-out examples.

    Raises:
        workloads.data.DataError: see :func:`build_finetune`.
    """
    work = build_finetune(cfg, device)
    outcome = run_loop(cfg, work, device=device, report=report, resume_state=resume_state,
                       peak_flops_per_s=peak_flops_per_s(device), attempt=0 if resume_state is None else 1)
    if save_dir is not None and outcome.status == "completed":
        save_finetuned(work, save_dir)
    return outcome


def save_finetuned(work: FinetuneWorkload, save_dir: str) -> None:
    """Save the fine-tuned model, its tokenizer and :data:`FINETUNE_META_FILE` in ``save_dir``.

    Full fine-tuning writes a complete Hugging Face checkpoint. LoRA writes only the adapter
    (``adapter_config.json`` + ``adapter_model.safetensors``, ``peft``'s ``save_pretrained``) whose
    ``base_model_name_or_path`` is the base checkpoint's absolute path; :func:`load_finetuned` (or
    ``peft.AutoPeftModelForCausalLM.from_pretrained``) reloads it while the base stays in place, and
    ``finetune.checkpoint_dir`` may point at it to fine-tune further. The weights saved are the
    trained (raw) weights, whose loss the last report gives as ``val_loss_raw``.
    """
    from workloads.tokenizer import save_tokenizer

    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = work.model
    if work.opts.lora is not None:
        model.peft_config["default"].base_model_name_or_path = str(work.base_dir)
    model.save_pretrained(str(out))
    save_tokenizer(work.tokenizer_source, str(out))
    meta = {
        "base_checkpoint": str(work.base_dir),
        "lora": work.opts.lora,
        "adapter_params": work.adapter_params,
        "prompt_field": work.opts.prompt_field,
        "response_field": work.opts.response_field,
        "prompt_template": work.opts.prompt_template,
        "packing": work.opts.packing,
        "context_length_tokens": work.cfg.context_length_tokens,
        "flops_per_token": work.flops_per_token,
    }
    (out / FINETUNE_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def load_finetuned(checkpoint_dir: str) -> torch.nn.Module:
    """Reload a checkpoint saved by :func:`save_finetuned` (or any local checkpoint), in eval mode.

    A LoRA result comes back as a ``peft.PeftModel`` over its base (adapter not merged, so its
    outputs are exactly those of the trained model).

    Raises:
        DataError: missing directory, or a LoRA adapter whose base checkpoint is gone.
    """
    return load_checkpoint_model(checkpoint_dir, merge_adapter=False).eval()


def init_checkpoint(directory: str, d_model: int, n_layers: int, n_heads: int, context_length_tokens: int, *,
                    d_ff: int | None = None, family: str = "llama", seed: int = 0, overwrite: bool = False) -> Path:
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
    from workloads.tokenizer import BYTE_VOCAB_SIZE, save_tokenizer

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
    model = build_model(ModelConfig(family=family, d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=d_ff,
                                    context_length_tokens=context_length_tokens, vocab_size=BYTE_VOCAB_SIZE))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    save_tokenizer("byte", str(out))
    return out
