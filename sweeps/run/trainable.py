"""The Tune trainable: one trial = one Ray Train ``TorchTrainer`` run of a workload.

Three levels, as Ray recommends for Tune + Train V2: the workload's pure training loop
(``workloads``), wrapped by ``train_fn_per_worker`` (``workloads._ray_adapter``), wrapped by this
Tune function trainable, which turns the sweep's config into a :class:`TrialConfig`, sizes the
worker group and forwards rank 0's milestone metrics to Tune.
"""

from __future__ import annotations

import math
import os
from typing import Any

import ray.tune
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback

from sweeps.pruning.rungs import rung_fractions
from sweeps.spec import SweepSpec
from workloads.batching import plan_batch
from workloads.config import TrialConfig

__all__ = ["trial_config", "make_trainable", "train_run_name"]


def train_run_name(trial_id: str) -> str:
    """The Ray Train run name of a trial; reused on restore so its checkpoints are found again."""
    return f"train-{trial_id}"


def trial_config(spec: SweepSpec, config: dict[str, Any], trial_id: str, *, data_path: str,
                 rung_gate_key: str | None = None) -> TrialConfig:
    """Build the workload's :class:`TrialConfig` from the spec and one Tune config (see ``search.py``).

    ``rung_gate_key``: with ``pruning.mode: pause``, the Ray KV key where the scheduler lets this trial
    go on past a rung (the worker waits there; ``sweeps.pruning.scheduler.rung_gate_key``).
    """
    m = spec.model
    gated = rung_gate_key is not None and spec.pruning.enabled and spec.pruning.mode == "pause"
    return TrialConfig(
        trial_id=trial_id,
        workload=spec.workload,
        family=m.family,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        d_ff=m.d_ff_resolved,
        context_length_tokens=m.context_length_tokens,
        tie_word_embeddings=m.tie_word_embeddings,
        data_path=data_path,
        tokenizer=spec.data.tokenizer,
        validation_fraction=spec.data.validation_fraction,
        budget_tokens=spec.budget_tokens,
        milestones_tokens=tuple(spec.milestones_tokens()),
        eval_tokens=spec.eval.eval_tokens,
        schedule_kind=spec.schedule.kind,
        warmup_tokens=spec.schedule.warmup_tokens,
        warmup_min_steps=spec.schedule.warmup_min_steps,
        ema_half_life_tokens=spec.schedule.ema_half_life_tokens,
        decay_fraction=spec.schedule.decay_fraction,
        batch_size_sequences=int(config["batch_size_sequences"]),
        micro_batch_size_sequences_max=spec.resources.micro_batch_size_sequences_max,
        batch_warmup=tuple(tuple(x) for x in spec.batch_warmup.schedule) if spec.batch_warmup else None,
        lr=float(config["lr"]),
        lr_rule=str(config["lr_rule"]),
        beta1=spec.optimizer.beta1,
        beta2=float(config["beta2"]),
        beta2_half_life_tokens=float(config["beta2_half_life_tokens"]),
        eps=spec.optimizer.eps,
        weight_decay=spec.optimizer.weight_decay,
        grad_clip_norm=spec.optimizer.grad_clip_norm,
        divergence_loss_factor=spec.optimizer.divergence_loss_factor,
        noise_scale_enabled=spec.noise_scale.enabled,
        noise_scale_ema_decay=spec.noise_scale.ema_decay,
        seed=int(config["seed"]),
        fail_at_milestone=config.get("fail_at_milestone"),
        # fault-injection hook of tests/sweeps/run/test_faults.py (unset in normal use)
        hold_at_milestone=int(os.environ["CRITBATCH_TEST_HOLD_AT_MILESTONE"])
        if os.environ.get("CRITBATCH_TEST_HOLD_AT_MILESTONE") else None,
        hold_file=os.environ.get("CRITBATCH_TEST_HOLD_FILE") or None,
        finetune=spec.finetune.model_dump() if spec.finetune else None,
        rung_barrier_tokens=tuple(f * spec.budget_tokens for f in rung_fractions(
            spec.pruning.grace_fraction, spec.pruning.reduction_factor)) if gated else None,
        rung_gate_key=rung_gate_key if gated else None,
    )


