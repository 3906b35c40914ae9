"""The pretraining workload: a ``transformers`` causal LM built from a config, on a text corpus."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workloads.config import TrialConfig, WorkloadConfig
from workloads.data.corpus import (
    Corpus,
    load_corpus,
    load_shard_corpus,
    tokenizer_vocab_size,
    validation_batches,
    window_batch,
)
from workloads.errors import DataError
from workloads.model.hf import build_model, hf_config, model_flops_per_token, peak_flops_per_s
from workloads.train.determinism import make_deterministic
from workloads.train.hooks import MilestoneHook
from workloads.train.loop import ModelInput, Reporter, TrainingOutcome, run_loop
from workloads.train.parallel import full_model_state, is_sharded
from workloads.train.state_file import save_state

__all__ = [
    "PretrainWorkload",
    "build_pretrain",
    "check_pretrain_inputs",
    "pretrain_flops",
    "run_pretrain",
    "train_in_process",
]


@dataclass
class PretrainWorkload:
    """Model, corpus and FLOP count of one pretraining trial (implements ``loop.Workload``)."""

    model: torch.nn.Module
    corpus: Corpus
    cfg: TrialConfig
    flops_per_token: float

    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    def train_batch(self, *, step: int, global_batch_size_sequences: int, start: int, count: int, stream: int = 0):
        """Windows ``start .. start+count`` of step ``step``'s global batch (``workloads.data.corpus.window_batch``)."""
        return window_batch(
            self.corpus.train_ids,
            seed=self.cfg.seed,
            step=step,
            global_batch_size_sequences=global_batch_size_sequences,
            context_length_tokens=self.cfg.context_length_tokens,
            start=start,
            count=count,
            stream=stream,
        )

    def real_tokens(self, inputs: ModelInput, targets: torch.Tensor) -> int:
        """Every position of a window is a real token."""
        return targets.numel()

    def val_batches(self):
        """The fixed held-out windows (``workloads.data.corpus.validation_batches``), 64 per batch."""
        return validation_batches(
            self.corpus.val_ids,
            eval_tokens=self.cfg.eval.eval_tokens,
            context_length_tokens=self.cfg.context_length_tokens,
            batch_size_sequences=64,
        )


def _load(wc: WorkloadConfig) -> Corpus:
    """The corpus a trial trains on: memory-mapped ``data.shards`` when set, else the text file ``data.path``."""
    if wc.data.shards:
        return load_shard_corpus(wc.data.shards, wc.model.context_length_tokens)
    if not wc.data.path:
        raise DataError("data: give data.path (a text file) or data.shards (prepared token shards)")
    return load_corpus(wc.data.path, wc.data.tokenizer, wc.data.validation_fraction, wc.model.context_length_tokens)


def _check_shards(wc: WorkloadConfig) -> dict[str, Any]:
    """The facts of ``check_pretrain_inputs`` for ``data.shards``: the index checked against the
    spec's tokenizer (hash) and the model's embedding (vocabulary), nothing memory-mapped.

    Raises:
        workloads.errors.DataError: prefixed ``data.shards:`` or ``data.tokenizer:``.
    """
    from workloads.data.prepare import tokenizer_identity
    from workloads.data.shards import check_index, read_index

    assert wc.data.shards is not None  # called for a spec with data.shards only
    try:
        index = read_index(wc.data.shards, fetch=False)
    except DataError as exc:
        raise DataError(f"data.shards: {exc}") from None
    try:
        identity = tokenizer_identity(wc.data.tokenizer)
    except DataError as exc:
        raise DataError(f"data.tokenizer: {exc}") from None
    model_vocab = getattr(hf_config(wc.model, identity["vocab_size"]), "vocab_size", None)
    check_index(
        index,
        tokenizer_sha256=identity["sha256"],
        tokenizer_name=wc.data.tokenizer,
        model_vocab_size=model_vocab,
        min_tokens=wc.model.context_length_tokens + 1,
    )
    return {
        "train_tokens": index.tokens("train"),
        "validation_tokens": index.tokens("validation"),
        "vocab_size": index.vocab_size,
        "mean_real_tokens_per_row": float(wc.model.context_length_tokens),
    }


def build_pretrain(cfg: TrialConfig, device: torch.device) -> PretrainWorkload:
    """Load the corpus and build the model (seeded by ``cfg.seed``, identical on every rank).

    Raises:
        workloads.errors.DataError: unusable corpus.
    """
    corpus = _load(cfg.workload)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.workload.model, corpus.vocab_size).to(device)
    c_tok, _ = model_flops_per_token(cfg.workload.model, model.config)
    return PretrainWorkload(model=model, corpus=corpus, cfg=cfg, flops_per_token=c_tok)


