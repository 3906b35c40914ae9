"""The Tune trainable: a relay to the sweep's trial runners, or one Ray Train ``TorchTrainer`` run per trial.

Three levels, as Ray recommends for Tune + Train V2: the workload's pure training loop
(``workloads``), wrapped by a Ray Train worker function (``workloads.api``), wrapped by this
Tune function trainable (:func:`run_trial`), which turns Tune's config of a trial into a :class:`TrialConfig`
once and hands it down with a :class:`TrialRunContext` (how this run of it goes: start time, threads, folders). The
sweep's launcher (``resources.launcher``, :mod:`sweeps.launch.launcher`) runs it: a relay to the sweep's
long-lived worker groups (``sweeps.launch.runners``), or a worker group of its own whose rank 0's milestone
metrics go to Tune. Importing this module imports no torch (the relay runs in Tune's trial process).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import ray.tune

import sweeps.tracking.schema as schema
from sweeps._compat import without_idle_train_helpers
from sweeps.launch.workload import workload_config
from sweeps.pruning.rungs import rung_fractions
from sweeps.spec import LAUNCHER_REGISTRY, SweepSpec
from workloads.api import (
    BatchConfig,
    EvalConfig,
    NoiseScaleConfig,
    OptimizerConfig,
    OptimizerSettings,
    RungGateConfig,
    ScheduleConfig,
    TrainingConfig,
    TrialConfig,
    TrialRunContext,
    WorkloadConfig,
    min_micro_batches_total,
    plan_batch,
    torch_threads_per_worker,
)

__all__ = [
    "SweepTrials",
    "TrialTorchTrainer",
    "batch_plan_params",
    "make_trainable",
    "run_trial",
    "train_run_name",
    "training_config",
    "training_params",
    "trial_config",
    "trial_torch_trainer",
]

_trials_in_this_process = 0


_TRAINER_CLASS: type | None = None


def trial_torch_trainer() -> type:
    """Ray Train's ``TorchTrainer`` without the two helper processes a trial does not use (built on first use,
    so that importing this module, as Tune's relay trainable does, imports no torch).

    One fewer actor each for the ``DatasetManager`` (no Ray Datasets here) and the detached
    ``PlacementGroupCleaner`` (the sweep's reaper removes orphaned groups):
    :func:`sweeps._compat.without_idle_train_helpers`, which overrides Ray 2.60's private
    ``_create_default_callbacks`` (tests/sweeps/test_compat.py pins it). Also ``TrialTorchTrainer``
    as a module attribute.
    """
    global _TRAINER_CLASS
    if _TRAINER_CLASS is None:
        from ray.train.torch import TorchTrainer

        class TrialTorchTrainer(TorchTrainer):
            __doc__ = trial_torch_trainer.__doc__

            def _create_default_callbacks(self) -> list:
                return without_idle_train_helpers(super()._create_default_callbacks(), has_datasets=bool(self.datasets))

        TrialTorchTrainer.__module__, TrialTorchTrainer.__qualname__ = __name__, "TrialTorchTrainer"
        _TRAINER_CLASS = TrialTorchTrainer
    return _TRAINER_CLASS


def __getattr__(name: str) -> Any:
    if name == "TrialTorchTrainer":
        return trial_torch_trainer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _trial_started_unix() -> float:
    """When this trial started (Unix seconds): its Tune process's creation for the process's first
    trial, the call itself for a trial in a reused process."""
    global _trials_in_this_process
    _trials_in_this_process += 1
    now = time.time()
    if _trials_in_this_process == 1:
        try:
            import psutil

            return min(now, psutil.Process().create_time())
        except Exception:  # noqa: BLE001 - psutil missing or the process unreadable: from this call
            return now
    return now


def train_run_name(trial_id: str) -> str:
    """The Ray Train run name of a trial; reused on restore so its checkpoints are found again."""
    return f"train-{trial_id}"


def trial_config(
    spec: SweepSpec,
    config: dict[str, Any],
    trial_id: str,
    *,
    data_path: str | None = None,
    shards: str | None = None,
    workload: WorkloadConfig | None = None,
    rung_gate_key: str | None = None,
) -> TrialConfig:
    """Build the workload's :class:`TrialConfig` from the spec and one Tune config (see ``search/searcher.py``).

    Args:
        config: the sampled trial: ``batch_size_sequences``, ``seed``, ``lr``, ``lr_rule``,
            ``beta2``, ``beta2_half_life_tokens`` (the LR and beta2 already scaled for the batch); token
            reallocation (``search.precision``) may add ``budget_tokens`` (the trial's own budget, a multiple
            of the spec's, with milestones at the spec's spacing) and ``stop_at_loss`` (it ends at its first
            milestone at or below this loss).
        data_path: the data path the workers read.
        shards: the prepared shards the workers memory-map instead (``sweeps.run.dataprep``).
        workload: the trial's workload config with its inputs, as the sweep prepared it
            (``sweeps.run.prepare``, :func:`sweeps.launch.workload.with_inputs`); default built from the spec
            with ``data_path`` and ``shards``.
        rung_gate_key: with ``pruning.mode: pause``, the Ray KV key where the scheduler lets this
            trial go on past a rung (the worker waits there; ``sweeps.pruning.rungs.rung_gate_key``).
    """
    gated = rung_gate_key is not None and spec.pruning.enabled and spec.pruning.mode == "pause"
    budget = int(config.get("budget_tokens") or spec.budget_tokens)  # token reallocation: a re-run's own budget
    stop = config.get("stop_at_loss")
    return TrialConfig(
        trial_id=trial_id,
        workload=workload if workload is not None else workload_config(spec, data_path=data_path, shards=shards),
        budget_tokens=budget,
        optimizer=OptimizerConfig(  # the spec's settings (OptimizerSettings), the LR and beta2 sampled for the batch
            **OptimizerSettings.of(spec.optimizer).fields(),
            lr=float(config["lr"]),
            lr_rule=str(config["lr_rule"]),
            beta2=float(config["beta2"]),
            beta2_half_life_tokens=float(config["beta2_half_life_tokens"]),
        ),
        schedule=ScheduleConfig.of(spec.schedule),
        batch=BatchConfig(
            batch_size_sequences=int(config["batch_size_sequences"]),
            micro_batch_size_sequences_max=spec.resources.micro_batch_size_sequences_max,
            warmup=tuple((int(b), int(t)) for b, t in spec.batch_warmup.schedule) if spec.batch_warmup else None,
        ),
        eval=EvalConfig(
            milestones_tokens=tuple(spec.milestones_tokens(budget)),
            eval_tokens=spec.eval.eval_tokens,
            stop_at_loss=float(stop) if stop is not None else None,
        ),
        noise_scale=NoiseScaleConfig.of(spec.noise_scale),
        training=training_config(spec),
        seed=int(config["seed"]),
        rung_gate=RungGateConfig(
            barrier_tokens=tuple(
                f * spec.budget_tokens
                for f in rung_fractions(spec.pruning.grace_fraction, spec.pruning.reduction_factor)
            ),
            key=rung_gate_key,
        )
        if gated and rung_gate_key is not None
        else None,
    )


def training_config(spec: SweepSpec) -> TrainingConfig:
    """The spec's ``resources.parallelism``, ``compile``, ``activation_checkpointing``, ``mixed_precision``
    and ``sync``."""
    return TrainingConfig.of(spec.resources)  # the fields resources declares with TrainingConfig's definitions


def training_params(spec: SweepSpec) -> dict[str, Any]:
    """The trial params of :func:`training_config`, named by ``sweeps.tracking.schema.TRAINING_PARAMS``
    (and ``SYNC_OUTER_PARAMS`` under diloco).

    ``sync`` is the mode, ``replicas`` the workers per trial, ``sync_every_steps`` the optimizer
    steps between synchronisations (1 under ddp: every step).
    """
    t = training_config(spec)
    y = t.sync
    out = {
        schema.PARAM_PARALLELISM: t.parallelism,
        schema.PARAM_COMPILE: t.compile,
        schema.PARAM_ACTIVATION_CHECKPOINTING: t.activation_checkpointing,
        schema.PARAM_MIXED_PRECISION: t.mixed_precision,
        schema.PARAM_SYNC: y.mode,
        schema.PARAM_SYNC_EVERY_STEPS: y.every_steps if y.local else 1,
        schema.PARAM_REPLICAS: spec.resources.workers_per_trial,
    }
    if y.mode == "diloco":
        out.update({schema.PARAM_OUTER_LR: y.outer_lr, schema.PARAM_OUTER_MOMENTUM: y.outer_momentum})
    return out


@dataclass(frozen=True, kw_only=True)
class SweepTrials:
    """What every trial of one sweep shares, handed to :func:`run_trial` beside Tune's config of each trial.

    Attributes:
        spec_json: the sweep's spec (``SweepSpec.model_dump_json``).
        workload: the workload config every trial gets (see :func:`make_trainable`).
        storage_path: where each trial's checkpoints are kept (see :func:`make_trainable`).
        save_dir_root: rank 0 saves each completed trial's Hugging Face checkpoint in ``<save_dir_root>/<trial id>``.
        rung_gate_prefix: ``pruning.mode: pause``: the prefix of the rung-gate KV keys.
        exchange: the sweep's trial exchange (``resources.launcher: trial_runners``), else None.
        launcher: the ``resources.launcher`` whose :meth:`sweeps.launch.launcher.Launcher.run_trial` runs each trial
            (:meth:`launcher_name`).
    """

    spec_json: str
    workload: WorkloadConfig
    storage_path: str
    save_dir_root: str | None = None
    rung_gate_prefix: str | None = None
    exchange: str | None = None
    launcher: str | None = None

    def launcher_name(self) -> str:
        """:attr:`launcher`; where it is None (an object made, or pickled by Tune, before it was carried), the trial
        runners' with an exchange, else a Ray Train run per trial, as such an object meant."""
        if self.launcher is not None:
            return self.launcher
        return "trial_runners" if self.exchange else "train_run_per_trial"

    def trial(
        self, config: dict[str, Any], trial_id: str, started_unix: float
    ) -> tuple[SweepSpec, TrialConfig, TrialRunContext]:
        """The spec, the trial's :class:`TrialConfig` (built once, here) and its :class:`TrialRunContext`."""
        from sweeps.pruning.rungs import rung_gate_key

        spec = SweepSpec.model_validate_json(self.spec_json)
        gate = rung_gate_key(self.rung_gate_prefix, trial_id) if self.rung_gate_prefix else None
        cfg = trial_config(spec, config, trial_id, workload=self.workload, rung_gate_key=gate)
        context = TrialRunContext(
            started_unix=started_unix,
            torch_threads=torch_threads_per_worker(spec.resources.cpus_per_worker),  # sweeps/run/provenance.py
            save_dir=os.path.join(self.save_dir_root, trial_id) if self.save_dir_root else None,
            checkpoint_dir=f"{self.storage_path}/{train_run_name(trial_id)}" if self.exchange else None,
        )
        return spec, cfg, context


def make_trainable(
    spec: SweepSpec,
    *,
    workload: WorkloadConfig,
    storage_path: str,
    save_dir_root: str | None = None,
    rung_gate_prefix: str | None = None,
    exchange: str | None = None,
    launcher: str | None = None,
):
    """:func:`run_trial` as this sweep's Tune function trainable, with its per-trial resource request.

    Args:
        spec: the sweep.
        workload: the workload config every trial gets (the sweep's, built once: ``sweeps.run.prepare``),
            with the inputs its workers read (absolute data path, or the shards that
            ``sweeps.run.dataprep.prepared_shards`` made: :func:`sweeps.launch.workload.with_inputs`).
        storage_path: where each trial's checkpoints are kept (shared by all nodes): Ray Train's run
            folder ``<storage_path>/train-<trial id>``, which a trial runner uses too.
        save_dir_root: if set, rank 0 saves each completed trial's Hugging Face checkpoint in
            ``save_dir_root/<trial_id>``.
        rung_gate_prefix: ``pruning.mode: pause``: the sweep's prefix of the rung-gate KV keys (the
            scheduler's ``gate_prefix``); a trial's workers wait at each rung for its decision.
        exchange: the name of the sweep's trial exchange (``sweeps.launch.runners``) when its trials run in
            trial runners, else None.
        launcher: the sweep's ``resources.launcher`` (``sweeps.launch.launcher.launcher_for``): its
            ``run_trial`` runs each trial, a relay to the trial runners or a ``TorchTrainer`` of the trial's own.
    """
    trials = SweepTrials(
        spec_json=spec.model_dump_json(),
        workload=workload,
        storage_path=storage_path,
        save_dir_root=save_dir_root,
        rung_gate_prefix=rung_gate_prefix,
        exchange=exchange,
        launcher=launcher,
    )
    return ray.tune.with_resources(
        ray.tune.with_parameters(run_trial, trials=trials), {"CPU": spec.resources.trial_driver_cpus}
    )


def run_trial(config: dict[str, Any], trials: SweepTrials) -> None:
    """Tune's function trainable: one trial, from the JSON-able config Tune hands it (``search/searcher.py``).

    The sweep's launcher runs it (:meth:`SweepTrials.launcher_name`, resolved in
    :data:`sweeps.spec.registry.LAUNCHER_REGISTRY`): under trial runners the trial goes to the sweep's exchange; otherwise it runs in a worker group of its own.
    Tune names trial folders after it: ``run_trial_<id>_...`` (records.py).
    """
    trial_id = ray.tune.get_context().get_trial_id()
    spec, cfg, context = trials.trial(config, trial_id, _trial_started_unix())
    LAUNCHER_REGISTRY.resolve(trials.launcher_name())(spec).run_trial(cfg, context, trials)


def batch_plan_params(spec: SweepSpec, batch_size_sequences: int) -> dict[str, int]:
    """Micro-batch size, accumulation steps and workers for a batch size (logged as trial params)."""
    r = spec.resources
    plan = plan_batch(
        batch_size_sequences,
        r.workers_per_trial,
        r.micro_batch_size_sequences_max,
        min_micro_batches_total(spec.noise_scale.enabled, r.parallelism, r.workers_per_trial),
    )
    return {
        "micro_batch_size_sequences": plan.micro_batch_size_sequences,
        "grad_accum_steps": plan.grad_accum_steps,
        "workers": plan.workers,
    }
