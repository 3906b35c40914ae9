"""The pretraining workload: a ``transformers`` causal LM built from a config, on a text corpus."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from workloads.config import TrialConfig
from workloads.data import Corpus, load_corpus, validation_batches, window_batch
from workloads.flops import flops_per_token
from workloads.loop import Reporter, TrainingOutcome, run_loop
from workloads.model import ModelConfig, build_model, peak_flops_per_s, shape_of

__all__ = ["PretrainWorkload", "build_pretrain", "run_pretrain", "model_config_of"]


def model_config_of(cfg: TrialConfig, vocab_size: int) -> ModelConfig:
    return ModelConfig(
        family=cfg.family, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_ff=cfg.d_ff,
        context_length_tokens=cfg.context_length_tokens, vocab_size=vocab_size, tie_word_embeddings=cfg.tie_word_embeddings,
    )


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
        return window_batch(self.corpus.train_ids, seed=self.cfg.seed, step=step,
                            global_batch_size_sequences=global_batch_size_sequences,
                            context_length_tokens=self.cfg.context_length_tokens, start=start, count=count, stream=stream)

    def real_tokens(self, inputs: torch.Tensor, targets: torch.Tensor) -> int:
        return targets.numel()

    def val_batches(self):
        return validation_batches(self.corpus.val_ids, eval_tokens=self.cfg.eval_tokens,
                                  context_length_tokens=self.cfg.context_length_tokens, batch_size_sequences=64)


def build_pretrain(cfg: TrialConfig, device: torch.device) -> PretrainWorkload:
    """Load the corpus and build the model (seeded by ``cfg.seed``, identical on every rank).

    Raises:
        workloads.data.DataError: unusable corpus.
    """
    corpus = load_corpus(cfg.data_path, cfg.tokenizer, cfg.validation_fraction, cfg.context_length_tokens)
    torch.manual_seed(cfg.seed)
    model = build_model(model_config_of(cfg, corpus.vocab_size)).to(device)
    c_tok = flops_per_token(shape_of(model.config, cfg.context_length_tokens))
    return PretrainWorkload(model=model, corpus=corpus, cfg=cfg, flops_per_token=c_tok)


def run_pretrain(cfg: TrialConfig, *, device: torch.device, report: Reporter, resume_state=None,
                 save_dir: str | None = None) -> TrainingOutcome:
    """Run one pretraining trial; if ``save_dir`` is given, save a Hugging Face checkpoint there at the end."""
    work = build_pretrain(cfg, device)
    outcome = run_loop(cfg, work, device=device, report=report, resume_state=resume_state,
                       peak_flops_per_s=peak_flops_per_s(device), attempt=0 if resume_state is None else 1)
    if save_dir is not None and outcome.status == "completed":
        try:
            save_pretrained_byte(work.model, cfg, save_dir)
        except Exception:  # noqa: BLE001 - the trial's results are already reported: never lose them here
            logging.getLogger(__name__).exception("could not save the Hugging Face checkpoint to %s", save_dir)
    return outcome


def save_pretrained_byte(model: torch.nn.Module, cfg: TrialConfig, save_dir: str) -> None:
    """``save_pretrained`` plus the tokenizer (a local HF tokenizer directory is copied; ``byte`` is
    written as a byte-level ``tokenizers`` model so the checkpoint fine-tunes offline)."""
    model.save_pretrained(save_dir)
    from workloads.tokenizer import save_tokenizer

    save_tokenizer(cfg.tokenizer, save_dir)
