"""One optimizer step: accumulation over micro-batches, one all-reduce, the noise-scale norms, the update.

One optimizer step = ``grad_accum_steps`` micro-batches on each of ``workers`` data-parallel ranks
(:func:`step_gradient`). The loss is token-weighted over the whole global batch: the step's
gradient is that of (sum of per-token losses) / (loss tokens in the global batch), whatever the
micro-batch size, accumulation steps or worker count, so fine-tuning rows of unequal response
lengths weigh by their tokens, not by the micro-batch they land in. The loss-token count is
all-reduced once before the backward passes, micro-batch gradients are summed, and one all-reduce
(sum) of a flat buffer (gloo on CPU, NCCL on GPU) gives every rank the step's gradient; it also
gives the gradient-noise-scale estimator its small- and big-batch norms at no extra
forward/backward cost. Under FSDP (:func:`sharded_step_gradient`) each micro-batch's gradient is
reduce-scattered as soon as its backward ends. :class:`Stepper` draws the batches, sets the step's LR and beta2 from the
:class:`workloads.train.schedule.Schedule`, clips and applies the update unless the step diverged. Under
``training.sync.mode`` local_sgd or diloco (:mod:`workloads.train.sync`) each worker steps on its own
slice's gradient (:func:`step_gradient` with ``reduce=False``) and the replicas synchronise every
``H`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import torch
import torch.nn.functional as F

from workloads.train.noise_scale import step_estimates
from workloads.train.schedule import BatchPhase, Schedule
from workloads.train.sync import ReplicaSync, dist_info, payload_bytes, timed_all_reduce

__all__ = [
    "IGNORE_INDEX",
    "ModelInput",
    "StepGradient",
    "StepOutcome",
    "Stepper",
    "TrainBatches",
    "dist_info",
    "forward_logits",
    "sharded_step_gradient",
    "step_gradient",
]

IGNORE_INDEX = -100

#: A micro-batch's model inputs: input ids ``[n, T]``, or a dict of model keyword arguments.
ModelInput = torch.Tensor | dict[str, torch.Tensor]

#: A list of tensors as the ``torch._foreach_*`` kernels take it.
TensorList = list[torch.Tensor] | tuple[torch.Tensor, ...]


def forward_logits(model: torch.nn.Module, inputs: ModelInput, device: torch.device) -> torch.Tensor:
    """Logits for ``inputs``: a tensor of input ids, or a dict of model keyword arguments
    (``input_ids`` plus e.g. a 4-D ``attention_mask`` and ``position_ids`` for packed sequences)."""
    if isinstance(inputs, dict):
        return model(**{k: v.to(device) for k, v in inputs.items()}).logits
    return model(input_ids=inputs.to(device)).logits


def _token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of the per-token cross-entropies over the positions whose target is not -100."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


@dataclass(frozen=True)
class StepGradient:
    """One optimizer step's gradient over the global batch (every micro-batch of every worker).

    Attributes:
        grads: per trainable parameter, the gradient of ``sum of token losses / loss_tokens`` over
            the global batch (the same on every rank).
        loss: that token-weighted mean loss (nats per loss token); NaN when no token carries loss.
        loss_tokens: loss tokens (targets other than -100) in the global batch.
        real_tokens: real input tokens in the global batch (``Workload.real_tokens``: tokens seen).
        small_sq_norm_mean: mean over the micro-batches with loss tokens of the squared norm of each
            one's *mean* gradient (its own token mean), or None when not asked for.
        big_sq_norm: squared norm of ``grads``, or None when not asked for.
        micro_batches: micro-batches with loss tokens over all workers (``K`` of the estimator).
        comm_bytes: payload bytes this rank handed to the step's collectives (``workloads.train.sync``).
        comm_time_s: wall seconds inside those collectives.
    """

    grads: list[torch.Tensor]
    loss: float
    loss_tokens: int
    real_tokens: int
    small_sq_norm_mean: float | None
    big_sq_norm: float | None
    micro_batches: int
    comm_bytes: int = 0
    comm_time_s: float = 0.0


def _loss_tokens(
    micro_batches: list[tuple[Any, torch.Tensor]], real_tokens: Callable[[Any, torch.Tensor], int]
) -> tuple[list[int], int]:
    """Per micro-batch, its loss tokens (targets other than -100); and the real tokens of all of them."""
    return (
        [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches],
        sum(int(real_tokens(x, y)) for x, y in micro_batches),
    )


def _accumulate(
    model: torch.nn.Module,
    micro_batches: list[tuple[Any, torch.Tensor]],
    loss_tokens: list[int],
    *,
    n_global: int,
    grads_of: Callable[[torch.Tensor], TensorList],
    first: Callable[[TensorList], list[torch.Tensor]],
    local: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    noise_scale: bool,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The micro-batch loop both data-parallel layouts share: ``(summed gradients, sums)``.

    Micro-batch ``j`` contributes the gradient of ``CE_sum_j / N`` (``N = n_global``, the step's
    loss tokens, known before any backward pass): ``grads_of(CE_sum_j / N)`` takes it (ddp:
    ``autograd.grad``; fsdp: a backward that FSDP reduce-scatters), ``first`` starts the sum from the
    first one's, the others are added in place. ``sums`` (float32 ``[small-batch squares, token-loss
    sum]``, this rank's, not reduced): with ``noise_scale``, each micro-batch's squared
    *mean*-gradient norm, ``|grad_j|^2 (N / n_j)^2`` (``n_j = loss_tokens[j]``; one without loss
    tokens left out), read from ``local(g)`` of each gradient (fsdp: this rank's shard).

    Raises:
        ValueError: no micro-batch.
    """
    scale = 1.0 / max(n_global, 1)
    acc: list[torch.Tensor] | None = None
    sums = torch.zeros(2, dtype=torch.float32, device=device)
    for (x, y), n_j in zip(micro_batches, loss_tokens):
        y = y.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = forward_logits(model, x, device)
        token_sum = _token_loss_sum(logits, y)
        grads = grads_of(token_sum * scale)
        if noise_scale and n_j:
            parts = [local(g) for g in grads]
            norms = torch._foreach_norm(parts)  # pyright: ignore[reportPrivateImportUsage]  # torch's private foreach API
            sums[0] += torch.stack(norms).float().pow(2).sum() * (n_global / n_j) ** 2
        if acc is None:
            acc = first(grads)
        else:
            torch._foreach_add_(acc, grads)  # pyright: ignore[reportPrivateImportUsage]  # torch's private foreach API
        sums[1] += token_sum.detach().float()
    if acc is None:
        raise ValueError("a step needs at least one micro-batch")
    return acc, sums