def run_pretrain(
    cfg: TrialConfig,
    *,
    device: torch.device,
    report: Reporter,
    resume_state=None,
    save_dir: str | None = None,
    on_milestone: Sequence[MilestoneHook] = (),
) -> TrainingOutcome:
    """Run one pretraining trial; if ``save_dir`` is given, save a Hugging Face checkpoint there at the end.

    Under fsdp every rank gathers the full weights for it (rank 0, the one with ``save_dir``, saves);
    under local_sgd and diloco the saved weights are the mean over the replicas (an all-reduce).
    ``on_milestone``: :func:`workloads.train.loop.run_loop`'s hooks (tests only).
    """
    work = build_pretrain(cfg, device)
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
    full = None
    if outcome.status == "completed" and is_sharded(work.model):  # a collective: on every rank
        full = full_model_state(work.model)
    elif outcome.status == "completed" and cfg.training.sync.local:  # the replicas' mean weights (a collective)
        from workloads.train.sync import replica_mean_state_dict

        full = replica_mean_state_dict(work.model)
    if save_dir is not None and outcome.status == "completed":
        try:
            save_pretrained_byte(work.model, cfg, save_dir, state_dict=full)
        except Exception:
            logging.getLogger(__name__).exception("could not save the Hugging Face checkpoint to %s", save_dir)
            # a half-written checkpoint (a full disk) must not pass for one: the driver copies it as the best
            shutil.rmtree(save_dir, ignore_errors=True)
    return outcome


def save_pretrained_byte(
    model: torch.nn.Module, cfg: TrialConfig, save_dir: str, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """``save_pretrained`` (of ``state_dict`` when given: a sharded model's full weights) plus the
    tokenizer (a local HF tokenizer directory is copied; ``byte`` is written as a byte-level
    ``tokenizers`` model so the checkpoint fine-tunes offline)."""
    from transformers import PreTrainedModel

    assert isinstance(model, PreTrainedModel)  # build_model's (FSDP2 keeps the class, as a subclass)
    if state_dict is None:
        model.save_pretrained(save_dir)
    else:
        model.save_pretrained(save_dir, state_dict=state_dict)
    from workloads.data.tokenizer import save_tokenizer

    save_tokenizer(cfg.workload.data.tokenizer, save_dir)


def pretrain_flops(wc: WorkloadConfig) -> tuple[float, str]:
    """``(training FLOPs per token, convention)`` of ``wc``'s model with its tokenizer's vocabulary
    (``workloads.model.hf.model_flops_per_token``: ``model.flops_per_token`` when given, else
    ``6 N_matmul + 12 n_layer n_ctx d_attn + 6 d V``).

    Raises:
        workloads.errors.DataError: a tokenizer directory that does not exist; ``model.hf_config...``.
    """
    return model_flops_per_token(wc.model, hf_config(wc.model, tokenizer_vocab_size(wc.data.tokenizer)))


def check_pretrain_inputs(wc: WorkloadConfig) -> dict[str, Any]:
    """Load the corpus as a trial would, before launch (the sweep's preflight).

    Returns:
        ``train_tokens`` and ``validation_tokens`` (of each split), ``vocab_size`` and
        ``mean_real_tokens_per_row`` (``context_length_tokens``: windows are full).

    Raises:
        workloads.errors.DataError: ``data.path: ...``, a missing, non-UTF-8 or too short corpus;
            ``data.shards: ...`` / ``data.tokenizer: ...``, a bad shard index, shards made by another
            tokenizer, a vocabulary larger than the model's, a split shorter than one window.
    """
    if wc.data.shards:
        return _check_shards(wc)
    if not wc.data.path:
        raise DataError("data: give data.path (a text file) or data.shards (prepared token shards)")
    try:  # counted, not kept: the driver prepares the file into shards once (sweeps/run/dataprep.py)
        corpus = load_corpus(
            wc.data.path, wc.data.tokenizer, wc.data.validation_fraction, wc.model.context_length_tokens, keep=False
        )
    except DataError as exc:
        raise DataError(f"data.path: {exc}") from None
    return {
        "train_tokens": len(corpus.train_ids),
        "validation_tokens": len(corpus.val_ids),
        "vocab_size": corpus.vocab_size,
        "mean_real_tokens_per_row": float(wc.model.context_length_tokens),
    }


def train_in_process(
    config: dict[str, Any], state_path: str | None, save_states: dict[int, str] | None
) -> dict[str, Any]:
    """Run a pretraining loop on CPU in this process (a branched-training Ray task, ``sweeps/run/branching.py``).

    Args:
        config: :meth:`TrialConfig.to_dict`.
        state_path: a state saved by an earlier call (``torch.save``) to continue from, with its
            milestones restarted (the branch has its own); None starts from the initialisation.
        save_states: tokens seen -> file: save the state reported at those milestones there.

    Returns:
        ``{"status", "reports" (every report's metrics), "flops_per_token", "wall_s"}``.

    Raises:
        workloads.errors.DataError: unusable corpus.
        workloads.errors.OutOfSpace: a state in ``save_states`` could not be written, its disk full.
    """
    cfg = TrialConfig.from_dict(config)
    make_deterministic(torch.device("cpu"), max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    work = build_pretrain(cfg, torch.device("cpu"))
    resume = torch.load(state_path, weights_only=False) if state_path else None
    if resume is not None:
        resume["loop"]["milestone_idx"] = 0  # the branch has its own milestones
    reports: list[dict[str, Any]] = []

    def report(metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        reports.append(metrics)
        if save_states is not None and state is not None and metrics["tokens_seen"] in save_states:
            save_state(state, save_states[metrics["tokens_seen"]])

    t0 = time.perf_counter()
    outcome = run_loop(cfg, work, device=torch.device("cpu"), report=report, resume_state=resume, attempt=1)
    return {
        "status": outcome.status,
        "reports": reports,
        "flops_per_token": work.flops_per_token,
        "wall_s": time.perf_counter() - t0,
    }
