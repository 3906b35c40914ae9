"""The training loop shared by the workloads: plain PyTorch, no Ray, no tracking.

One optimizer step = ``grad_accum_steps`` micro-batches on each of ``workers`` data-parallel
ranks; gradients are averaged with one all-reduce of a flat buffer (gloo on CPU, NCCL on GPU),
which also gives the gradient-noise-scale estimator its small- and big-batch norms at no extra
forward/backward cost. The loop reports at token milestones only, through a ``report`` callable
that the Ray adapter (or a test, or the benchmark) provides.

Schedule (methodology section 11.2): linear warmup over ``warmup_tokens`` tokens (the same for
every batch size), then a constant LR; ``constant_ema`` evaluates a bias-corrected weight EMA whose
half-life is fixed in tokens (Zhang et al. 2024); ``wsd`` evaluates each milestone after a short
linear-decay branch and continues from the stable branch.
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
from workloads.scaling import LR_RULE_EXPONENTS, beta2_from_half_life

__all__ = ["Workload", "TrainingOutcome", "run_loop", "Reporter"]

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


def _warmup_factor(tokens_seen: int, warmup_tokens: int) -> float:
    if warmup_tokens <= 0:
        return 1.0
    return min(1.0, (tokens_seen + 1) / warmup_tokens)


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


def _masked_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


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
    (EMA weights for ``constant_ema``, the decayed branch for ``wsd``), ``train_loss``, ``flops``
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

    def set_hparams(b: int, tokens_seen: int, lr_scale: float = 1.0) -> None:
        lr = cfg.lr * (b / cfg.batch_size_sequences) ** alpha * _warmup_factor(tokens_seen, cfg.warmup_tokens) * lr_scale
        beta2 = beta2_from_half_life(cfg.beta2_half_life_tokens, b, T)
        for g in opt.param_groups:
            g["lr"] = lr
            g["betas"] = (cfg.beta1, beta2)
        last["lr"], last["beta2"] = lr, beta2

    def one_step(step: int, b: int, plan: BatchPlan, stream: int = 0) -> tuple[float, int, tuple[float, float] | None]:
        """Forward/backward/all-reduce/update for one optimizer step. Returns (loss, tokens, ns estimates)."""
        k, micro = plan.grad_accum_steps, plan.micro_batch_size_sequences
        per_worker = b // world
        acc: list[torch.Tensor] | None = None
        small_sq = torch.zeros((), dtype=torch.float32, device=device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        n_tokens = torch.zeros((), dtype=torch.float32, device=device)
        for j in range(k):
            x, y = work.train_batch(step=step, global_batch_size_sequences=b, start=rank * per_worker + j * micro,
                                    count=micro, stream=stream)
            y = y.to(device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = _forward(model, x, device)
            loss = _masked_loss(logits, y)
            grads = torch.autograd.grad(loss, params)
            if ns_enabled:
                small_sq += torch.stack(torch._foreach_norm(grads)).float().pow(2).sum()
            if acc is None:
                acc = list(grads)
            else:
                torch._foreach_add_(acc, grads)
            loss_sum += loss.detach().float()
            n_tokens += work.real_tokens(x, y)
        assert acc is not None
        torch._foreach_div_(acc, float(k))
        if world > 1:
            flat = torch.cat([g.reshape(-1).float() for g in acc] + [small_sq.reshape(1), loss_sum.reshape(1), n_tokens.reshape(1)])
            dist.all_reduce(flat)
            scal = flat[-3:]
            flat = flat[:-3] / world
            offset = 0
            for g in acc:
                n = g.numel()
                g.copy_(flat[offset:offset + n].view_as(g))
                offset += n
            small_sq, loss_sum, n_tokens = scal[0], scal[1], scal[2]
        K = k * world
        est = None
        if ns_enabled and K >= 2:
            big_sq = float(torch.stack(torch._foreach_norm(acc)).float().pow(2).sum())
            est = step_estimates(float(small_sq) / K, big_sq, micro, K)
        for p, g in zip(params, acc):
            p.grad = g
        if cfg.grad_clip_norm is not None:
            last["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm))
        else:
            last["grad_norm"] = float(torch.stack(torch._foreach_norm(acc)).pow(2).sum().sqrt())
        mean_loss = float(loss_sum) / K
        if math.isfinite(mean_loss) and mean_loss <= diverge_at and math.isfinite(last["grad_norm"]):
            opt.step()
        opt.zero_grad(set_to_none=True)
        return mean_loss, int(n_tokens), est

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
                set_hparams(b, st["tokens_seen"], lr_scale=1.0 - (i + 1) / (n_steps + 1))
                _, nt, _ = one_step(st["step"] + i, b, plan, stream=1)
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
        set_hparams(b, st["tokens_seen"])
        t0 = time.perf_counter()
        loss, n_tok, est = one_step(st["step"], b, plan)
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
