"""The training loop shared by the workloads: plain PyTorch, no Ray, no tracking.

Train for ``budget_tokens`` tokens in optimizer steps (:class:`workloads.train.step.Stepper`) whose
batch, LR and beta2 come from :class:`workloads.train.schedule.Schedule`; keep a weight EMA
(:class:`workloads.train.ema.WeightEMA`) and the noise-scale EMAs; at each token milestone evaluate
(:class:`workloads.train.evaluation.MilestoneEvaluator`) and report through a ``report`` callable that
the Ray adapter (or a test, or the benchmark) provides, with the loop state that resumes the run
exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import torch

from workloads.config import TrialConfig
from workloads.train.batching import min_micro_batches_total
from workloads.train.ema import WeightEMA
from workloads.train.evaluation import MilestoneEvaluator, evaluate
from workloads.train.hooks import MilestoneHook
from workloads.train.noise_scale import NoiseScaleEMA
from workloads.train.optim import build_optimizer, reads_beta2, state_bytes_per_param
from workloads.train.parallel import (
    autocast_dtype,
    full_model_state,
    full_optimizer_state,
    full_tensors,
    is_sharded,
    load_model_state,
    load_optimizer_state,
    prepare_model,
)
from workloads.train.report import TrialOutcome, TrialReport
from workloads.train.schedule import BatchPhase, Schedule, batch_phases
from workloads.train.step import IGNORE_INDEX, ModelInput, StepOutcome, Stepper, dist_info
from workloads.train.sync import CommCounters, ReplicaSync, to_cpu

__all__ = [
    "IGNORE_INDEX",
    "LoopCounters",
    "ModelInput",
    "Reporter",
    "TrainingOutcome",
    "Workload",
    "evaluate",
    "run_loop",
]

#: ``report(metrics, state)``: ``metrics`` is :meth:`TrialReport.to_dict`; ``state`` (rank 0, with a checkpoint)
#: restores the run, else None.
Reporter = Callable[[dict[str, Any], "dict[str, Any] | None"], None]


class Workload(Protocol):
    """What a workload gives the loop."""

    model: torch.nn.Module
    flops_per_token: float

    @property
    def vocab_size(self) -> int:
        """The model's number of ids (read only: an attribute or a property)."""
        ...

    def train_batch(
        self, *, step: int, global_batch_size_sequences: int, start: int, count: int, stream: int = 0
    ) -> tuple[ModelInput, torch.Tensor]:
        """``(inputs, targets)``: inputs are input ids ``[count, T]`` or a dict of model keyword
        arguments; targets ``[count, T]`` use -100 where no loss is taken."""
        ...

    def val_batches(self) -> Sequence[tuple[ModelInput, torch.Tensor]]:
        """The fixed held-out set."""
        ...

    def real_tokens(self, inputs: ModelInput, targets: torch.Tensor) -> int:
        """Tokens actually computed in a micro-batch (padding excluded): the unit of tokens seen and FLOPs."""
        ...


@dataclass
class TrainingOutcome:
    """How a trial ended: ``status`` ``"completed"`` or ``"diverged"``, and its last report's metrics."""

    status: str
    final_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopCounters:
    """The loop's position and running sums; saved as the checkpoint's ``loop`` dict.

    Attributes:
        step: optimizer steps taken (the data position: step ``s`` always draws the same batch).
        tokens_seen: real tokens trained on, all workers.
        milestone_idx: milestones reported.
        flops_measurement: evaluation and decay-branch FLOPs so far.
        train_time_s: seconds spent in training steps.
        loss_sum, loss_count: step losses since the last report (for ``train_loss``).
    """

    step: int = 0
    tokens_seen: int = 0
    milestone_idx: int = 0
    flops_measurement: float = 0.0
    train_time_s: float = 0.0
    loss_sum: float = 0.0
    loss_count: int = 0

    def state(self, ema_weight: float) -> dict[str, Any]:
        """The checkpoint's ``loop`` dict (with the weight EMA's ``ema_weight``, 0.0 without one)."""
        d = asdict(self)
        return {
            "step": d.pop("step"),
            "tokens_seen": d.pop("tokens_seen"),
            "milestone_idx": d.pop("milestone_idx"),
            "ema_weight": ema_weight,
            **d,
        }

    def pass_milestones(self, milestones: list[int]) -> bool:
        """Count the milestones (tokens, ascending) that ``tokens_seen`` has reached; whether any was new."""
        before = self.milestone_idx
        while self.milestone_idx < len(milestones) and self.tokens_seen >= milestones[self.milestone_idx]:
            self.milestone_idx += 1
        return self.milestone_idx > before

    @classmethod
    def from_state(cls, loop: dict[str, Any]) -> LoopCounters:
        """Inverse of :meth:`state` (``ema_weight`` is left for the weight EMA)."""
        return cls(**{k: v for k, v in loop.items() if k != "ema_weight"})