def _step_result(
    acc: list[torch.Tensor],
    sums: torch.Tensor,
    *,
    n_global: int,
    real_global: int,
    k_global: int,
    sq_norm: Callable[[list[torch.Tensor]], torch.Tensor] | None,
    comm_bytes: int,
    comm_time_s: float,
) -> StepGradient:
    """The :class:`StepGradient` of reduced ``sums`` (:func:`_accumulate`); ``sq_norm`` (None: the
    estimator is off) gives the squared norm of the summed gradient."""
    small_mean = big_sq = None
    if sq_norm is not None:
        small_mean = float(sums[0]) / k_global if k_global else float("nan")
        big_sq = float(sq_norm(acc))
    return StepGradient(
        grads=acc,
        loss=float(sums[1]) / n_global if n_global else float("nan"),
        loss_tokens=n_global,
        real_tokens=real_global,
        small_sq_norm_mean=small_mean,
        big_sq_norm=big_sq,
        micro_batches=k_global,
        comm_bytes=comm_bytes,
        comm_time_s=comm_time_s,
    )


def _sq_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(torch._foreach_norm(tensors)).float().pow(2).sum()  # pyright: ignore[reportPrivateImportUsage]  # private foreach API


def step_gradient(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    micro_batches: list[tuple[Any, torch.Tensor]],
    *,
    device: torch.device,
    real_tokens: Callable[[Any, torch.Tensor], int],
    autocast_dtype: torch.dtype | None = None,
    noise_scale: bool = False,
    reduce: bool = True,
) -> StepGradient:
    """Forward, backward and all-reduce of one optimizer step; this rank holds ``micro_batches``.

    Micro-batch ``j`` with ``n_j`` loss tokens contributes the gradient of ``CE_sum_j / N``, where
    ``N`` is the loss tokens of the whole step (all micro-batches, all-reduced over workers once,
    before any backward pass); the contributions are summed, locally and by one all-reduce. So the
    result is the gradient of the global token-mean loss for any split of the batch. For the
    noise-scale estimator (McCandlish et al. 2018, Eq. A.2), which needs each micro-batch's mean
    gradient, ``|grad_j|^2`` is rescaled by ``(N / n_j)^2``; micro-batches without loss tokens are
    left out of it. With equal micro-batches in which every token counts (pretraining) this is the
    old mean of micro-batch means.

    With ``reduce=False`` (a local_sgd or diloco replica) nothing is communicated: the result is
    this rank's own gradient of (its token-loss sum) / (its loss tokens), and the counts are its own.

    Raises:
        ValueError: no micro-batch.
    """
    _, world = dist_info()
    if not reduce:
        world = 1
    n_loss, n_real = _loss_tokens(micro_batches, real_tokens)
    counts = torch.tensor([sum(n_loss), n_real, sum(1 for n in n_loss if n)], dtype=torch.float64, device=device)
    comm_bytes, comm_s = 0, 0.0
    if world > 1:
        comm_s += timed_all_reduce(counts)
        comm_bytes += payload_bytes(counts)
    n_global, real_global, k_global = (int(v) for v in counts.tolist())
    acc, sums = _accumulate(
        model,
        micro_batches,
        n_loss,
        n_global=n_global,
        grads_of=lambda loss: torch.autograd.grad(loss, params),
        first=lambda grads: [g.float() for g in grads],
        local=lambda g: g,
        device=device,
        autocast_dtype=autocast_dtype,
        noise_scale=noise_scale,
    )
    if world > 1:  # one all-reduce: the gradients, then the sums
        flat = torch.cat([g.reshape(-1) for g in acc] + [sums])
        comm_s += timed_all_reduce(flat)
        comm_bytes += payload_bytes(flat)
        offset = 0
        for g in acc:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        sums = flat[-2:]
    return _step_result(
        acc,
        sums,
        n_global=n_global,
        real_global=real_global,
        k_global=k_global,
        sq_norm=_sq_norm if noise_scale else None,
        comm_bytes=comm_bytes,
        comm_time_s=comm_s,
    )


