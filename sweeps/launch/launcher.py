"""How a sweep's trials start (``resources.launcher``): :class:`Launcher` is the base, the two the product has are
:class:`TrialRunnersLauncher` (long-lived worker groups, :mod:`sweeps.launch.runners`) and
:class:`TrainRunPerTrialLauncher` (a Ray Train run per trial).

A launcher is asked three times: when the driver starts (:meth:`Launcher.prepare`), when the sweep builds its Tune
trainable (:meth:`Launcher.trial_runners`: the runners the trainable relays to, if any) and in each trial's Tune
process (:meth:`Launcher.run_trial`). The names live in :data:`sweeps.spec.registry.LAUNCHER_REGISTRY`
(:data:`LAUNCHERS`): adding a launcher is a module with a :class:`Launcher` subclass and one registration line.
Importing this module imports no torch (Tune's relay trainable imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, ClassVar, cast

from sweeps.launch.runners import active_pool, shared_runners
from sweeps.launch.trainable import SweepTrials, train_run_name, trial_torch_trainer
from sweeps.settings import Settings
from sweeps.spec import LAUNCHER_REGISTRY, Registry, SweepSpec
from workloads.api import TrialConfig, TrialRunContext

if TYPE_CHECKING:
    from sweeps.launch.runners import RunnerPool, TrialRunners

__all__ = [
    "LAUNCHERS",
    "Launcher",
    "TrainRunPerTrialLauncher",
    "TrialRunnersLauncher",
    "launcher_for",
    "reuse_trial_actors",
    "sweep_runners",
]


class Launcher:
    """How a sweep's trials start: the base of ``resources.launcher``'s choices.

    Args:
        spec: the sweep.

    A subclass sets :attr:`name` (its ``resources.launcher`` value) and overrides :meth:`run_trial`; by default a
    launcher starts nothing ahead of the trials and has no trial runners.
    """

    #: the ``resources.launcher`` value that selects it
    name: ClassVar[str]

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec

    def prepare(self, pool: RunnerPool, *, count: int, storage_path: str) -> None:
        """Called as the driver starts, before it sets up MLflow: start what is slow to start. ``pool``: the
        driver's (or the comparison's) runner pool; ``count``: trials at once; ``storage_path``: where Ray Train
        keeps the trials' runs."""

    def trial_runners(self, *, sweep_id: str, count: int, storage_path: str) -> tuple[TrialRunners | None, bool]:
        """The trial runners the sweep's Tune trainable hands its trials to (None: each trial runs in its own Tune
        process, :meth:`run_trial`), and whether a comparison's other arms share them."""
        return None, False

    def reuse_actors(self) -> bool:
        """Whether Tune may run a trial in the process of a finished one (:func:`reuse_trial_actors`): only when
        no trial ends early (pruning off). Tune caches the actor of a trial it stopped or paused as well, and that
        actor's thread is still inside its ``TorchTrainer.fit()``: the pruned trial would train on until Tune's
        ``reset_config`` gives up on it (2 s after the next trial asks) and kills it (sweeps/launch/reaper.py)."""
        return not self.spec.pruning.enabled

    def run_trial(self, cfg: TrialConfig, context: TrialRunContext, trials: SweepTrials) -> None:
        """Run one trial, in its Tune process (:func:`sweeps.launch.trainable.run_trial`), reporting to Tune."""
        raise NotImplementedError


class TrialRunnersLauncher(Launcher):
    """``trial_runners``: long-lived worker groups take one trial after another (:mod:`sweeps.launch.runners`);
    Tune's trainable is a relay that hands its trial to them and forwards their reports."""

    name = "trial_runners"

    def prepare(self, pool: RunnerPool, *, count: int, storage_path: str) -> None:
        """Start the runners' hosts importing (:meth:`~sweeps.launch.runners.TrialRunners.prepare`)."""
        pool.runners_for(self.spec, count=count, storage_path=storage_path).prepare()

    def trial_runners(self, *, sweep_id: str, count: int, storage_path: str) -> tuple[TrialRunners | None, bool]:
        """The runners of the enclosing comparison's pool (shared while their shape stays the same), else the
        sweep's own."""
        from sweeps.launch.runners import TrialRunners

        pool = active_pool()
        if pool is not None:
            return pool.runners_for(self.spec, count=count, storage_path=storage_path), True
        return TrialRunners(self.spec, sweep_id=sweep_id, count=count, storage_path=storage_path), False

    def reuse_actors(self) -> bool:
        """Always: the relay's thread ends as soon as its trial is cancelled at the exchange."""
        return True

    def run_trial(self, cfg: TrialConfig, context: TrialRunContext, trials: SweepTrials) -> None:
        """Hand the trial to the sweep's exchange (:func:`sweeps.launch.exchange.relay`)."""
        from sweeps.launch.exchange import relay

        assert trials.exchange is not None, "trial_runners: the trainable was built without the runners' exchange"
        relay(trials.exchange, cfg, context)