def run_loop(
    cfg: TrialConfig,
    work: Workload,
    *,
    device: torch.device,
    report: Reporter,
    resume_state: dict[str, Any] | None = None,
    peak_flops_per_s: float | None = None,
    attempt: int = 0,
    on_milestone: Sequence[MilestoneHook] = (),
) -> TrainingOutcome:
    """Train ``work.model`` for ``cfg.budget_tokens`` (or to ``cfg.eval.stop_at_loss``), reporting at its milestones.

    Each report is a :class:`workloads.train.report.TrialReport` (its fields say what a report holds and
    when), handed to ``report`` as :meth:`~workloads.train.report.TrialReport.to_dict`. ``status`` is a
    :class:`workloads.train.report.TrialOutcome`. The state passed with a report (rank 0 only, else
    None) restores the run exactly via ``resume_state``. Every hook of ``on_milestone`` (empty in real runs;
    tests inject faults through it, :mod:`workloads.train.hooks`) is called just before and just after each
    milestone report, with the milestone's index and ``attempt``.

    Raises:
        Exception: whatever a hook's ``before_report`` or ``after_report`` raises.
    """
    run = _Training(cfg, work, device)
    c = LoopCounters() if resume_state is None else run.restore(resume_state)
    milestones = list(cfg.eval.milestones_tokens)
    last_report_wall, last_report_tokens = time.perf_counter(), c.tokens_seen
    last = _no_step(cfg)
    status = TrialOutcome.RUNNING
    first: _FirstStep | None = None  # this attempt's first step, until its report
    while c.tokens_seen < cfg.budget_tokens:
        phase = run.schedule.phase_at(c.tokens_seen)
        last = run.train_step(c, phase)
        if first is None:  # under fsdp state_bytes_per_param is a collective: every rank is here
            first = _FirstStep(unix_s=time.time(), state_bytes_per_param=run.state_bytes_per_param())
        if last.diverged(run.diverge_at):
            status = TrialOutcome.DIVERGED
        if not c.pass_milestones(milestones) and status != TrialOutcome.DIVERGED:
            continue
        done = c.tokens_seen >= cfg.budget_tokens or status == TrialOutcome.DIVERGED
        val, raw = math.nan, None
        if status != TrialOutcome.DIVERGED:
            val, raw, last, eval_s = run.evaluate(c, phase, last)
            last_report_wall += eval_s  # evaluation time is not training time
            if not math.isfinite(val) or val > run.diverge_at:
                status, done = TrialOutcome.DIVERGED, True
        stopped = status == TrialOutcome.RUNNING and cfg.eval.stop_at_loss is not None and val <= cfg.eval.stop_at_loss
        done = done or stopped  # token reallocation: it reached the lowest target the sweep declared
        status = TrialOutcome.COMPLETED if done and status == TrialOutcome.RUNNING else status
        now = time.perf_counter()
        tps = (c.tokens_seen - last_report_tokens) / max(now - last_report_wall, 1e-9)
        last_report_wall, last_report_tokens = now, c.tokens_seen
        made = _report(
            c,
            val=val,
            raw=raw,
            last=last,
            ns=run.ns,
            work=work,
            batch=phase.batch_size_sequences,
            tps=tps,
            peak=peak_flops_per_s,
            world=run.stepper.world,
            status=status,
            done=done,
            comm=run.comm.metrics(),
        )
        made = replace(
            made,
            stopped_at_loss=True if stopped else None,
            steps_saved_vs_initial_batch=run.steps_saved_vs_initial_batch(c) if done and cfg.batch.warmup else None,
        )
        if first.unix_s:  # the attempt's first report; 0.0 after it
            made = first.take(made, run.n_params)
        metrics = made.to_dict()
        c.loss_sum, c.loss_count = 0.0, 0
        for hook in on_milestone:
            hook.before_report(c.milestone_idx - 1, attempt)
        report(metrics, run.checkpoint(c) if not done else None)
        if done:
            return TrainingOutcome(status=str(status), final_metrics=metrics)
        for hook in on_milestone:
            hook.after_report(c.milestone_idx - 1, attempt)
    # budget already reached (resumed after the final report)
    return TrainingOutcome(status=str(TrialOutcome.COMPLETED), final_metrics={})