def sharded_step_gradient(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    micro_batches: list[tuple[Any, torch.Tensor]],
    *,
    device: torch.device,
    real_tokens: Callable[[Any, torch.Tensor], int],
    autocast_dtype: torch.dtype | None = None,
    noise_scale: bool = False,
) -> StepGradient:
    """:func:`step_gradient` for a model sharded by FSDP2 (``workloads.train.parallel``): the same gradient.

    Every rank holds as many micro-batches (the batch plan is global). Micro-batch ``j`` of every
    rank contributes the gradient of ``CE_sum_j / N`` (``N`` all-reduced first, as under ddp), and
    FSDP reduce-scatters it (a sum: divide factor 1) at the end of its backward: accumulation
    reduce-scatters each micro-batch rather than ``set_requires_gradient_sync(False)`` until the
    last, so no rank ever holds an unsharded gradient (the memory FSDP is for) and each group
    ``j`` (micro-batch ``j`` of every rank) has its own sharded gradient, summed here into ``grads``.

    Noise scale: the small batch is group ``j`` (``micro x workers`` sequences), whose squared
    mean-gradient norm is the all-reduced sum of its shards' squares rescaled by
    ``(N / n_j)^2`` (``n_j`` the loss tokens of group ``j``); ``micro_batches`` counts the groups
    with loss tokens. ``grads`` are DTensors (this rank's shards).

    Raises:
        ValueError: no micro-batch.
    """
    n_loss, n_real = _loss_tokens(micro_batches, real_tokens)
    counts = torch.tensor([sum(n_loss), n_real, *n_loss], dtype=torch.float64, device=device)
    comm_s = timed_all_reduce(counts)
    n_global, real_global = int(counts[0]), int(counts[1])
    n_group = [int(v) for v in counts[2:].tolist()]
    for p in params:
        p.grad = None

    def reduce_scattered(loss: torch.Tensor) -> list[torch.Tensor]:
        loss.backward()  # FSDP reduce-scatters this micro-batch's gradient as its backward ends
        # every trainable parameter takes part in the forward, so FSDP has set each one's sharded gradient
        grads = cast(list[torch.Tensor], [p.grad for p in params])
        for p in params:
            p.grad = None
        return grads

    acc, sums = _accumulate(
        model,
        micro_batches,
        n_group,
        n_global=n_global,
        grads_of=reduce_scattered,
        first=list,
        local=lambda g: g.to_local(),  # pyright: ignore[reportAttributeAccessIssue]  # DTensors under FSDP2
        device=device,
        autocast_dtype=autocast_dtype,
        noise_scale=noise_scale,
    )
    comm_s += timed_all_reduce(sums)
    sq_norm = None
    if noise_scale:
        from workloads.train.parallel import global_sq_norm as sq_norm
    return _step_result(
        acc,
        sums,
        n_global=n_global,
        real_global=real_global,
        k_global=sum(1 for n in n_group if n),
        sq_norm=sq_norm,
        comm_bytes=payload_bytes(counts) + payload_bytes(sums),
        comm_time_s=comm_s,
    )