class TrainRunPerTrialLauncher(Launcher):
    """``train_run_per_trial``: each trial sizes a Ray Train worker group of its own, rank 0's milestone metrics
    forwarded to Tune (the one-trial worker groups, kept for comparison and as a way out)."""

    name = "train_run_per_trial"

    def run_trial(self, cfg: TrialConfig, context: TrialRunContext, trials: SweepTrials) -> None:
        """Run the trial in a ``TorchTrainer`` of its own (:func:`sweeps.launch.trainable.trial_torch_trainer`)."""
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig
        from ray.tune.integration.ray_train import TuneReportCallback

        from workloads.api import drain_report_queue, loop_config, train_fn_per_worker

        res = self.spec.resources
        use_gpu = res.gpus_per_worker > 0
        resources = {"CPU": res.cpus_per_worker}
        if use_gpu:
            resources["GPU"] = res.gpus_per_worker
        trainer = trial_torch_trainer()(
            train_fn_per_worker,
            train_loop_config=loop_config(cfg, context),
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            scaling_config=ScalingConfig(
                num_workers=res.workers_per_trial, use_gpu=use_gpu, resources_per_worker=resources
            ),
            run_config=RunConfig(
                name=train_run_name(cfg.trial_id),
                storage_path=trials.storage_path,
                callbacks=[TuneReportCallback()],
                failure_config=FailureConfig(max_failures=res.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=1),
            ),
        )
        trainer.fit()
        drain_report_queue()


#: every launcher, by its ``resources.launcher`` name (:data:`sweeps.spec.registry.LAUNCHER_REGISTRY`)
LAUNCHERS = cast("Registry[type[Launcher]]", LAUNCHER_REGISTRY)


def launcher_for(spec: SweepSpec, settings: Settings | None = None) -> Launcher:
    """The sweep's launcher: ``resources.launcher``'s; unset, ``trial_runners`` unless ``CRITBATCH_TRIAL_RUNNERS=0``
    is set in the driver's environment (``settings.trial_runners``; default settings: from the environment), then
    ``train_run_per_trial``.

    Raises:
        InvalidInput: the name is not one of :data:`LAUNCHERS` (the message lists them).
    """
    name = spec.resources.launcher
    if name is None:
        name = "trial_runners" if (settings or Settings.from_env()).trial_runners else "train_run_per_trial"
    return LAUNCHERS.resolve(name)(spec)


def reuse_trial_actors(spec: SweepSpec, settings: Settings | None = None) -> bool:
    """Whether Tune may run a trial in the process of a finished one (``TuneConfig(reuse_actors=...)``): the
    sweep's launcher's :meth:`Launcher.reuse_actors`.

    A reused process skips the Tune trainable's start (a Python process with Ray imported, and torch too for a
    one-trial worker group: about 7 CPU-seconds a trial, docs/benchmarks.md, "Per-trial start-up"). A sweep
    stopped as a whole (signal, FLOP or wall-clock budget) ends every actor with the experiment either way.
    """
    return launcher_for(spec, settings).reuse_actors()


@contextmanager
def sweep_runners(
    spec: SweepSpec, sweep_id: str, *, concurrency: int, storage_path: str, settings: Settings | None = None
) -> Iterator[None]:
    """One sweep's run (``sweeps.run.driver``): what its launcher starts ahead of the trials, started at once
    (:meth:`Launcher.prepare`; the trial runners' hosts import while the driver sets up MLflow), used by
    ``execute_sweep``, stopped when the block ends. Inside a comparison's
    :func:`~sweeps.launch.runners.shared_runners` block the runners come from, and stay in, its pool."""
    count = min(concurrency, spec.max_trials)
    outer = active_pool()
    with nullcontext(outer) if outer is not None else shared_runners(sweep_id) as pool:
        launcher_for(spec, settings).prepare(pool, count=count, storage_path=storage_path)
        yield
