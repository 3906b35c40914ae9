"""The fine-tuning workload: supervised fine-tuning of a local Hugging Face checkpoint, full or LoRA.

The model and its tokenizer load from a checkpoint directory with ``from_pretrained`` (no hub
access); LoRA adapters come from ``peft`` and are then the only trainable parameters. Data,
masking and packing are in :mod:`workloads.finetune.examples` and :mod:`workloads.finetune.packing`,
the checkpoint in :mod:`workloads.finetune.checkpoint`, LoRA in :mod:`workloads.finetune.lora`; the training loop is the shared
:func:`workloads.train.loop.run_loop`, so the search, tracking and analysis are those of pretraining.
Tokens seen and FLOPs count real (non-padding) input tokens, prompt tokens included: they are
computed even though they carry no loss.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workloads.config import FinetuneConfig, TrialConfig, WorkloadConfig
from workloads.data.corpus import step_generator
from workloads.errors import DataError
from workloads.finetune.checkpoint import (
    check_context_length,
    load_checkpoint_config,
    load_checkpoint_model,
    resolve_checkpoint,
    resolve_tokenizer,
)
from workloads.finetune.examples import FinetuneData, load_finetune_data
from workloads.finetune.lora import (
    count_adapter_params,
    finetune_flops_convention,
    finetune_flops_per_token,
    lora_config,
)
from workloads.finetune.packing import ModelInputs, rows_batch
from workloads.model.flops import flops_per_token, lora_flops_per_token
from workloads.model.hf import peak_flops_per_s, shape_of
from workloads.train.hooks import MilestoneHook
from workloads.train.loop import Reporter, TrainingOutcome, run_loop

__all__ = [
    "FINETUNE_META_FILE",
    "FinetuneWorkload",
    "build_finetune",
    "check_finetune_inputs",
    "finetune_flops",
    "finetune_tokens_per_sequence",
    "run_finetune",
    "save_finetuned",
]

log = logging.getLogger(__name__)

#: Written next to a fine-tuned checkpoint: base checkpoint, LoRA settings, data format.
FINETUNE_META_FILE = "critbatch_finetune.json"

#: Largest number of validation rows per batch, also bounded by ``_VAL_BATCH_TOKENS // T``.
_VAL_BATCH_ROWS = 64
_VAL_BATCH_TOKENS = 16384


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
    opts: FinetuneConfig
    vocab_size: int
    flops_per_token: float
    tokenizer_source: str
    base_dir: Path
    adapter_params: int = 0
    float_mask_dtype: torch.dtype | None = None

    def train_batch(
        self, *, step: int, global_batch_size_sequences: int, start: int, count: int, stream: int = 0
    ) -> tuple[ModelInputs, torch.Tensor]:
        """Rows ``start .. start+count`` of step ``step``'s global batch.

        The global batch is ``global_batch_size_sequences`` rows drawn uniformly with replacement
        by a generator seeded by ``(seed, stream, step)`` (as ``workloads.data.corpus.window_batch``), so it
        is the same whatever the number of workers, and a resumed run continues exactly.

        Returns:
            ``(inputs, targets)``: model keyword arguments (``input_ids`` ``[count, T]``, a 4-D
            block-diagonal causal ``attention_mask`` ``[count, 1, T, T]``, ``position_ids``
            ``[count, T]``) and targets ``[count, T]`` with -100 on prompt and padding positions.
        """
        g = step_generator(self.cfg.seed, step, stream)
        rows = torch.randint(0, len(self.data.train), (global_batch_size_sequences,), generator=g)
        return rows_batch(self.data.train, rows[start : start + count], float_mask_dtype=self.float_mask_dtype)

    def val_batches(self) -> list[tuple[ModelInputs, torch.Tensor]]:
        """The fixed held-out set: validation rows in order until ``cfg.eval.eval_tokens`` real tokens (at
        least one row), in batches of at most ``min(64, 16384 // T)`` rows."""
        real = self.data.val.real_tokens
        cum = torch.cumsum(real, 0)
        n = int((cum < self.cfg.eval.eval_tokens).sum()) + 1
        n = min(n, len(self.data.val))
        per = max(1, min(_VAL_BATCH_ROWS, _VAL_BATCH_TOKENS // self.cfg.context_length_tokens))
        return [
            rows_batch(self.data.val, torch.arange(i, min(i + per, n)), float_mask_dtype=self.float_mask_dtype)
            for i in range(0, n, per)
        ]

    def real_tokens(self, inputs: Any, targets: torch.Tensor) -> int:
        """Non-padding input positions of a micro-batch (prompt and response tokens)."""
        if isinstance(inputs, ModelInputs):
            return inputs.n_real_tokens
        return int(targets.numel())


def _data_path(wc: WorkloadConfig) -> str:
    """``data.path``, the JSONL file fine-tuning reads.

    Raises:
        DataError: no ``data.path`` (prepared ``data.shards`` hold no examples).
    """
    if wc.data.path is None:
        raise DataError("data.path: fine-tuning reads a JSONL file of examples, not data.shards")
    return wc.data.path


def _load_inputs(wc: WorkloadConfig, data_path: str) -> tuple[FinetuneConfig, Any, int, str, FinetuneData]:
    """``(finetune section, checkpoint config, vocabulary size, tokenizer source, data)`` of a
    fine-tuning workload, checked: the context fits the checkpoint, the data fits the tokenizer."""
    opts = wc.finetune
    if opts is None:
        raise DataError("the finetune workload needs a 'finetune' section (checkpoint_dir, fields, template)")
    T = wc.model.context_length_tokens
    hf = load_checkpoint_config(opts.checkpoint_dir)
    check_context_length(hf, T)
    vocab = int(hf.vocab_size)
    source = resolve_tokenizer(opts.checkpoint_dir, wc.data.tokenizer, vocab)
    data = load_finetune_data(
        data_path,
        tokenizer_source=source,
        opts=opts,
        context_length_tokens=T,
        validation_fraction=wc.data.validation_fraction,
        vocab_size=vocab,
    )
    return opts, hf, vocab, source, data


def build_finetune(cfg: TrialConfig, device: torch.device) -> FinetuneWorkload:
    """Load the checkpoint, its tokenizer and the data; add LoRA adapters when configured.

    The LoRA initialisation is seeded by ``cfg.seed`` (identical on every rank).

    Raises:
        workloads.errors.DataError: missing checkpoint, unusable data (line and field named), a
            context longer than learned positions, LoRA targets that match nothing.
    """
    opts, _, vocab, source, data = _load_inputs(cfg.workload, _data_path(cfg.workload))
    base_dir, _ = resolve_checkpoint(opts.checkpoint_dir)
    model = load_checkpoint_model(opts.checkpoint_dir)
    shape = shape_of(model.config, cfg.context_length_tokens)
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
        model=model,
        data=data,
        cfg=cfg,
        opts=opts,
        vocab_size=vocab,
        flops_per_token=c_tok,
        tokenizer_source=source,
        base_dir=base_dir,
        adapter_params=adapters,
        float_mask_dtype=None if attn == "sdpa" else torch.float32,
    )


def run_finetune(
    cfg: TrialConfig,
    *,
    device: torch.device,
    report: Reporter,
    resume_state: dict[str, Any] | None = None,
    save_dir: str | None = None,
    on_milestone: Sequence[MilestoneHook] = (),
) -> TrainingOutcome:
    """Run one fine-tuning trial; if ``save_dir`` is given, save the result there at the end.

    Same contract as ``workloads.pretrain.run_pretrain`` (the ``finetune`` entry of
    :mod:`workloads.api`). Tokens seen, milestones and FLOPs count real input tokens; the
    validation loss is the mean cross-entropy (nats per token) on response tokens of the held-out
    examples. ``on_milestone``: :func:`workloads.train.loop.run_loop`'s hooks (tests only).

    Raises:
        workloads.errors.DataError: see :func:`build_finetune`.
        ValueError: ``training.parallelism: fsdp`` (fine-tuning runs ddp; the spec refuses it first).
    """
    if cfg.training.parallelism != "ddp":
        raise ValueError(
            "training.parallelism: the finetune workload (full or LoRA) runs ddp only, "
            f"got {cfg.training.parallelism!r}"
        )
    work = build_finetune(cfg, device)
    outcome = run_loop(
        cfg,
        work,
        device=device,
        report=report,
        resume_state=resume_state,
        peak_flops_per_s=peak_flops_per_s(device),
        attempt=0 if resume_state is None else 1,
        on_milestone=on_milestone,
    )
    if save_dir is not None and outcome.status == "completed":
        save_finetuned(work, save_dir)
    return outcome


def save_finetuned(work: FinetuneWorkload, save_dir: str) -> None:
    """Save the fine-tuned model, its tokenizer and :data:`FINETUNE_META_FILE` in ``save_dir``.

    Full fine-tuning writes a complete Hugging Face checkpoint. LoRA writes only the adapter
    (``adapter_config.json`` + ``adapter_model.safetensors``, ``peft``'s ``save_pretrained``) whose
    ``base_model_name_or_path`` is the base checkpoint's absolute path;
    :func:`workloads.finetune.checkpoint.load_finetuned` (or
    ``peft.AutoPeftModelForCausalLM.from_pretrained``) reloads it while the base stays in place, and
    ``finetune.checkpoint_dir`` may point at it to fine-tune further. The weights saved are the
    trained (raw) weights, whose loss the last report gives as ``val_loss_raw``.
    """
    from workloads.data.tokenizer import save_tokenizer

    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = work.model
    if work.opts.lora is not None:
        from peft import PeftModel

        assert isinstance(model, PeftModel)  # build_finetune wrapped it
        model.peft_config["default"].base_model_name_or_path = str(work.base_dir)
    else:
        from transformers import PreTrainedModel

        assert isinstance(model, PreTrainedModel)  # the checkpoint's transformers model
    model.save_pretrained(str(out))
    save_tokenizer(work.tokenizer_source, str(out))
    meta = {
        "base_checkpoint": str(work.base_dir),
        "lora": work.opts.lora.to_dict() if work.opts.lora is not None else None,
        "adapter_params": work.adapter_params,
        "prompt_field": work.opts.prompt_field,
        "response_field": work.opts.response_field,
        "prompt_template": work.opts.prompt_template,
        "packing": work.opts.packing,
        "context_length_tokens": work.cfg.context_length_tokens,
        "flops_per_token": work.flops_per_token,
    }
    (out / FINETUNE_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def check_finetune_inputs(wc: WorkloadConfig) -> dict[str, Any]:
    """Check everything a fine-tuning sweep reads, before launch (the sweep's preflight).

    Args:
        wc: the workload (``finetune``, ``data``, ``model.context_length_tokens``). Relative paths
            resolve from the working directory.

    Returns:
        the data set's ``stats`` (see :class:`workloads.finetune.examples.FinetuneData`) plus
        ``flops_per_token``, ``flops_convention``, ``adapter_params`` (0 for full fine-tuning),
        ``checkpoint_dir`` (absolute) and ``mean_real_tokens_per_row`` (training rows; the tokens a
        "sequence" holds).

    Raises:
        DataError: a missing checkpoint or data file; a line that is not a JSON object or lacks a
            configured field; an over-long example (unless ``finetune.truncate``); a context longer
            than learned positions; LoRA targets that match no module; too few examples; no
            ``finetune`` section.
    """
    path = str(Path(_data_path(wc)).expanduser().resolve())
    opts, hf, _, _, data = _load_inputs(wc, path)
    shape = shape_of(hf, wc.model.context_length_tokens)
    if opts.lora is None:
        adapters, c_tok = 0, flops_per_token(shape)
    else:
        adapters = count_adapter_params(hf, opts.lora)
        c_tok = lora_flops_per_token(shape, adapters, frozen_head=True)
    out = dict(data.stats)
    out.update(
        flops_per_token=c_tok,
        flops_convention=finetune_flops_convention(opts.lora),
        adapter_params=adapters,
        checkpoint_dir=str(Path(opts.checkpoint_dir).expanduser().resolve()),
        mean_real_tokens_per_row=data.stats["train_real_tokens"] / max(data.stats["train_rows"], 1),
    )
    return out


def finetune_flops(wc: WorkloadConfig) -> tuple[float, str]:
    """``(training FLOPs per real token, their convention)`` of fine-tuning ``wc``'s checkpoint
    (:func:`workloads.finetune.lora.finetune_flops_per_token`).

    Raises:
        DataError: a missing checkpoint; LoRA targets that match nothing; no ``finetune`` section.
    """
    if wc.finetune is None:
        raise DataError("the finetune workload needs a 'finetune' section (checkpoint_dir, fields, template)")
    lora = wc.finetune.lora
    return (
        finetune_flops_per_token(wc.finetune.checkpoint_dir, wc.model.context_length_tokens, lora),
        finetune_flops_convention(lora),
    )


def finetune_tokens_per_sequence(wc: WorkloadConfig) -> float:
    """Real tokens one training row holds on average (:func:`check_finetune_inputs`'s
    ``mean_real_tokens_per_row``): what a "sequence" of the batch size means when fine-tuning."""
    return float(check_finetune_inputs(wc)["mean_real_tokens_per_row"])