class TrainBatches(Protocol):
    """What the stepper needs of a workload (``workloads.train.loop.Workload``)."""

    def train_batch(
        self, *, step: int, global_batch_size_sequences: int, start: int, count: int, stream: int = 0
    ) -> tuple[Any, torch.Tensor]: ...

    def real_tokens(self, inputs: Any, targets: torch.Tensor) -> int: ...


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did.

    Attributes:
        loss: the global batch's token-weighted mean loss (nats per loss token; NaN without loss tokens).
        real_tokens: real input tokens of the global batch (tokens seen).
        noise_estimates: the step's ``(|G|^2, tr(Sigma))`` estimates, or None (estimator off, or
            fewer than two micro-batches with loss tokens).
        lr, beta2: the step's learning rate and Adam beta2 (NaN for an optimizer without one).
        grad_norm: the global gradient norm before clipping (local_sgd, diloco: this replica's own
            gradient's, NaN on every rank when any replica's is not finite).
        comm_bytes, comm_time_s: payload bytes this rank handed to the step's collectives and the
            seconds inside them (``workloads.train.sync``), FSDP's own all-gathers and reduce-scatters included.
        synced: the step synchronised the workers (every step under ddp and fsdp with 2+ workers).
    """

    loss: float
    real_tokens: int
    noise_estimates: tuple[float, float] | None
    lr: float
    beta2: float
    grad_norm: float
    comm_bytes: int = 0
    comm_time_s: float = 0.0
    synced: bool = False

    def diverged(self, diverge_at: float) -> bool:
        """Whether the loss is non-finite or above ``diverge_at`` nats, or the gradient norm non-finite."""
        return not (math.isfinite(self.loss) and self.loss <= diverge_at) or not math.isfinite(self.grad_norm)


class Stepper:
    """Runs optimizer steps of one trial on this rank.

    Args:
        model: the trained model; ``params`` its trainable parameters.
        opt: the optimizer over ``params`` (:func:`workloads.train.optim.build_optimizer`).
        work: where the micro-batches come from.
        schedule: LR and beta2 of each step.
        device: where the model lives.
        beta1: Adam beta1 (kept while beta2 changes).
        grad_clip_norm: global-norm clip, or None.
        diverge_at: a step whose loss exceeds this (nats) is not applied.
        noise_scale: compute the noise-scale norms.
        autocast_dtype: the forward's autocast dtype, None for float32; default ``"auto"``: bf16 on
            CUDA, float32 elsewhere (``workloads.train.parallel.autocast_dtype``).
        sharded: the model is sharded by FSDP2 (:func:`sharded_step_gradient`; ``params`` DTensors).
        sync: local_sgd or diloco replicas (:class:`workloads.train.sync.ReplicaSync`): no gradient
            all-reduce, a synchronisation after every ``H``-th step of training (stream 0; a WSD
            decay branch never synchronises); the noise-scale estimator is then off (no global
            gradient). None: ddp or fsdp.
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        params: list[torch.Tensor],
        opt: torch.optim.Optimizer,
        work: TrainBatches,
        schedule: Schedule,
        device: torch.device,
        beta1: float,
        grad_clip_norm: float | None,
        diverge_at: float,
        noise_scale: bool,
        autocast_dtype: torch.dtype | None | Literal["auto"] = "auto",
        sharded: bool = False,
        sync: ReplicaSync | None = None,
    ):
        self.model, self.params, self.opt, self.work, self.schedule = model, params, opt, work, schedule
        self.device, self.beta1, self.grad_clip_norm = device, beta1, grad_clip_norm
        self.diverge_at, self.noise_scale, self.sharded = diverge_at, noise_scale and sync is None, sharded
        self.sync = sync
        if autocast_dtype == "auto":
            autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
        self.autocast_dtype = autocast_dtype
        self.rank, self.world = dist_info()
        self._gradient = sharded_step_gradient if sharded else step_gradient
        self._fsdp_bytes = 0  # FSDP's own collectives per micro-batch (counted, not timed)
        if sharded:
            from workloads.train.parallel import fsdp_bytes_per_micro_batch

            self._fsdp_bytes = fsdp_bytes_per_micro_batch(model)

    def step(
        self, step: int, phase: BatchPhase, tokens_before: int, *, stream: int = 0, lr_scale: float = 1.0
    ) -> StepOutcome:
        """Forward/backward/all-reduce/update for optimizer step ``step`` of ``phase``'s batch.

        The LR is set once the step's tokens are known: its warmup factor counts them (tokens seen
        after the step). The update is skipped when the step diverged (:meth:`StepOutcome.diverged`).
        """
        b, plan = phase.batch_size_sequences, phase.plan
        k, micro = plan.grad_accum_steps, plan.micro_batch_size_sequences
        per_worker = b // self.world
        batches = [
            self.work.train_batch(
                step=step,
                global_batch_size_sequences=b,
                start=self.rank * per_worker + j * micro,
                count=micro,
                stream=stream,
            )
            for j in range(k)
        ]
        if self.sync is not None:
            return self._local_step(self.sync, step, b, batches, tokens_before, stream=stream, lr_scale=lr_scale)
        sg = self._gradient(
            self.model,
            self.params,
            batches,
            device=self.device,
            real_tokens=self.work.real_tokens,
            autocast_dtype=self.autocast_dtype,
            noise_scale=self.noise_scale,
        )
        est = None
        small_sq, big_sq = sg.small_sq_norm_mean, sg.big_sq_norm  # both set when noise_scale
        if self.noise_scale and sg.micro_batches >= 2 and small_sq is not None and big_sq is not None:
            b_small = micro * self.world if self.sharded else micro  # fsdp: one micro-batch of every worker
            est = step_estimates(small_sq, big_sq, b_small, sg.micro_batches)
        lr, beta2 = self._set_hparams(*self.schedule.hparams(b, tokens_before + sg.real_tokens, lr_scale))
        for p, g in zip(self.params, sg.grads):
            p.grad = g
        if self.sharded:
            grad_norm = self._sharded_grad_norm(sg.grads)
        elif self.grad_clip_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip_norm))
        else:
            grad_norm = float(torch.stack(torch._foreach_norm(sg.grads)).pow(2).sum().sqrt())  # pyright: ignore[reportPrivateImportUsage]  # private foreach API
        out = StepOutcome(
            loss=sg.loss,
            real_tokens=sg.real_tokens,
            noise_estimates=est,
            lr=lr,
            beta2=beta2,
            grad_norm=grad_norm,
            comm_bytes=sg.comm_bytes + self._fsdp_bytes * len(batches),
            comm_time_s=sg.comm_time_s,
            synced=self.world > 1,
        )
        if not out.diverged(self.diverge_at):
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return out

    def _set_hparams(self, lr: float, beta2: float) -> tuple[float, float]:
        """Set the step's LR (and beta2 where the optimizer has one) on every group; ``(lr, beta2)``
        as reported (beta2 NaN for an optimizer without one)."""
        for g in self.opt.param_groups:
            g["lr"] = lr
            if "betas" in g:  # the Adam family; SGD and Adafactor have no constant beta2
                g["betas"] = (self.beta1, beta2)
            else:
                beta2 = float("nan")  # not reported (the writer skips a NaN metric)
        return lr, beta2

    def _local_step(
        self,
        sync: ReplicaSync,
        step: int,
        b: int,
        batches: list[tuple[Any, torch.Tensor]],
        tokens_before: int,
        *,
        stream: int,
        lr_scale: float,
    ) -> StepOutcome:
        """A local_sgd / diloco replica's step: its own gradient, clipped, its own update, a sync when due.

        One small all-reduce per step (float64 ``[loss sum, loss tokens, real tokens, replicas with a
        non-finite gradient norm]``) gives every rank the global loss and tokens seen, so the loop's
        LR, milestones and divergence decision are the same on every rank. ``sync`` is :attr:`sync`.
        """
        sg = step_gradient(
            self.model,
            self.params,
            batches,
            device=self.device,
            real_tokens=self.work.real_tokens,
            autocast_dtype=self.autocast_dtype,
            noise_scale=False,
            reduce=False,
        )
        for p, g in zip(self.params, sg.grads):
            p.grad = g
        if self.grad_clip_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip_norm))
        else:
            grad_norm = float(torch.stack(torch._foreach_norm(sg.grads)).pow(2).sum().sqrt())  # pyright: ignore[reportPrivateImportUsage]  # private foreach API
        loss_sum = sg.loss * sg.loss_tokens if sg.loss_tokens else 0.0
        counts = torch.tensor(
            [loss_sum, sg.loss_tokens, sg.real_tokens, 0.0 if math.isfinite(grad_norm) else 1.0],
            dtype=torch.float64,
            device=self.device,
        )
        comm_s = timed_all_reduce(counts)
        comm_bytes = payload_bytes(counts)
        total, n_loss, real, bad = counts.tolist()
        lr, beta2 = self._set_hparams(*self.schedule.hparams(b, tokens_before + int(real), lr_scale))
        out = StepOutcome(
            loss=total / n_loss if n_loss else float("nan"),
            real_tokens=int(real),
            noise_estimates=None,
            lr=lr,
            beta2=beta2,
            grad_norm=grad_norm if not bad else float("nan"),
        )
        diverged = out.diverged(self.diverge_at)
        if not diverged:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        synced = stream == 0 and not diverged and sync.due(step)
        if synced:
            nbytes, seconds = sync.synchronize()
            comm_bytes, comm_s = comm_bytes + nbytes, comm_s + seconds
        return StepOutcome(
            loss=out.loss,
            real_tokens=out.real_tokens,
            noise_estimates=None,
            lr=lr,
            beta2=beta2,
            grad_norm=out.grad_norm,
            comm_bytes=comm_bytes,
            comm_time_s=comm_s,
            synced=synced,
        )

    def _sharded_grad_norm(self, grads: list[torch.Tensor]) -> float:
        """The global norm of the sharded gradient (an all-reduce), clipped in place when asked."""
        if self.grad_clip_norm is not None:  # DTensor-aware: returns the global norm as a DTensor
            return float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip_norm).full_tensor())  # pyright: ignore[reportAttributeAccessIssue]  # a DTensor
        from workloads.train.parallel import global_sq_norm

        return float(global_sq_norm(grads).sqrt())