def _no_step(cfg: TrialConfig) -> StepOutcome:
    """The outcome reported before any step of this call (NaN loss, the configured LR and beta2)."""
    o = cfg.optimizer
    return StepOutcome(
        loss=math.nan,
        real_tokens=0,
        noise_estimates=None,
        lr=o.lr,
        beta2=o.beta2 if reads_beta2(o.name) else math.nan,
        grad_norm=math.nan,
    )


@dataclass
class _FirstStep:
    """When an attempt's first optimizer step ended and the optimizer state it left: its first report's extras.

    Attributes:
        unix_s: when the step ended (Unix seconds; the Ray adapter turns it into the start-up time);
            0.0 once reported.
        state_bytes_per_param: :meth:`_Training.state_bytes_per_param` after the step (None: empty state).
    """

    unix_s: float
    state_bytes_per_param: float | None

    def take(self, report: TrialReport, trainable_params: int) -> TrialReport:
        """``report`` with ``first_step_unix_s``, ``trainable_params`` and (with a state)
        ``optimizer_state_bytes_per_param``; ``unix_s`` is 0.0 after."""
        out = replace(
            report,
            first_step_unix_s=self.unix_s,
            optimizer_state_bytes_per_param=self.state_bytes_per_param,
            trainable_params=trainable_params,
        )
        self.unix_s = 0.0
        return out