def make_trainable(spec: SweepSpec, *, data_path: str, storage_path: str, save_dir_root: str | None = None,
                   rung_gate_prefix: str | None = None):
    """A Tune function trainable for this sweep, with its per-trial resource request.

    Args:
        spec: the sweep.
        data_path: absolute data path readable by the workers.
        storage_path: where Ray Train keeps each trial's checkpoints (shared by all nodes).
        save_dir_root: if set, rank 0 saves each completed trial's Hugging Face checkpoint in
            ``save_dir_root/<trial_id>``.
        rung_gate_prefix: ``pruning.mode: pause``: the sweep's prefix of the rung-gate KV keys (the
            scheduler's ``gate_prefix``); a trial's workers wait at each rung for its decision.
    """
    res = spec.resources
    spec_json = spec.model_dump_json()
    use_gpu = res.gpus_per_worker > 0

    def run_trial(config: dict[str, Any]) -> None:
        from sweeps.spec import SweepSpec as _S

        s = _S.model_validate_json(spec_json)
        trial_id = ray.tune.get_context().get_trial_id()
        from sweeps.pruning.rungs import rung_gate_key

        cfg = trial_config(s, config, trial_id, data_path=data_path,
                           rung_gate_key=rung_gate_key(rung_gate_prefix, trial_id) if rung_gate_prefix else None)
        loop_config = cfg.to_dict()
        if save_dir_root:
            loop_config["_save_dir"] = os.path.join(save_dir_root, trial_id)
        from workloads._ray_adapter import train_fn_per_worker

        resources = {"CPU": res.cpus_per_worker}
        if use_gpu:
            resources["GPU"] = res.gpus_per_worker
        trainer = TorchTrainer(
            train_fn_per_worker,
            train_loop_config=loop_config,
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            scaling_config=ScalingConfig(num_workers=res.workers_per_trial, use_gpu=use_gpu, resources_per_worker=resources),
            run_config=RunConfig(
                name=train_run_name(trial_id),
                storage_path=storage_path,
                callbacks=[TuneReportCallback()],
                failure_config=FailureConfig(max_failures=res.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=1),
            ),
        )
        trainer.fit()
        _drain_report_queue()

    return ray.tune.with_resources(run_trial, {"CPU": res.trial_driver_cpus})


def _drain_report_queue(timeout_s: float = 300.0) -> None:
    """Wait until Tune has taken every metrics item that ``TuneReportCallback`` forwarded.

    The Train controller's last report can still sit in the Tune session's inter-actor queue when
    ``fit()`` returns; if the trainable function ends first, Ray 2.60's function-trainable session can
    block forever putting that item on its own result queue (seen with restored trials under load).
    Returning only once the queue is empty keeps the consumer alive for it.
    """
    import time

    from ray.train._internal.session import get_session

    session = get_session()
    q = getattr(session, "_inter_actor_queue", None) if session is not None else None
    if q is None:
        return
    def drained() -> bool:
        try:
            return q.empty() and session.result_queue.empty()
        except Exception:  # noqa: BLE001 - the queue actor is gone: nothing left to drain
            return True

    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        if drained():
            # the main thread moves an item from one queue to the other: require a quiet half second
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 0.5:
                return
        else:
            quiet_since = None
        time.sleep(0.05)


def batch_plan_params(spec: SweepSpec, batch_size_sequences: int) -> dict[str, int]:
    """Micro-batch size, accumulation steps and workers for a batch size (logged as trial params)."""
    plan = plan_batch(batch_size_sequences, spec.resources.workers_per_trial,
                      spec.resources.micro_batch_size_sequences_max, 2 if spec.noise_scale.enabled else 1)
    return {
        "micro_batch_size_sequences": plan.micro_batch_size_sequences,
        "grad_accum_steps": plan.grad_accum_steps,
        "workers": plan.workers,
    }


def objective_of(metrics: dict[str, Any], vocab_size: int) -> float:
    """The Optuna objective of a finished trial: final validation loss, ``ln(vocab)`` if diverged."""
    val = metrics.get("val_loss")
    if metrics.get("status") == "diverged" or val is None or not math.isfinite(val):
        return math.log(vocab_size)
    return float(val)
