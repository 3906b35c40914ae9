"""The training loop shared by the workloads: plain PyTorch, no Ray, no tracking.

One optimizer step = ``grad_accum_steps`` micro-batches on each of ``workers`` data-parallel
ranks (:func:`step_gradient`). The loss is token-weighted over the whole global batch: the step's
gradient is that of (sum of per-token losses) / (loss tokens in the global batch), whatever the
micro-batch size, accumulation steps or worker count, so fine-tuning rows of unequal response
lengths weigh by their tokens, not by the micro-batch they land in. The loss-token count is
all-reduced once before the backward passes, micro-batch gradients are summed, and one all-reduce
(sum) of a flat buffer (gloo on CPU, NCCL on GPU) gives every rank the step's gradient; it also
gives the gradient-noise-scale estimator its small- and big-batch norms at no extra
forward/backward cost. The loop reports at token milestones only, through a ``report`` callable
that the Ray adapter (or a test, or the benchmark) provides.

Schedule (methodology section 11.2): linear warmup in tokens, then a constant LR. The warmup is
``warmup_tokens`` (the same for every batch size) but at least ``warmup_min_steps`` optimizer steps
of the batch (Goyal et al. 2017, gradual warmup), and each step's factor is taken from the tokens
seen after it (:func:`workloads.scaling.warmup_factor`). ``constant_ema`` evaluates a
bias-corrected weight EMA whose half-life is fixed in tokens (Zhang et al. 2024); ``wsd``
evaluates each milestone after a short linear-decay branch and continues from the stable branch.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workloads.batching import BatchPlan, plan_batch
from workloads.config import TrialConfig
from workloads.noise_scale import NoiseScaleEMA, step_estimates
from workloads.scaling import LR_RULE_EXPONENTS, beta2_from_half_life, warmup_factor, warmup_length_tokens

__all__ = ["Workload", "TrainingOutcome", "run_loop", "Reporter", "StepGradient", "step_gradient"]

Reporter = Callable[[dict[str, Any], "dict[str, Any] | None"], None]
IGNORE_INDEX = -100


class Workload(Protocol):
    """What a workload gives the loop."""

    model: torch.nn.Module
    vocab_size: int
    flops_per_token: float

    def train_batch(self, *, step: int, global_batch_size_sequences: int, start: int, count: int, stream: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``: inputs are input ids ``[count, T]`` or a dict of model keyword
        arguments; targets ``[count, T]`` use -100 where no loss is taken."""

    def val_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The fixed held-out set."""

    def real_tokens(self, inputs: torch.Tensor, targets: torch.Tensor) -> int:
        """Tokens actually computed in a micro-batch (padding excluded): the unit of tokens seen and FLOPs."""


@dataclass
class TrainingOutcome:
    status: str  # "completed" | "diverged"
    final_metrics: dict[str, Any] = field(default_factory=dict)


def _dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _phase_plans(cfg: TrialConfig, workers: int, min_micro: int) -> list[tuple[int, int, BatchPlan]]:
    """``[(first_tokens_seen, batch, plan)]``: the batch in force from a tokens-seen threshold on."""
    if not cfg.batch_warmup:
        return [(0, cfg.batch_size_sequences, plan_batch(cfg.batch_size_sequences, workers, cfg.micro_batch_size_sequences_max, min_micro))]
    last = cfg.batch_warmup[-1][1]
    out = []
    for thr, mult in cfg.batch_warmup:
        b = cfg.batch_size_sequences * mult // last
        out.append((thr, b, plan_batch(b, workers, cfg.micro_batch_size_sequences_max, min_micro)))
    return out


def _forward(model: torch.nn.Module, inputs, device: torch.device) -> torch.Tensor:
    """Logits for ``inputs``: a tensor of input ids, or a dict of model keyword arguments
    (``input_ids`` plus e.g. a 4-D ``attention_mask`` and ``position_ids`` for packed sequences)."""
    if isinstance(inputs, dict):
        return model(**{k: v.to(device) for k, v in inputs.items()}).logits
    return model(input_ids=inputs.to(device)).logits


def _token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of the per-token cross-entropies over the positions whose target is not -100."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


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
    """

    grads: list[torch.Tensor]
    loss: float
    loss_tokens: int
    real_tokens: int
    small_sq_norm_mean: float | None
    big_sq_norm: float | None
    micro_batches: int