class _Training:
    """The objects of one trial's loop: schedule, optimizer, weight and noise-scale EMAs, stepper, evaluator.

    Built in this order on every rank (none draws from the torch RNG). Under ``training.sync.mode``
    local_sgd or diloco also the replicas' :class:`workloads.train.sync.ReplicaSync`.
    """

    def __init__(self, cfg: TrialConfig, work: Workload, device: torch.device):
        o, tr = cfg.optimizer, cfg.training
        self.cfg, self.model = cfg, work.model
        self.rank, world = dist_info()
        with_ema = cfg.schedule.kind == "constant_ema"
        eval_model = prepare_model(self.model, tr, world=world, eval_copy=with_ema, device=device)
        self.sharded = is_sharded(self.model)
        self.params: list[torch.Tensor] = [p for p in self.model.parameters() if p.requires_grad]
        self.schedule = Schedule(
            cfg, batch_phases(cfg, world, min_micro_batches_total(cfg.noise_scale.enabled, tr.parallelism, world))
        )
        self.opt = build_optimizer(self.params, o, device)
        self.ema = (
            WeightEMA(self.model, self.params, cfg.schedule.ema_half_life_tokens, eval_model=eval_model)
            if with_ema
            else None
        )
        self.ns = NoiseScaleEMA(decay=cfg.noise_scale.ema_decay)
        self.sync = ReplicaSync(tr.sync, self.model, self.params) if tr.sync.local else None
        self.comm = CommCounters()
        self.diverge_at = o.divergence_loss_factor * math.log(work.vocab_size)
        self.stepper = Stepper(
            model=self.model,
            params=self.params,
            opt=self.opt,
            work=work,
            schedule=self.schedule,
            device=device,
            beta1=o.beta1,
            grad_clip_norm=o.grad_clip_norm,
            diverge_at=self.diverge_at,
            noise_scale=cfg.noise_scale.enabled,
            autocast_dtype=autocast_dtype(tr.mixed_precision, device),
            sharded=self.sharded,
            sync=self.sync,
        )
        self.evaluator = MilestoneEvaluator(
            cfg,
            model=self.model,
            ema=self.ema,
            val_set=work.val_batches(),
            flops_per_token=work.flops_per_token,
            stepper=self.stepper,
            sync=self.sync,
        )

    def train_step(self, c: LoopCounters, phase: BatchPhase) -> StepOutcome:
        """One optimizer step at ``c``'s position; advances ``c`` and the EMAs (not after a diverged step)."""
        t0 = time.perf_counter()
        out = self.stepper.step(c.step, phase, c.tokens_seen)
        c.train_time_s += time.perf_counter() - t0
        c.step += 1
        c.tokens_seen += out.real_tokens
        self.comm.add(bytes_=out.comm_bytes, time_s=out.comm_time_s, synced=out.synced)
        if out.noise_estimates is not None:
            self.ns.update(*out.noise_estimates)
        if not out.diverged(self.diverge_at):
            c.loss_sum += out.loss
            c.loss_count += 1
            if self.ema is not None:
                self.ema.update(out.real_tokens)
        return out

    def evaluate(
        self, c: LoopCounters, phase: BatchPhase, last: StepOutcome
    ) -> tuple[float, float | None, StepOutcome, float]:
        """The milestone's evaluation (:class:`workloads.train.evaluation.MilestoneEvaluator`), its FLOPs added
        to ``c``: ``(val_loss, val_loss_raw, the last step, seconds it took)``; the last step is the
        decay branch's when one ran, else ``last``."""
        t_eval = time.perf_counter()
        ev = self.evaluator(step=c.step, tokens_seen=c.tokens_seen, phase=phase)
        for flops in ev.flops:
            c.flops_measurement += flops
        return (
            ev.val_loss,
            ev.val_loss_raw,
            ev.last_step if ev.last_step is not None else last,
            time.perf_counter() - t_eval,
        )

    def steps_saved_vs_initial_batch(self, c: LoopCounters) -> int:
        """Optimizer steps a batch-size warmup saved: the steps ``c.tokens_seen`` takes at the first
        phase's batch size, less the steps taken."""
        first_b = self.schedule.phases[0].batch_size_sequences
        return -(-c.tokens_seen // (first_b * self.cfg.context_length_tokens)) - c.step

    @property
    def n_params(self) -> int:
        """Trainable parameters (elements; a DTensor's numel is the global one)."""
        return sum(p.numel() for p in self.params)

    def state_bytes_per_param(self) -> float | None:
        """Bytes of optimizer state per trainable parameter (:func:`workloads.train.optim.state_bytes_per_param`),
        or None while the state is empty (no step applied yet).

        ddp: this rank's state (every rank holds the whole state). fsdp: each rank's local shards,
        summed over the ranks (an all-reduce: every rank must call it), over the global parameter count.
        """
        local = state_bytes_per_param(self.opt, self.n_params)
        if self.sharded:
            import torch.distributed as dist

            t = torch.tensor([local], dtype=torch.float64, device=self.stepper.device)
            dist.all_reduce(t)
            local = float(t.item())
        return local if local > 0 else None

    def checkpoint(self, c: LoopCounters) -> dict[str, Any] | None:
        """The state to report with this milestone (rank 0, every ``checkpoint_every_milestones``), else None.

        Under fsdp every rank must call it (the state is gathered); only rank 0 gets it.

        Keys: ``model``, ``optimizer``, ``ema_raw`` (the EMA buffers, ``[]`` without one),
        ``noise_scale``, ``loop`` (:meth:`LoopCounters.state`), ``rng_cpu`` (the torch CPU RNG) and
        ``comm`` (:class:`workloads.train.sync.CommCounters`, rank 0's). Under local_sgd and diloco the
        replicas differ between synchronisations: every rank's ``model``, ``optimizer``, ``ema_raw``
        and ``rng_cpu`` are gathered to rank 0 (a collective) into ``replicas`` (a list by rank, each
        rank restores its own), the top-level ones being rank 0's, and ``sync`` holds DiLoCo's anchor
        and outer optimizer (:meth:`workloads.train.sync.ReplicaSync.state_dict`).
        """
        every = self.cfg.eval.checkpoint_every_milestones
        if every <= 0 or c.milestone_idx % every:
            return None
        ema = self.ema
        if self.sync is not None:
            return self._replica_checkpoint(c)
        if self.sharded:  # gathered to rank 0 (collectives: every rank takes part), in the ddp format
            model, opt = full_model_state(self.model), full_optimizer_state(self.model, self.opt)
            ema_raw = full_tensors(ema.buffers) if ema is not None else []
        elif self.rank != 0:
            return None
        else:
            model, opt, ema_raw = self.model.state_dict(), self.opt.state_dict(), ema.buffers if ema is not None else []
        if self.rank != 0:
            return None
        return {
            "model": model,
            "optimizer": opt,
            "ema_raw": ema_raw,
            "noise_scale": self.ns.state_dict(),
            "loop": c.state(ema.weight if ema is not None else 0.0),
            "rng_cpu": torch.get_rng_state(),
            "comm": self.comm.state_dict(),
        }

    def _replica_checkpoint(self, c: LoopCounters) -> dict[str, Any] | None:
        """:meth:`checkpoint` under local_sgd / diloco: every replica's state gathered to rank 0."""
        import torch.distributed as dist

        ema = self.ema
        mine = to_cpu(
            {
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "ema_raw": ema.buffers if ema is not None else [],
                "rng_cpu": torch.get_rng_state(),
            }
        )
        gathered: list[Any] | None = [None] * self.stepper.world if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank != 0 or gathered is None or self.sync is None:  # rank 0 has both
            return None
        first = gathered[0]
        return {
            "model": first["model"],
            "optimizer": first["optimizer"],
            "ema_raw": first["ema_raw"],
            "noise_scale": self.ns.state_dict(),
            "loop": c.state(ema.weight if ema is not None else 0.0),
            "rng_cpu": first["rng_cpu"],
            "comm": self.comm.state_dict(),
            "replicas": gathered,
            "sync": self.sync.state_dict(),
        }

    def restore(self, state: dict[str, Any]) -> LoopCounters:
        """Load a state saved with a report into the model, optimizer, EMAs and torch RNG; its counters.

        A state with ``replicas`` (local_sgd, diloco) gives each rank its own entry.

        Raises:
            ValueError: a state with ``replicas`` for another number of ranks.
        """
        replicas = state.get("replicas")
        if replicas is not None:
            if len(replicas) != self.stepper.world:
                raise ValueError(
                    f"the checkpoint holds {len(replicas)} replicas, this trial runs {self.stepper.world} workers"
                )
            state = {**state, **replicas[self.rank]}
        if self.sync is not None:  # diloco refuses a state without its anchor
            self.sync.load_state_dict(state.get("sync", {}))
        if "comm" in state:
            self.comm.load_state_dict(state["comm"])
        if self.sharded:  # every rank holds the whole state: each loads its shards
            load_model_state(self.model, state["model"])
            load_optimizer_state(self.model, self.opt, state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
        if self.ema is not None:
            self.ema.load_buffers(state.get("ema_raw", []))
        self.ns.load_state_dict(state["noise_scale"])
        if self.ema is not None:
            self.ema.weight = state["loop"].get("ema_weight", 0.0)
        counters = LoopCounters.from_state(state["loop"])
        torch.set_rng_state(state["rng_cpu"])
        return counters


def _report(
    c: LoopCounters,
    *,
    val: float,
    raw: float | None,
    last: StepOutcome,
    ns: NoiseScaleEMA,
    work: Workload,
    batch: int,
    tps: float,
    peak: float | None,
    world: int,
    status: TrialOutcome,
    done: bool,
    comm: dict[str, Any],
) -> TrialReport:
    """One milestone's :class:`workloads.train.report.TrialReport` (see :func:`run_loop`)."""
    return TrialReport(
        tokens_seen=c.tokens_seen,
        step=c.step,
        val_loss=val,
        val_loss_raw=raw,
        train_loss=c.loss_sum / c.loss_count if c.loss_count else float("nan"),
        flops=work.flops_per_token * c.tokens_seen,
        flops_measurement=c.flops_measurement,
        lr=last.lr,
        beta2=last.beta2,
        batch_size_sequences_now=batch,
        tokens_per_s=tps,
        mfu=(tps * work.flops_per_token / (peak * world)) if peak else None,
        b_simple=ns.b_simple,
        grad_sq_norm_est=ns.grad_sq_norm,
        trace_sigma_est=ns.trace_sigma,
        grad_norm=last.grad_norm,
        status=status,
        done=done,
        # what each batch size's Optuna study minimises; a diverged trial counts as a uniform prediction
        objective=val if status != TrialOutcome.DIVERGED else math.log(work.vocab_size),
        **comm,
    )
