"""Evaluation at a milestone: the held-out loss of the weights the schedule says to measure.

``constant_ema`` evaluates the weight EMA (:class:`workloads.train.ema.WeightEMA`), and the raw weights
too at the last milestone (or every one, ``eval.raw_every_milestone``); ``wsd`` evaluates the raw
weights, then runs a short linear-decay branch (stream 1 of the data, its own batches) and
evaluates its end, then restores the model and optimizer to the stable branch. Every forward and
decay step is measurement compute, returned so the loop logs it as ``flops_measurement``.

Under ``training.sync.mode`` local_sgd or diloco every loss is that of the mean over the replicas of
the weights evaluated (their EMA weights, raw weights, or decayed-branch ends: each replica decays
its own, without synchronising), averaged into a scratch copy (``workloads.train.sync.ReplicaSync.averaged``,
an evaluation collective, not counted as communication); the training state is untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

from workloads.config import TrialConfig
from workloads.train.ema import WeightEMA
from workloads.train.parallel import is_sharded
from workloads.train.schedule import BatchPhase, wsd_branch_steps, wsd_lr_scale
from workloads.train.step import IGNORE_INDEX, ModelInput, StepOutcome, Stepper, forward_logits
from workloads.train.sync import ReplicaSync

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["EvalResult", "MilestoneEvaluator", "evaluate"]


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    batches: Sequence[tuple[ModelInput, torch.Tensor]],
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> float:
    """Token-weighted mean cross-entropy (nats per token) of ``model`` on ``batches`` (a sharded model is
    resharded after them)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        y = y.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = forward_logits(model, x, device)
        n = int((y != IGNORE_INDEX).sum())
        if n:
            total += float(
                F.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]),
                    y.reshape(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
            )
            count += n
    model.train(was_training)
    # the FSDP root keeps its weights gathered after a forward: free them, or the next forward after an
    # in-place change (EMA weights, a restored WSD branch) would use stale ones
    if is_sharded(model):
        cast("FSDPModule", model).reshard()
    return total / max(count, 1)


@dataclass(frozen=True)
class EvalResult:
    """One milestone's evaluation.

    Attributes:
        val_loss: the loss the analysis uses (EMA weights, the decayed branch, or the raw weights).
        val_loss_raw: the raw weights' loss, or None when not measured.
        flops: measurement FLOPs, one entry per forward pass or branch, in the order spent (the
            loop adds them one by one, as they were always added).
        last_step: the decay branch's last step (``wsd``), else None.
    """

    val_loss: float
    val_loss_raw: float | None
    flops: tuple[float, ...]
    last_step: StepOutcome | None = None


class MilestoneEvaluator:
    """Evaluates one trial at its milestones.

    Args:
        cfg: the trial (``schedule.kind``, ``eval.raw_every_milestone``, ``budget_tokens``).
        model: the trained model; ``ema`` its weight EMA (``constant_ema``) or None.
        val_set: the fixed held-out batches.
        flops_per_token: training FLOPs per token (a forward is a third of them).
        stepper: runs the WSD decay branch.
        sync: local_sgd / diloco replicas, whose mean weights are evaluated; None under ddp and fsdp.
    """

    def __init__(
        self,
        cfg: TrialConfig,
        *,
        model: torch.nn.Module,
        ema: WeightEMA | None,
        val_set: Sequence[tuple[ModelInput, torch.Tensor]],
        flops_per_token: float,
        stepper: Stepper,
        sync: ReplicaSync | None = None,
    ):
        self.cfg, self.model, self.ema, self.val_set = cfg, model, ema, val_set
        self.flops_per_token, self.stepper, self.sync = flops_per_token, stepper, sync

    def _loss(self, model: torch.nn.Module) -> float:
        if self.sync is not None:
            model = self.sync.averaged(model)
        return evaluate(model, self.val_set, self.stepper.device, self.stepper.autocast_dtype)

    def __call__(self, *, step: int, tokens_seen: int, phase: BatchPhase) -> EvalResult:
        """Evaluate after ``step`` optimizer steps and ``tokens_seen`` tokens, in ``phase``."""
        val_tokens = sum(int((y != IGNORE_INDEX).sum()) for _, y in self.val_set)
        fwd_flops = self.flops_per_token / 3 * val_tokens
        if self.ema is not None:
            val = self._loss(self.ema.load_into_eval_model())
            if self.cfg.eval.raw_every_milestone or tokens_seen >= self.cfg.budget_tokens:
                return EvalResult(val, self._loss(self.model), (fwd_flops, fwd_flops))
            return EvalResult(val, None, (fwd_flops,))
        if self.cfg.schedule.kind == "wsd":
            return self._wsd(step, tokens_seen, phase, fwd_flops)
        return EvalResult(self._loss(self.model), None, (fwd_flops,))

    def _wsd(self, step: int, tokens_seen: int, phase: BatchPhase, fwd_flops: float) -> EvalResult:
        opt = self.stepper.opt
        saved_model = copy.deepcopy(self.model.state_dict())
        saved_opt = copy.deepcopy(opt.state_dict())
        raw = self._loss(self.model)
        n_steps = wsd_branch_steps(
            self.cfg.schedule.decay_fraction, tokens_seen, phase.batch_size_sequences, self.cfg.context_length_tokens
        )
        branch_tokens, last = 0, None
        for i in range(n_steps):
            last = self.stepper.step(step + i, phase, tokens_seen, stream=1, lr_scale=wsd_lr_scale(i, n_steps))
            branch_tokens += last.real_tokens
        val = self._loss(self.model)
        self.model.load_state_dict(saved_model)
        opt.load_state_dict(saved_opt)
        return EvalResult(val, raw, (2 * fwd_flops + self.flops_per_token * branch_tokens,), last)