def step_gradient(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    micro_batches: list[tuple[Any, torch.Tensor]],
    *,
    device: torch.device,
    real_tokens: Callable[[Any, torch.Tensor], int],
    autocast_dtype: torch.dtype | None = None,
    noise_scale: bool = False,
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
    """
    _, world = _dist_info()
    n_loss = [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches]
    n_real = sum(int(real_tokens(x, y)) for x, y in micro_batches)
    counts = torch.tensor([sum(n_loss), n_real, sum(1 for n in n_loss if n)], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(counts)
    n_global, real_global, k_global = (int(v) for v in counts.tolist())
    scale = 1.0 / max(n_global, 1)
    acc: list[torch.Tensor] | None = None
    small_sq = torch.zeros((), dtype=torch.float32, device=device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    for (x, y), n_j in zip(micro_batches, n_loss):
        y = y.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = _forward(model, x, device)
        token_sum = _token_loss_sum(logits, y)
        grads = torch.autograd.grad(token_sum * scale, params)
        if noise_scale and n_j:
            small_sq += torch.stack(torch._foreach_norm(grads)).float().pow(2).sum() * (n_global / n_j) ** 2
        if acc is None:
            acc = [g.float() for g in grads]
        else:
            torch._foreach_add_(acc, grads)
        loss_sum += token_sum.detach().float()
    if acc is None:
        raise ValueError("a step needs at least one micro-batch")
    if world > 1:
        flat = torch.cat([g.reshape(-1) for g in acc] + [small_sq.reshape(1), loss_sum.reshape(1)])
        dist.all_reduce(flat)
        offset = 0
        for g in acc:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        small_sq, loss_sum = flat[-2], flat[-1]
    small_mean = big_sq = None
    if noise_scale:
        small_mean = float(small_sq) / k_global if k_global else float("nan")
        big_sq = float(torch.stack(torch._foreach_norm(acc)).float().pow(2).sum())
    return StepGradient(grads=acc, loss=float(loss_sum) / n_global if n_global else float("nan"), loss_tokens=n_global,
                        real_tokens=real_global, small_sq_norm_mean=small_mean, big_sq_norm=big_sq,
                        micro_batches=k_global)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
             autocast_dtype: torch.dtype | None) -> float:
    """Token-weighted mean cross-entropy (nats per token) of ``model`` on ``batches``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        y = y.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = _forward(model, x, device)
        n = int((y != IGNORE_INDEX).sum())
        if n:
            total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                           ignore_index=IGNORE_INDEX, reduction="sum"))
            count += n
    model.train(was_training)
    return total / max(count, 1)


def run_loop(
    cfg: TrialConfig,
    work: Workload,
    *,
    device: torch.device,
    report: Reporter,
    resume_state: dict[str, Any] | None = None,
    peak_flops_per_s: float | None = None,
    attempt: int = 0,
) -> TrainingOutcome:
    """Train ``work.model`` for ``cfg.budget_tokens`` tokens, reporting at ``cfg.milestones_tokens``.

    Each report's metrics carry ``tokens_seen`` (global, all workers), ``step``, ``val_loss``
    (EMA weights for ``constant_ema``, the decayed branch for ``wsd``), ``train_loss`` (mean over
    the steps since the last report of each step's token-weighted loss), ``flops``
    (training FLOPs so far: ``flops_per_token * tokens_seen``), ``flops_measurement`` (evaluation and
    decay branches), ``lr``, ``beta2``, ``tokens_per_s``, ``mfu`` (None off CUDA or on an unknown
    device), ``b_simple``, ``grad_sq_norm_est``, ``trace_sigma_est``, ``grad_norm``, ``status``
    (``running``, ``completed`` or ``diverged``) and ``done``. The state passed with a report
    (rank 0 only, else None) restores the run exactly via ``resume_state``.

    Raises:
        RuntimeError: ``cfg.fail_at_milestone`` fault injection (first attempt only).
    """
    rank, world = _dist_info()
    model = work.model
    params = [p for p in model.parameters() if p.requires_grad]
    T = cfg.context_length_tokens
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    ns_enabled = cfg.noise_scale_enabled
    phases = _phase_plans(cfg, world, 2 if ns_enabled else 1)
    alpha = LR_RULE_EXPONENTS[cfg.lr_rule]

    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                            weight_decay=cfg.weight_decay, foreach=True)
    use_ema = cfg.schedule_kind == "constant_ema"
    ema_raw = [torch.zeros_like(p, dtype=torch.float32) for p in params] if use_ema else []
    eval_model = copy.deepcopy(model) if use_ema else None
    eval_params = [p for p in eval_model.parameters() if p.requires_grad] if eval_model is not None else []
    ns = NoiseScaleEMA(decay=cfg.noise_scale_ema_decay)
    val_set = work.val_batches()
    diverge_at = cfg.divergence_loss_factor * math.log(work.vocab_size)

    st: dict[str, Any] = {
        "step": 0, "tokens_seen": 0, "milestone_idx": 0, "ema_weight": 0.0, "flops_measurement": 0.0,
        "train_time_s": 0.0, "loss_sum": 0.0, "loss_count": 0,
    }
    if resume_state is not None:
        model.load_state_dict(resume_state["model"])
        opt.load_state_dict(resume_state["optimizer"])
        for buf, saved in zip(ema_raw, resume_state.get("ema_raw", [])):
            buf.copy_(saved)
        ns.load_state_dict(resume_state["noise_scale"])
        st.update(resume_state["loop"])
        torch.set_rng_state(resume_state["rng_cpu"])

    milestones = list(cfg.milestones_tokens)
    last_report_wall = time.perf_counter()
    last_report_tokens = st["tokens_seen"]
    last = {"lr": cfg.lr, "beta2": cfg.beta2, "grad_norm": float("nan")}

    def current_phase(tokens_seen: int) -> tuple[int, BatchPlan]:
        b, plan = phases[0][1], phases[0][2]
        for thr, pb, pp in phases:
            if tokens_seen >= thr:
                b, plan = pb, pp
        return b, plan

    # the warmup is at least warmup_min_steps steps of the batch the run starts with (the one in
    # force during the ramp; with batch-size warmup the ramp does not restart when the batch grows)
    warmup_len = warmup_length_tokens(cfg.warmup_tokens, cfg.warmup_min_steps, phases[0][1] * T)

    def set_hparams(b: int, tokens_after_step: int, lr_scale: float = 1.0) -> None:
        lr = cfg.lr * (b / cfg.batch_size_sequences) ** alpha * warmup_factor(tokens_after_step, warmup_len) * lr_scale
        beta2 = beta2_from_half_life(cfg.beta2_half_life_tokens, b, T)
        for g in opt.param_groups:
            g["lr"] = lr
            g["betas"] = (cfg.beta1, beta2)
        last["lr"], last["beta2"] = lr, beta2

    def one_step(step: int, b: int, plan: BatchPlan, tokens_before: int, stream: int = 0, lr_scale: float = 1.0
                 ) -> tuple[float, int, tuple[float, float] | None]:
        """Forward/backward/all-reduce/update for one optimizer step. Returns (loss, tokens, ns estimates).

        The LR is set once the step's tokens are known: its warmup factor counts them (tokens seen after the step).
        """
        k, micro = plan.grad_accum_steps, plan.micro_batch_size_sequences
        per_worker = b // world
        batches = [work.train_batch(step=step, global_batch_size_sequences=b, start=rank * per_worker + j * micro,
                                    count=micro, stream=stream) for j in range(k)]
        sg = step_gradient(model, params, batches, device=device, real_tokens=work.real_tokens,
                           autocast_dtype=autocast_dtype, noise_scale=ns_enabled)
        est = None
        if ns_enabled and sg.micro_batches >= 2:
            est = step_estimates(sg.small_sq_norm_mean, sg.big_sq_norm, micro, sg.micro_batches)
        set_hparams(b, tokens_before + sg.real_tokens, lr_scale)
        for p, g in zip(params, sg.grads):
            p.grad = g
        if cfg.grad_clip_norm is not None:
            last["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm))
        else:
            last["grad_norm"] = float(torch.stack(torch._foreach_norm(sg.grads)).pow(2).sum().sqrt())
        if math.isfinite(sg.loss) and sg.loss <= diverge_at and math.isfinite(last["grad_norm"]):
            opt.step()
        opt.zero_grad(set_to_none=True)
        return sg.loss, sg.real_tokens, est

    def ema_update(b: int, tokens: int) -> None:
        decay = 0.5 ** (tokens / cfg.ema_half_life_tokens)
        with torch.no_grad():
            torch._foreach_mul_(ema_raw, decay)
            torch._foreach_add_(ema_raw, [p.detach().float() for p in params], alpha=1 - decay)
        st["ema_weight"] = decay * st["ema_weight"] + (1 - decay)

    def eval_now(b: int, plan: BatchPlan) -> tuple[float, float | None]:
        """(val_loss used by the analysis, raw-weights val_loss or None)."""
        nonlocal last_report_wall
        t0 = time.perf_counter()
        val_tokens = sum(int((y != IGNORE_INDEX).sum()) for _, y in val_set)
        fwd_flops = work.flops_per_token / 3 * val_tokens
        raw = None
        final = st["tokens_seen"] >= cfg.budget_tokens
        if use_ema:
            with torch.no_grad():
                for ep, e in zip(eval_params, ema_raw):
                    ep.copy_((e / st["ema_weight"]).to(ep.dtype))
            val = evaluate(eval_model, val_set, device, autocast_dtype)
            st["flops_measurement"] += fwd_flops
            if cfg.eval_raw_every_milestone or final:
                raw = evaluate(model, val_set, device, autocast_dtype)
                st["flops_measurement"] += fwd_flops
        elif cfg.schedule_kind == "wsd":
            saved_model = copy.deepcopy(model.state_dict())
            saved_opt = copy.deepcopy(opt.state_dict())
            raw = evaluate(model, val_set, device, autocast_dtype)
            decay_tokens = cfg.decay_fraction * st["tokens_seen"]
            n_steps = max(1, round(decay_tokens / (b * T)))
            branch_tokens = 0
            for i in range(n_steps):
                _, nt, _ = one_step(st["step"] + i, b, plan, st["tokens_seen"], stream=1,
                                    lr_scale=1.0 - (i + 1) / (n_steps + 1))
                branch_tokens += nt
            val = evaluate(model, val_set, device, autocast_dtype)
            st["flops_measurement"] += 2 * fwd_flops + work.flops_per_token * branch_tokens
            model.load_state_dict(saved_model)
            opt.load_state_dict(saved_opt)
        else:
            val = evaluate(model, val_set, device, autocast_dtype)
            st["flops_measurement"] += fwd_flops
        # evaluation time is not training time: keep it out of tokens/s
        last_report_wall += time.perf_counter() - t0
        return val, raw

    status = "running"
    b, plan = current_phase(st["tokens_seen"])
    while st["tokens_seen"] < cfg.budget_tokens:
        b, plan = current_phase(st["tokens_seen"])
        t0 = time.perf_counter()
        loss, n_tok, est = one_step(st["step"], b, plan, st["tokens_seen"])
        st["train_time_s"] += time.perf_counter() - t0
        st["step"] += 1
        st["tokens_seen"] += n_tok
        if est is not None:
            ns.update(*est)
        if not (math.isfinite(loss) and loss <= diverge_at) or not math.isfinite(last["grad_norm"]):
            status = "diverged"
        else:
            st["loss_sum"] += loss
            st["loss_count"] += 1
            if use_ema:
                ema_update(b, n_tok)
        crossed = st["milestone_idx"] < len(milestones) and st["tokens_seen"] >= milestones[st["milestone_idx"]]
        if not crossed and status != "diverged":
            continue
        while st["milestone_idx"] < len(milestones) and st["tokens_seen"] >= milestones[st["milestone_idx"]]:
            st["milestone_idx"] += 1
        done = st["tokens_seen"] >= cfg.budget_tokens or status == "diverged"
        if status == "diverged":
            val, raw = float("nan"), None
        else:
            val, raw = eval_now(b, plan)
            if not math.isfinite(val) or val > diverge_at:
                status = "diverged"
                done = True
        if done and status == "running":
            status = "completed"
        now = time.perf_counter()
        tokens_delta = st["tokens_seen"] - last_report_tokens
        tps = tokens_delta / max(now - last_report_wall, 1e-9)
        last_report_wall, last_report_tokens = now, st["tokens_seen"]
        metrics = {
            "tokens_seen": st["tokens_seen"],
            "step": st["step"],
            "val_loss": val,
            "val_loss_raw": raw,
            "train_loss": st["loss_sum"] / st["loss_count"] if st["loss_count"] else float("nan"),
            "flops": work.flops_per_token * st["tokens_seen"],
            "flops_measurement": st["flops_measurement"],
            "lr": last["lr"],
            "beta2": last["beta2"],
            "batch_size_sequences_now": b,
            "tokens_per_s": tps,
            "mfu": (tps * work.flops_per_token / (peak_flops_per_s * world)) if peak_flops_per_s else None,
            "b_simple": ns.b_simple,
            "grad_sq_norm_est": ns.grad_sq_norm,
            "trace_sigma_est": ns.trace_sigma,
            "grad_norm": last["grad_norm"],
            "status": status,
            "done": done,
            # what each batch size's Optuna study minimises; a diverged trial counts as a uniform prediction
            "objective": val if status != "diverged" else math.log(work.vocab_size),
        }
        if done and cfg.batch_warmup:
            first_b = phases[0][1]
            metrics["steps_saved_vs_initial_batch"] = -(-st["tokens_seen"] // (first_b * T)) - st["step"]
        st["loss_sum"], st["loss_count"] = 0.0, 0
        if (cfg.fail_at_milestone is not None and attempt == 0 and st["milestone_idx"] - 1 == cfg.fail_at_milestone):
            raise RuntimeError(f"injected fault at milestone {cfg.fail_at_milestone}")
        state = None
        want_ckpt = cfg.checkpoint_every_milestones > 0 and st["milestone_idx"] % cfg.checkpoint_every_milestones == 0
        if rank == 0 and want_ckpt and not done:
            state = {
                "model": model.state_dict(), "optimizer": opt.state_dict(), "ema_raw": ema_raw,
                "noise_scale": ns.state_dict(), "loop": dict(st), "rng_cpu": torch.get_rng_state(),
            }
        report(metrics, state)
        if done:
            return TrainingOutcome(status=status, final_metrics=metrics)
        if cfg.hold_file and attempt == 0 and st["milestone_idx"] - 1 == cfg.hold_at_milestone:
            while os.path.exists(cfg.hold_file):  # fault injection: a test kills this worker here
                time.sleep(0.05)
    # budget already reached (resumed after the final report)
    return TrainingOutcome(status="completed", final_metrics={})
